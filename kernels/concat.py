"""Channel concatenation and its gradient, the split: Inception and DenseNet joins on NCHW; and the
channel shuffle of ShuffleNet, which interleaves channel groups.

A join of k inputs is k calls of ``concat_forward(x_i, y, offset=o_i)``, each copying
x_i (N, C_i, H, W) into the channel slice y[:, o_i:o_i + C_i]. Its backward is k calls of
``concat_backward(dy, dx_i, offset=o_i)``, copying the slice back out; with ``accumulate=True``
the slice is added to dx_i instead (dx_i += slice), for a tensor read by several layers, whose
gradient is the sum of theirs. (N, C) arrays work too (any trailing dimensions, as long as x and
y share them). Run the self-check on the simulator:
    NUMBA_ENABLE_CUDASIM=1 python -m kernels.concat

``channel_shuffle(x, y, *, groups)``: the C channels of x, seen as ``groups`` groups of C / groups,
are dealt out one from each group in turn: y[:, i * groups + g] = x[:, g * (C / groups) + i] (PyTorch's
``channel_shuffle``: a view as (N, groups, C / groups, H, W), transposed, seen as (N, C, H, W)). The
shuffle by C / groups puts them back: it is the shuffle's gradient.

Pure copies, one thread per element of the small tensor: no reduction, bit-exact.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from kernels._check import Example, example_arrays, main
from kernels._common import Op, ceil_div, check, check_apart, check_version, cuda_kernel

BLOCK = 256  # threads per block


# ---------------------------------------------------------------- NumPy references
def concat_forward_ref(x, y, *, offset):
    """y[:, offset:offset + Cx] = x; the other channels of y are left as they are."""
    _check_slice("concat_forward", "x", x, "y", y, offset)
    y[:, offset:offset + x.shape[1]] = x


def concat_backward_ref(dy, dx, *, offset, accumulate=False):
    """dx = dy[:, offset:offset + Cx], or dx += that slice if ``accumulate``."""
    _check_slice("concat_backward", "dx", dx, "dy", dy, offset)
    if accumulate:
        dx += dy[:, offset:offset + dx.shape[1]]
    else:
        dx[...] = dy[:, offset:offset + dx.shape[1]]


def channel_shuffle_ref(x, y, *, groups):
    n, c = x.shape[:2]
    y[...] = x.reshape(n, groups, c // groups, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[:, :, ::1], float32[:, :, ::1], int64)")
def _concat_forward_v1(x, y, offset):
    # x viewed as (N, Cx, S), y as (N, Cy, S); one thread per element of x.
    i = cuda.grid(1)
    n_, c_, s_ = x.shape
    if i < n_ * c_ * s_:
        b, c, s = i // (c_ * s_), (i // s_) % c_, i % s_
        y[b, offset + c, s] = x[b, c, s]


@cuda_kernel("void(float32[:, :, ::1], float32[:, :, ::1], int64, boolean)")
def _concat_backward_v1(dy, dx, offset, accumulate):
    # One thread per element of dx: copy (or add) its element of the dy slice.
    i = cuda.grid(1)
    n_, c_, s_ = dx.shape
    if i < n_ * c_ * s_:
        b, c, s = i // (c_ * s_), (i // s_) % c_, i % s_
        if accumulate:
            dx[b, c, s] += dy[b, offset + c, s]
        else:
            dx[b, c, s] = dy[b, offset + c, s]


@cuda_kernel("void(float32[:, :, ::1], float32[:, :, ::1], int64)")
def _channel_shuffle_v1(x, y, groups):
    # One thread per element of y: output channel c = i * groups + g reads input channel g * (C / groups) + i.
    k = cuda.grid(1)
    n_, c_, s_ = y.shape
    if k < n_ * c_ * s_:
        b, c, s = k // (c_ * s_), (k // s_) % c_, k % s_
        y[b, c, s] = x[b, (c % groups) * (c_ // groups) + c // groups, s]


# ---------------------------------------------------------------- launchers
def _check_slice(op, part_name, part, whole_name, whole, offset):
    """Check the part fits the channel slice [offset, offset + C_part) of the whole."""
    for name, a in ((part_name, part), (whole_name, whole)):
        if a.ndim < 2:
            raise ValueError(f"{op} {name}: expected (N, C, ...) with at least 2 dimensions, "
                             f"got shape {tuple(a.shape)}")
    if not isinstance(offset, (int, np.integer)) or isinstance(offset, bool):
        raise ValueError(f"{op} offset: expected an int, got {offset!r}")
    if part.shape[0] != whole.shape[0] or part.shape[2:] != whole.shape[2:]:
        want = ", ".join(str(d) for d in (part.shape[0], "C") + tuple(part.shape[2:]))
        raise ValueError(f"{op} {whole_name}: expected shape ({want}) to match {part_name} "
                         f"{tuple(part.shape)} outside the channel axis, got {tuple(whole.shape)}")
    c, total = part.shape[1], whole.shape[1]
    if offset < 0 or offset + c > total:
        raise ValueError(f"{op} offset: channels [{offset}, {offset + c}) of {part_name} do not fit in the "
                         f"{total} channels of {whole_name}")


def _ncs(a):
    n, c = a.shape[:2]
    return a.reshape(n, c, a.size // (n * c) if n * c else 0)


def concat_forward(x, y, *, offset, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("concat_forward x", x)
    check("concat_forward y", y)
    _check_slice("concat_forward", "x", x, "y", y, offset)
    if x.size:
        _concat_forward_v1[ceil_div(x.size, BLOCK), BLOCK, stream](_ncs(x), _ncs(y), int(offset))


def concat_backward(dy, dx, *, offset, accumulate=False, stream=0, version="v1"):
    check_version(version, ("v1",))
    check("concat_backward dy", dy)
    check("concat_backward dx", dx)
    _check_slice("concat_backward", "dx", dx, "dy", dy, offset)
    if dx.size:
        _concat_backward_v1[ceil_div(dx.size, BLOCK), BLOCK, stream](_ncs(dy), _ncs(dx), int(offset),
                                                                     bool(accumulate))


def channel_shuffle(x, y, *, groups, stream=0, version="v1"):
    """y = x with its channels shuffled in ``groups`` groups; ``channel_shuffle(dy, dx, groups=C // groups)``
    is the gradient. ``y`` must not be ``x``."""
    check_version(version, ("v1",))
    check("channel_shuffle x", x)
    check("channel_shuffle y", y, shape=x.shape)
    check_apart("channel_shuffle", ("y", y), ("x", x))
    c = x.shape[1] if x.ndim >= 2 else 0
    if x.ndim < 2 or not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1 \
            or c % groups:
        raise ValueError(f"channel_shuffle groups: expected a divisor of the {c} channels of an (N, C, ...) "
                         f"x, got {groups!r}")
    if y.size:
        _channel_shuffle_v1[ceil_div(y.size, BLOCK), BLOCK, stream](_ncs(x), _ncs(y), int(groups))


OPS = {
    "concat_forward": Op("concat_forward", concat_forward_ref, concat_forward),
    "concat_backward": Op("concat_backward", concat_backward_ref, concat_backward),
    "channel_shuffle": Op("channel_shuffle", channel_shuffle_ref, channel_shuffle),
}


def examples(rng):
    r, _ = example_arrays(rng)
    return [
        Example("concat_forward", (r(2, 3, 4, 5), np.full((2, 7, 4, 5), np.nan, np.float32)), (1,),
                kwargs={"offset": 0}, label="first of 7 channels"),
        Example("concat_forward", (r(2, 3, 4, 5), r(2, 7, 4, 5)), (1,), kwargs={"offset": 4},
                label="last, others kept"),
        Example("concat_forward", (r(3, 1, 3, 3), r(3, 5, 3, 3)), (1,), kwargs={"offset": 2},
                label="middle C=1"),
        Example("concat_forward", (r(5, 4), r(5, 9)), (1,), kwargs={"offset": 3}, label="(N, C)"),
        Example("concat_backward", (r(2, 7, 4, 5), np.full((2, 3, 4, 5), np.nan, np.float32)), (1,),
                kwargs={"offset": 4}, label="split"),
        Example("concat_backward", (r(2, 7, 3, 5), r(2, 2, 3, 5)), (1,),
                kwargs={"offset": 1, "accumulate": True}, label="accumulate"),
        Example("concat_backward", (r(4, 6, 2, 3), np.full((4, 6, 2, 3), np.nan, np.float32)), (1,),
                kwargs={"offset": 0}, label="whole tensor"),
        Example("channel_shuffle", (r(2, 6, 3, 5), np.full((2, 6, 3, 5), np.nan, np.float32)), (1,),
                kwargs={"groups": 2}, label="6 channels in 2 groups"),
        Example("channel_shuffle", (r(3, 12, 2, 2), np.full((3, 12, 2, 2), np.nan, np.float32)), (1,),
                kwargs={"groups": 3}, label="12 in 3 (the inverse of 12 in 4)"),
        Example("channel_shuffle", (r(2, 5, 3), np.full((2, 5, 3), np.nan, np.float32)), (1,),
                kwargs={"groups": 5}, label="groups = C: identity"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
