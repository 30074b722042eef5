"""Element-wise kernels: add (residual joins), accumulate (gradient sums at forks), copy, fill,
scale, and the per-channel bias used by convolution and linear layers.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.elementwise

Order in this file: NumPy references, kernels, launchers, examples for the self-check.
Every launcher works on any shape by viewing its arrays as 1-D (no copy, no allocation).
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_version, cuda_kernel, flat, launch_1d

BLOCK = 256  # threads per block for 1-D element-wise launches
REDUCE_BLOCK = 128  # threads per block of bias_backward v2 (a power of two)


# ---------------------------------------------------------------- NumPy references
def add_ref(a, b, out):
    """out = a + b (out may alias a or b)."""
    np.add(a, b, out=out)


def accumulate_ref(dst, src):
    """dst += src: the gradient of a tensor read by several layers is the sum of theirs."""
    np.add(dst, src, out=dst)


def copy_ref(src, dst):
    dst[...] = src


def fill_ref(dst, *, value):
    dst[...] = value


def scale_ref(x, out, *, alpha):
    """out = alpha * x (out may alias x)."""
    np.multiply(x, x.dtype.type(alpha), out=out)


def bias_add_ref(y, b):
    """y[n, c, ...] += b[c], in place; y is (N, C) for linear layers or (N, C, H, W) for conv."""
    y += b.reshape((1, -1) + (1,) * (y.ndim - 2))


def bias_backward_ref(dy, db):
    """db[c] = sum of dy[n, c, ...] over the batch and every spatial position."""
    n, c = dy.shape[:2]
    db[...] = dy.reshape(n, c, -1).sum(axis=(0, 2), dtype=dy.dtype)


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _add_v1(a, b, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]


@cuda_kernel("void(float32[::1], float32[::1])")
def _accumulate_v1(dst, src):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] += src[i]


@cuda_kernel("void(float32[::1], float32[::1])")
def _copy_v1(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


@cuda_kernel("void(float32[::1], float32)")
def _fill_v1(dst, value):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = value


@cuda_kernel("void(float32[::1], float32[::1], float32)")
def _scale_v1(x, out, alpha):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = alpha * x[i]


@cuda_kernel("void(float32[:, :, ::1], float32[::1])")
def _bias_add_v1(y, b):
    # y viewed as (N, C, S); one thread per element.
    i = cuda.grid(1)
    n_, c_, s_ = y.shape
    if i < n_ * c_ * s_:
        c = (i // s_) % c_
        y[i // (c_ * s_), c, i % s_] += b[c]


@cuda_kernel("void(float32[:, :, ::1], float32[::1])")
def _bias_backward_v1(dy, db):
    # Naive: one thread per channel sums the batch in order.
    c = cuda.grid(1)
    if c < db.size:
        acc = float32(0.0)
        for n in range(dy.shape[0]):
            for s in range(dy.shape[2]):
                acc += dy[n, c, s]
        db[c] = acc


@cuda_kernel("void(float32[:, :, ::1], float32[::1])")
def _bias_backward_v2(dy, db):
    # One block per channel: each thread sums a strided slice, then a fixed-shape tree
    # reduction in shared memory (deterministic, no atomics).
    partial = cuda.shared.array(REDUCE_BLOCK, float32)
    c = cuda.blockIdx.x
    t = cuda.threadIdx.x
    n_, _, s_ = dy.shape
    acc = float32(0.0)
    for j in range(t, n_ * s_, REDUCE_BLOCK):
        acc += dy[j // s_, c, j % s_]
    partial[t] = acc
    cuda.syncthreads()
    width = REDUCE_BLOCK // 2
    while width > 0:
        if t < width:
            partial[t] += partial[t + width]
        cuda.syncthreads()
        width //= 2
    if t == 0:
        db[c] = partial[0]


# ---------------------------------------------------------------- launchers
def _same(name_a, a, name_b, b):
    check(name_b, b, shape=a.shape, dtype=a.dtype)


def add(a, b, out, *, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("add a", a)
    _same("a", a, "add b", b)
    _same("a", a, "add out", out)
    launch_1d(_add_v1, out.size, BLOCK, stream, flat(a), flat(b), flat(out))


def accumulate(dst, src, *, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("accumulate dst", dst)
    _same("dst", dst, "accumulate src", src)
    launch_1d(_accumulate_v1, dst.size, BLOCK, stream, flat(dst), flat(src))


def copy(src, dst, *, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("copy src", src)
    _same("src", src, "copy dst", dst)
    launch_1d(_copy_v1, dst.size, BLOCK, stream, flat(src), flat(dst))


def fill(dst, *, value, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("fill dst", dst)
    launch_1d(_fill_v1, dst.size, BLOCK, stream, flat(dst), np.float32(value))


def scale(x, out, *, alpha, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("scale x", x)
    _same("x", x, "scale out", out)
    launch_1d(_scale_v1, out.size, BLOCK, stream, flat(x), flat(out), np.float32(alpha))


def _nc_s(name, y, b):
    check(name, y)
    if y.ndim < 2:
        raise ValueError(f"{name}: expected (N, C, ...) with at least 2 dimensions, got shape "
                         f"{tuple(y.shape)}")
    check(f"{name} bias", b, shape=(y.shape[1],))
    n, c = y.shape[:2]
    return y.reshape(n, c, y.size // (n * c) if n * c else 0)


def bias_add(y, b, *, stream=0, version="v1"):
    check_version(version, ("v1",))
    y3 = _nc_s("bias_add y", y, b)
    launch_1d(_bias_add_v1, y.size, BLOCK, stream, y3, b)


def bias_backward(dy, db, *, stream=0, version="v2"):
    check_version(version, ("v1", "v2"))
    dy3 = _nc_s("bias_backward dy", dy, db)
    if db.size == 0:
        return
    if version == "v1":
        launch_1d(_bias_backward_v1, db.size, BLOCK, stream, dy3, db)
    else:
        _bias_backward_v2[db.size, REDUCE_BLOCK, stream](dy3, db)


OPS = {
    "add": Op("add", add_ref, add),
    "accumulate": Op("accumulate", accumulate_ref, accumulate),
    "copy": Op("copy", copy_ref, copy),
    "fill": Op("fill", fill_ref, fill),
    "scale": Op("scale", scale_ref, scale),
    "bias_add": Op("bias_add", bias_add_ref, bias_add),
    "bias_backward": Op("bias_backward", bias_backward_ref, bias_backward, ("v1", "v2")),
}


def examples(rng):
    r, nan = example_arrays(rng)  # outputs start as NaN: an element a kernel leaves unwritten shows
    a, b = r(3, 5, 7), r(3, 5, 7)
    inplace = a.copy()
    return [
        Example("add", (a, b, nan(3, 5, 7)), (2,), label="3x5x7"),
        Example("add", (inplace, b, inplace), (2,), label="out aliases a"),
        Example("accumulate", (r(301), r(301)), (0,), label="301"),
        Example("copy", (r(2, 3, 5, 5), nan(2, 3, 5, 5)), (1,), label="2x3x5x5"),
        Example("fill", (r(257),), (0,), kwargs={"value": 1.5}, label="257"),
        Example("scale", (r(4, 33), nan(4, 33)), (1,),
                kwargs={"alpha": -0.5}, label="4x33"),
        Example("bias_add", (r(2, 3, 4, 5), r(3)), (0,), label="conv 2x3x4x5"),
        Example("bias_add", (r(7, 11), r(11)), (0,), label="linear 7x11"),
        Example("bias_backward", (r(3, 5, 3, 7), nan(5)), (1,), label="conv 3x5x3x7"),
        Example("bias_backward", (r(9, 13), nan(13)), (1,), label="linear 9x13"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
