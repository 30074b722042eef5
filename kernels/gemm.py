"""GEMM: C = alpha * op(A) @ op(B) + beta * C, with op = transpose when the flag is set.

Used by linear layers and by im2col convolution. Run the self-check on the simulator:
    NUMBA_ENABLE_CUDASIM=1 python -m kernels.gemm

Every version sums the reduction index k in the same order, from 0 to K-1, starting from 0.0,
then applies the same epilogue, so all versions give bit-identical results (convolution relies
on this: the algorithm chosen for the workspace must never change the numbers). With beta == 0,
C is written without being read (arena memory starts as garbage, maybe NaN).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from kernels._check import Example, main
from kernels._common import Op, ceil_div, check, check_version, cuda_kernel

VERSIONS = ("v1",)


# ---------------------------------------------------------------- NumPy reference
def gemm_ref(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0):
    a_ = a.T if trans_a else a
    b_ = b.T if trans_b else b
    prod = a_ @ b_
    if beta == 0:
        c[...] = c.dtype.type(alpha) * prod
    else:
        c[...] = c.dtype.type(alpha) * prod + c.dtype.type(beta) * c


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _epilogue(acc, c_old, alpha, beta, use_beta):
    """The one place C is written from an accumulator; every version calls it."""
    if use_beta:
        return alpha * acc + beta * c_old
    return alpha * acc


# ---------------------------------------------------------------- kernels
_SIG = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1], boolean, boolean, float32, float32, boolean)"


@cuda_kernel(_SIG)
def _gemm_v1(a, b, c, trans_a, trans_b, alpha, beta, use_beta):
    # Naive: one thread per element of C, reading A and B straight from global memory.
    col, row = cuda.grid(2)
    m_, n_ = c.shape
    k_ = a.shape[0] if trans_a else a.shape[1]
    if row < m_ and col < n_:
        acc = float32(0.0)
        for k in range(k_):
            av = a[k, row] if trans_a else a[row, k]
            bv = b[col, k] if trans_b else b[k, col]
            acc += av * bv
        c[row, col] = _epilogue(acc, c[row, col] if use_beta else float32(0.0), alpha, beta, use_beta)


# ---------------------------------------------------------------- launcher
def gemm_shapes(a_shape, b_shape, trans_a=False, trans_b=False):
    """(M, N, K) of op(A) @ op(B); raises ValueError if the inner dimensions differ."""
    m, ka = (a_shape[1], a_shape[0]) if trans_a else tuple(a_shape)
    kb, n = (b_shape[1], b_shape[0]) if trans_b else tuple(b_shape)
    if ka != kb:
        raise ValueError(f"gemm: op(A) is {m}x{ka} but op(B) is {kb}x{n}; inner dimensions must match")
    return m, n, ka


def gemm(a, b, c, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, stream=0, version="v1",
         block=(16, 16)):
    """C = alpha * op(A) @ op(B) + beta * C on the device; ``block`` is (threads in x, threads in y)."""
    check_version(version, VERSIONS)
    check("gemm a", a)
    check("gemm b", b)
    for name, arr in (("a", a), ("b", b)):
        if arr.ndim != 2:
            raise ValueError(f"gemm {name}: expected a 2-D array, got shape {tuple(arr.shape)}")
    m, n, _ = gemm_shapes(a.shape, b.shape, trans_a, trans_b)
    check("gemm c", c, shape=(m, n))
    if m == 0 or n == 0:
        return
    args = (a, b, c, bool(trans_a), bool(trans_b), np.float32(alpha), np.float32(beta), beta != 0)
    bx, by = block
    _gemm_v1[(ceil_div(n, bx), ceil_div(m, by)), (bx, by), stream](*args)


OPS = {"gemm": Op("gemm", gemm_ref, gemm, VERSIONS)}


def examples(rng):
    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    out = []
    for ta in (False, True):
        for tb in (False, True):
            m, n, k = 13, 11, 19
            a = r(k, m) if ta else r(m, k)
            b = r(n, k) if tb else r(k, n)
            out.append(Example("gemm", (a, b, np.full((m, n), np.nan, np.float32)), (2,),
                               kwargs={"trans_a": ta, "trans_b": tb}, launch={"block": (8, 8)},
                               rtol=1e-4, atol=1e-5, label=f"13x11x19 ta={ta:d} tb={tb:d}"))
    out.append(Example("gemm", (r(7, 5), r(5, 9), r(7, 9)), (2,),
                       kwargs={"alpha": 0.5, "beta": -2.0}, launch={"block": (4, 8)}, rtol=1e-4, atol=1e-5,
                       label="alpha/beta"))
    return out


if __name__ == "__main__":
    main(__import__(__name__))
