"""Cross-channel local response normalization (LRN), exactly as PyTorch's
``torch.nn.LocalResponseNorm(size, alpha=1e-4, beta=0.75, k=1.0)``, forward and backward.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.lrn

For x of shape (N, C, ...) (viewed as (N, C, S), no copy), with n = size:
    s_c = k + alpha / n * sum_{c' in W(c)} x_{c'}^2,   W(c) = [c - n//2, c + (n-1)//2] clipped to [0, C)
    y_c = x_c / s_c^beta
PyTorch pads n//2 zero channels before and (n-1)//2 after, then averages over n (the padding
counts in the divisor), which is this formula; for an even n the window leans backwards.

Backward (reads x, y and dy; dx MAY ALIAS dy, in place, like ReLU):
    dx_j = dy_j / s_j^beta - (2 alpha beta / n) * x_j * sum_{c in V(j)} dy_c y_c / s_c,
    V(j) = {c : j in W(c)} = [j - (n-1)//2, j + n//2] clipped to [0, C).
In place is tricky because dx_j needs dy over the channel window V(j), and earlier channels'
dy are already overwritten. So one thread per (n, pixel) walks the channels in ascending order
and keeps, in two ring buffers of MAX_SIZE entries in ``cuda.local.array``, the terms
dy_c / s_c^beta and dy_c y_c / s_c computed while dy_c was still intact (MAX_SIZE >= size
guarantees a term is never overwritten while a channel still needs it).

Canonical orders: s_c sums x_{c'}^2 over W(c) in ascending c' from 0.0; the backward sums V(j)
in ascending c from 0.0. One version (v1): C is small and each thread's work is O(C * size).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, ceil_div, check, check_version, cuda_kernel

BLOCK = 128  # threads per block
MAX_SIZE = 16  # largest supported window (ring-buffer length of the in-place backward)
VERSIONS = ("v1",)


# ---------------------------------------------------------------- validation (host)
def _check_size(op, size):
    if not isinstance(size, (int, np.integer)) or not 1 <= size <= MAX_SIZE:
        raise ValueError(f"{op}: size must be an int in [1, {MAX_SIZE}] (MAX_SIZE, the ring buffer of the "
                         f"in-place backward), got {size!r}")


# ---------------------------------------------------------------- NumPy references
def _as_ncs(a):
    return a.reshape(a.shape[0], a.shape[1], -1)


def _scale_ref(x, size, alpha, k):
    """s (N, C, S): k + alpha/size * window sum of x^2, summed in ascending channel order."""
    dt = x.dtype.type
    x3 = _as_ncs(x)
    s = np.empty_like(x3)
    for c in range(x3.shape[1]):
        acc = np.zeros_like(x3[:, 0])
        for cc in range(max(c - size // 2, 0), min(c + (size - 1) // 2 + 1, x3.shape[1])):
            acc += x3[:, cc] * x3[:, cc]
        s[:, c] = dt(k) + dt(alpha / size) * acc
    return s


def lrn_forward_ref(x, y, *, size, alpha=1e-4, beta=0.75, k=1.0):
    _check_size("lrn_forward", size)
    s = _scale_ref(x, size, alpha, k)
    y[...] = (_as_ncs(x) / s ** x.dtype.type(beta)).reshape(y.shape)


def lrn_backward_ref(x, y, dy, dx, *, size, alpha=1e-4, beta=0.75, k=1.0):
    """dx may alias dy: everything is computed into temporaries before dx is written."""
    _check_size("lrn_backward", size)
    dt = x.dtype.type
    s = _scale_ref(x, size, alpha, k)
    x3, y3, dy3 = _as_ncs(x), _as_ncs(y), _as_ncs(dy)
    t = dy3 * y3 / s
    acc = np.zeros_like(t)
    for j in range(t.shape[1]):
        for c in range(max(j - (size - 1) // 2, 0), min(j + size // 2 + 1, t.shape[1])):
            acc[:, j] += t[:, c]
    grad = dy3 / s ** dt(beta) - dt(2.0 * alpha * beta / size) * x3 * acc
    dx[...] = grad.reshape(dx.shape)


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _scale(x, n, c, p, size, alpha_n, k):
    """s_c at (n, c, p): k + alpha/size * sum of x^2 over W(c), ascending channels."""
    acc = float32(0.0)
    for cc in range(max(c - size // 2, 0), min(c + (size - 1) // 2 + 1, x.shape[1])):
        v = x[n, cc, p]
        acc += v * v
    return k + alpha_n * acc


# ---------------------------------------------------------------- kernels
_T3 = "float32[:, :, ::1]"


@cuda_kernel(f"void({_T3}, {_T3}, int64, float32, float32, float32)")
def _lrn_forward_v1(x, y, size, alpha_n, beta, k):
    # One thread per element.
    i = cuda.grid(1)
    c_, s_ = x.shape[1], x.shape[2]
    if i < y.size:
        n, c, p = i // (c_ * s_), (i // s_) % c_, i % s_
        y[n, c, p] = x[n, c, p] / _scale(x, n, c, p, size, alpha_n, k) ** beta


@cuda_kernel(f"void({_T3}, {_T3}, {_T3}, {_T3}, int64, float32, float32, float32, float32)")
def _lrn_backward_v1(x, y, dy, dx, size, alpha_n, beta, k, coef):
    # One thread per (n, pixel) walks the channels upwards; dx may alias dy. At step j the
    # terms of channel j + size//2 enter the rings (its dy is still intact: only channels < j
    # were written), then dx_j is written from ring entries j - (size-1)//2 ... j + size//2.
    g = cuda.local.array(MAX_SIZE, float32)  # dy_c / s_c^beta
    t = cuda.local.array(MAX_SIZE, float32)  # dy_c * y_c / s_c
    i = cuda.grid(1)
    c_, s_ = x.shape[1], x.shape[2]
    if i >= x.shape[0] * s_:
        return
    n, p = i // s_, i % s_
    lag, lead = (size - 1) // 2, size // 2
    for j in range(-lead, c_):
        c = j + lead
        if c < c_:
            s = _scale(x, n, c, p, size, alpha_n, k)
            d = dy[n, c, p]
            g[c % MAX_SIZE] = d / s ** beta
            t[c % MAX_SIZE] = d * y[n, c, p] / s
        if j >= 0:
            acc = float32(0.0)
            for cc in range(max(j - lag, 0), min(j + lead + 1, c_)):
                acc += t[cc % MAX_SIZE]
            dx[n, j, p] = g[j % MAX_SIZE] - coef * x[n, j, p] * acc


# ---------------------------------------------------------------- launchers
def _check_x(op, x):
    check(f"{op} x", x)
    if x.ndim < 3:
        raise ValueError(f"{op} x: expected (N, C, ...) with at least 3 dimensions, got shape "
                         f"{tuple(x.shape)}")


def lrn_forward(x, y, *, size, alpha=1e-4, beta=0.75, k=1.0, stream=0, version="v1", block=BLOCK):
    check_version(version, VERSIONS)
    _check_size("lrn_forward", size)
    _check_x("lrn_forward", x)
    check("lrn_forward y", y, shape=x.shape)
    if y.size:
        _lrn_forward_v1[ceil_div(y.size, block), block, stream](
            _as_ncs(x), _as_ncs(y), int(size), np.float32(alpha / size), np.float32(beta), np.float32(k))


def lrn_backward(x, y, dy, dx, *, size, alpha=1e-4, beta=0.75, k=1.0, stream=0, version="v1", block=BLOCK):
    """Gradient of LRN; ``dx`` may be the same array as ``dy`` (in place), but not x or y."""
    check_version(version, VERSIONS)
    _check_size("lrn_backward", size)
    _check_x("lrn_backward", x)
    for name, a in (("y", y), ("dy", dy), ("dx", dx)):
        check(f"lrn_backward {name}", a, shape=x.shape)
    pixels = x.shape[0] * math.prod(x.shape[2:])  # one thread per (n, pixel)
    if pixels and x.shape[1]:
        _lrn_backward_v1[ceil_div(pixels, block), block, stream](
            _as_ncs(x), _as_ncs(y), _as_ncs(dy), _as_ncs(dx), int(size), np.float32(alpha / size),
            np.float32(beta), np.float32(k), np.float32(2.0 * alpha * beta / size))


OPS = {
    "lrn_forward": Op("lrn_forward", lrn_forward_ref, lrn_forward, VERSIONS),
    "lrn_backward": Op("lrn_backward", lrn_backward_ref, lrn_backward, VERSIONS),
}


def examples(rng):
    r, nan = example_arrays(rng)
    cases = [  # (shape, hyper-parameters, label); a large alpha makes the cross-channel term matter
        ((2, 7, 3, 5), {"size": 5}, "size 5 PyTorch defaults"),
        ((2, 7, 3, 5), {"size": 5, "alpha": 0.5, "beta": 0.75, "k": 2.0}, "size 5 alpha 0.5"),
        ((1, 9, 4, 3), {"size": 4, "alpha": 0.3, "beta": 0.6, "k": 1.0}, "even size 4"),
        ((2, 5, 2, 3), {"size": 1, "alpha": 0.4}, "size 1"),
        ((1, 5, 3, 3), {"size": 9, "alpha": 0.2, "beta": 1.1, "k": 0.5}, "size 9 > C"),
        ((1, 19, 2, 2), {"size": MAX_SIZE, "alpha": 0.3}, "size MAX_SIZE"),
        ((3, 6, 7), {"size": 3, "alpha": 0.5}, "3-D (N, C, L)"),
    ]
    out = []
    for shape, hp, label in cases:
        x = r(*shape)
        y = np.empty_like(x)
        lrn_forward_ref(x, y, **hp)
        dy = r(*shape)
        dy_in_place = dy.copy()
        out += [
            Example("lrn_forward", (x, nan(*shape)), (1,), kwargs=hp, launch={"block": 64}, label=label),
            Example("lrn_backward", (x, y, dy, nan(*shape)), (3,), kwargs=hp,
                    launch={"block": 32}, label=label),
            Example("lrn_backward", (x, y, dy_in_place, dy_in_place), (3,), kwargs=hp, launch={"block": 32},
                    label=f"dx aliases dy, {label}"),
        ]
    return out


if __name__ == "__main__":
    main(__import__(__name__))
