"""Swin Transformer's patch merging gather: torchvision's ``_patch_merging_pad`` (the part of
``PatchMerging`` before its LayerNorm and its linear reduction) for maps of even sides. Forward and
backward.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.patch_merge

Layout: snlite keeps PyTorch's channels-last (N, H, W, C) Swin map as an NCHW array (N, C, H, W).
torchvision takes x0 = x[:, 0::2, 0::2], x1 = x[:, 1::2, 0::2], x2 = x[:, 0::2, 1::2] and
x3 = x[:, 1::2, 1::2] of (N, H, W, C) and concatenates them on the channels, (N, H/2, W/2, 4C). Here:

- patch_merge_forward(x, y): x (N, C, H, W), y (N, 4C, H/2, W/2),
  y[n, g*C + c, i, j] = x[n, c, 2i + dh_g, 2j + dw_g] with (dh_g, dw_g) = (0, 0), (1, 0), (0, 1),
  (1, 1) for g = 0, 1, 2, 3 (dh_g = g % 2, dw_g = g // 2).
- patch_merge_backward(dy, dx): its gradient, the inverse gather: dx[n, c, h, w] =
  dy[n, (h % 2 + 2 * (w % 2)) * C + c, h // 2, w // 2] (each element of dx is exactly one of dy).

H and W must be even: torchvision pads an odd side with zeros first, snlite's patch merge does not
(a ValueError says so). Pure copies, one thread per output element: bit-exact. y must NOT alias x, nor
dx dy.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check_apart, check_version, cuda_kernel, launch_1d
from kernels.layernorm import _nchw

BLOCK = 256  # threads per block
VERSIONS = ("v1",)
OFFSETS = ((0, 0), (1, 0), (0, 1), (1, 1))  # (dh, dw) of group g = 0..3: torchvision's x0, x1, x2, x3


# ---------------------------------------------------------------- NumPy references
def patch_merge_forward_ref(x, y):
    y[...] = np.concatenate([x[:, :, dh::2, dw::2] for dh, dw in OFFSETS], axis=1)


def patch_merge_backward_ref(dy, dx):
    c = dx.shape[1]
    for g, (dh, dw) in enumerate(OFFSETS):
        dx[:, :, dh::2, dw::2] = dy[:, g * c:(g + 1) * c]


# ---------------------------------------------------------------- kernels
_F3 = "float32[:, :, ::1]"  # an (N, C, H, W) array as (N, C, H*W)


@cuda_kernel(f"void({_F3}, {_F3}, int64)")
def _patch_merge_forward_v1(x, y, w):
    # One thread per element of y (N, 4C, H/2 * W/2): y[n, g*C + c, i, j] = x[n, c, 2i + g % 2, 2j + g // 2].
    k = cuda.grid(1)
    n_, c4, s_ = y.shape
    if k < n_ * c4 * s_:
        b, ch, s = k // (c4 * s_), (k // s_) % c4, k % s_
        c_ = c4 // 4
        g, c = ch // c_, ch % c_
        i, j = s // (w // 2), s % (w // 2)
        y[b, ch, s] = x[b, c, (2 * i + g % 2) * w + 2 * j + g // 2]


@cuda_kernel(f"void({_F3}, {_F3}, int64)")
def _patch_merge_backward_v1(dy, dx, w):
    # One thread per element of dx (N, C, H*W): dx[n, c, h, w] = dy[n, (h % 2 + 2 (w % 2)) C + c, h/2, w/2].
    k = cuda.grid(1)
    n_, c_, s_ = dx.shape
    if k < n_ * c_ * s_:
        b, c, s = k // (c_ * s_), (k // s_) % c_, k % s_
        row, col = s // w, s % w
        dx[b, c, s] = dy[b, (row % 2 + 2 * (col % 2)) * c_ + c, (row // 2) * (w // 2) + col // 2]


# ---------------------------------------------------------------- launchers
def _merged(op, name, x):
    """The (N, 4C, H/2, W/2) shape of the merged map of ``x`` (N, C, H, W); a ValueError on an odd side."""
    n, c, h, w = x.shape
    if h % 2 or w % 2:
        raise ValueError(f"{op} {name}: snlite's patch merge needs even sides, got (H, W) = {(h, w)} "
                         f"(torchvision pads an odd side with zeros; pad the map first)")
    return n, 4 * c, h // 2, w // 2


def patch_merge_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    """Gather each 2x2 patch of ``x`` into 4C channels of ``y``; ``y`` must not alias ``x``."""
    op = "patch_merge_forward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    y3 = _nchw(op, "y", y, shape=_merged(op, "x", x))
    check_apart(op, ("y", y), ("x", x))
    launch_1d(_patch_merge_forward_v1, y3.size, block, stream, x3, y3, x.shape[3])


def patch_merge_backward(dy, dx, *, stream=0, version="v1", block=BLOCK):
    """Gradient of patch_merge_forward: scatter ``dy``'s 4C channels back to the 2x2 patches of ``dx``
    (every element written); ``dx`` must not alias ``dy``."""
    op = "patch_merge_backward"
    check_version(version, VERSIONS)
    dx3 = _nchw(op, "dx", dx)
    dy3 = _nchw(op, "dy", dy, shape=_merged(op, "dx", dx))
    check_apart(op, ("dx", dx), ("dy", dy))
    launch_1d(_patch_merge_backward_v1, dx3.size, block, stream, dy3, dx3, dx.shape[3])


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "patch_merge_forward", "patch_merge_backward")}


def examples(rng):
    r, nan = example_arrays(rng)
    def forward(n, c, h, w, label, block=BLOCK):
        return Example("patch_merge_forward", (r(n, c, h, w), nan(n, 4 * c, h // 2, w // 2)), (1,),
                       launch={"block": block}, label=label, rtol=0, atol=0)

    def backward(n, c, h, w, label, block=BLOCK):
        return Example("patch_merge_backward", (r(n, 4 * c, h // 2, w // 2), nan(n, c, h, w)), (1,),
                       launch={"block": block}, label=label, rtol=0, atol=0)

    return [
        forward(2, 3, 4, 6, "2x3 patches, C=3", block=32),
        forward(1, 1, 2, 2, "one patch, C=1"),
        forward(2, 5, 6, 2, "3x1 patches, C=5"),
        backward(2, 3, 4, 6, "2x3 patches, C=3", block=32),
        backward(1, 1, 2, 2, "one patch, C=1"),
        backward(2, 5, 6, 2, "3x1 patches, C=5"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
