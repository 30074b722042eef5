"""The host device's ReLU: ``np.maximum`` forward; the gradient as dy's bits ANDed with a mask, in
one compiled pass (see :mod:`kernels.host`). ReLU6: one compiled pass forward (the reference's
comparisons, so NaN and -0.0 pass as they do there); its gradient dy's bits under a mask."""
from __future__ import annotations

import numpy as np

from kernels.activation import RELU6_MAX
from kernels.host import _compiled_takes, compiled, fast


@fast("relu_forward")
def relu_forward(x, y):
    np.maximum(x, x.dtype.type(0), out=y)  # NaN propagates; x <= 0 (-0.0 too) gives +0.0, as the reference


@fast("relu_backward")
def relu_backward(x, y, dy, dx):
    """dx = dy where x is not <= 0 (x > 0 or NaN); dx may alias dy or x."""
    if not (x.flags.c_contiguous and dy.flags.c_contiguous and dx.flags.c_contiguous
            and dy.dtype == np.float32):
        _keep(dy, ~(x <= 0), out=dx)
    elif _same_memory(dx, dy):  # in place, as the executor runs it: one array to write
        _relu_grad_in_place(x.reshape(-1), dx.reshape(-1).view(np.uint32))
    elif np.shares_memory(dx, x) or np.shares_memory(dx, dy):
        _keep(dy, ~(x <= 0), out=dx)
    else:
        _relu_grad(x.reshape(-1), dy.reshape(-1).view(np.uint32), dx.reshape(-1).view(np.uint32))


@fast("relu6_forward")
def relu6_forward(x, y):
    if _compiled_takes(x, y):
        _relu6(x.reshape(-1), y.reshape(-1))
    else:
        y[...] = np.where(x < 0, x.dtype.type(0), np.where(x > RELU6_MAX, x.dtype.type(RELU6_MAX), x))


@fast("relu6_backward")
def relu6_backward(x, y, dy, dx):
    """dx = dy where neither x <= 0 nor x >= 6; dx may alias dy (the mask is taken first)."""
    _keep(dy, ~((x <= 0) | (x >= RELU6_MAX)), out=dx)


@compiled
def _relu6(x, y):
    for i in range(x.size):
        v = x[i]
        y[i] = np.float32(0.0) if v < 0 else np.float32(RELU6_MAX) if v > RELU6_MAX else v


# ReLU's gradient in one pass where ``_keep`` makes three: dy's bits ANDed with all ones where x is
# not <= 0, else with zero; arithmetic, not a branch (x's sign is as good as random). A loop that
# writes an array it also reads through another name runs several times slower (the compiler's
# vector code checks for overlap and falls back), hence the in-place twin.
@compiled
def _relu_grad(x, dy_bits, dx_bits):
    one = np.uint32(1)
    for i in range(x.size):
        dx_bits[i] = dy_bits[i] & (np.uint32(x[i] <= 0) - one)


@compiled
def _relu_grad_in_place(x, d_bits):
    one = np.uint32(1)
    for i in range(x.size):
        d_bits[i] &= np.uint32(x[i] <= 0) - one


def _same_memory(a, b):
    """Whether two arrays are views of exactly the same bytes."""
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.nbytes == b.nbytes


def _keep(a, keep, out=None):
    """``a`` where ``keep``, else +0.0, bit for bit as ``np.where(keep, a, 0)`` (a masked copy is
    ten times slower than this: the float bits ANDed with an all-ones or all-zeros mask, of the
    unsigned type as wide as a's floats)."""
    bits = np.dtype(f"u{a.dtype.itemsize}")
    mask = np.multiply(keep, np.iinfo(bits).max, dtype=bits)
    out = np.empty(a.shape, a.dtype) if out is None else out
    np.bitwise_and(a.view(bits), mask, out=out.view(bits))
    return out
