"""Dropout with a counter-based mask: PyTorch's inverted dropout, y = x * mask / (1 - p).

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.dropout

The mask is a pure function of (seed, element index), with no random state, so nothing of it is
stored: the forward draws it, the backward draws it again from the same seed, and a dropped output
that the runtime recomputes gets it bit for bit too (``dropout_mask`` writes it out, to inspect
and test it). For element i (flat C-order index) and a seed in [0, 2**32):

    key  = mix32(seed)                              (once, on the host)
    keep = mix32(mix32(i) ^ key) >= threshold,      threshold = round(p * 2**32)   (host, once)

mix32 is Chris Wellons' "lowbias32" 32-bit integer hash. Each 32-bit multiply is split into
16-bit halves so no intermediate exceeds 2**49: the SAME Python function then gives the same
bits on NumPy uint64 arrays (the reference), on Python ints (the simulator) and compiled by
Numba on int64 (a real GPU), with no reliance on overflow wrap-around or on Numba's integer
promotion rules. P(keep) = (2**32 - threshold) / 2**32 = 1 - p to within 2**-33.
``round`` is Python's (halves to even); p * 2**32 is exact in float64.

Kept elements are multiplied by scale = 1 / (1 - p) computed in float64 then rounded to
float32 (PyTorch multiplies by its scale too); dropped ones are ``x - x``: 0 for a finite x, NaN
for a NaN or an infinite one, which is what PyTorch's ``x * mask * scale`` gives there (NaN * 0
and inf * 0 are NaN), so dropout never hides a NaN. (PyTorch's zero is signed, -0.0 for a
negative x; ours is always +0.0.) p = 0 is the identity. ``dropout_mask`` writes uint8 0/1.
The backward dx = dy * mask * scale (dropped: dy - dy, likewise) takes the forward's seed and
rebuilds the mask; it may run in place (dx aliasing dy). Element-wise, so there is no reduction
order to fix; one version (v1).

``group`` (default 1) draws one decision for each run of ``group`` consecutive elements: element i
takes the decision of index i // group. PyTorch's Dropout2d, which drops whole channels, is
``group = H * W`` on an (N, C, H, W) tensor (one decision per image and channel); group 1 is the
element-wise dropout, bit for bit as before.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, uint8

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_version, cuda_kernel, flat, launch_1d

BLOCK = 256  # threads per block
VERSIONS = ("v1",)
M32 = 0xFFFFFFFF
MAX_ELEMENTS = 2**32  # element indices are hashed as 32-bit counters


# ---------------------------------------------------------------- the hash (host and device)
def _mix32(v):
    """lowbias32 on values in [0, 2**32): the same bits for NumPy uint64, Python int and Numba int64."""
    v = v ^ (v >> 16)
    v = (v * 0x352D + (((v * 0x7FEB) & 0xFFFF) << 16)) & M32  # v * 0x7FEB352D mod 2**32
    v = v ^ (v >> 15)
    v = (v * 0xA68B + (((v * 0x846C) & 0xFFFF) << 16)) & M32  # v * 0x846CA68B mod 2**32
    v = v ^ (v >> 16)
    return v


def _hyper(op, p, seed=0):
    """Validate p and seed; return (key, threshold, scale) as Python int, int, float."""
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{op}: p must be a number in [0, 1), got {p!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"{op}: seed must be an int in [0, 2**32), got {seed!r}")
    return _mix32(int(seed)), int(round(float(p) * 2**32)), 1.0 / (1.0 - float(p))


# ---------------------------------------------------------------- NumPy references
def _keep_ref(size, key, threshold, group=1):
    """Boolean keep decisions for flat indices 0 .. size-1 (each drawn at index // group), in uint64."""
    i = np.arange(size, dtype=np.uint64) // np.uint64(group)
    return _mix32(_mix32(i) ^ np.uint64(key)) >= np.uint64(threshold)


def dropout_mask_ref(mask, *, p, seed, group=1):
    key, threshold, _ = _hyper("dropout_mask", p, seed)
    mask[...] = _keep_ref(mask.size, key, threshold, group).reshape(mask.shape)


def dropout_forward_ref(x, y, *, p, seed, group=1):
    key, threshold, scale = _hyper("dropout_forward", p, seed)
    keep = _keep_ref(x.size, key, threshold, group).reshape(x.shape)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN on purpose
        y[...] = np.where(keep, x * x.dtype.type(scale), x - x)  # dropped: 0, or NaN for NaN and inf


def dropout_backward_ref(dy, dx, *, p, seed, group=1):
    """dx = dy * mask / (1 - p), the mask rebuilt from the forward's seed; dx may alias dy."""
    key, threshold, scale = _hyper("dropout_backward", p, seed)
    keep = _keep_ref(dy.size, key, threshold, group).reshape(dy.shape)
    with np.errstate(invalid="ignore"):
        dx[...] = np.where(keep, dy * dy.dtype.type(scale), dy - dy)


# ---------------------------------------------------------------- device helpers
_mix32_dev = cuda.jit(device=True, inline=True)(_mix32)  # the very same function, compiled for the GPU


@cuda.jit(device=True, inline=True)
def _keep(i, key, threshold):
    return _mix32_dev(_mix32_dev(i) ^ key) >= threshold


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(uint8[::1], int64, int64, int64)")
def _dropout_mask_v1(mask, key, threshold, group):
    i = cuda.grid(1)
    if i < mask.size:
        mask[i] = uint8(1) if _keep(i // group, key, threshold) else uint8(0)


@cuda_kernel("void(float32[::1], float32[::1], int64, int64, float32, int64)")
def _dropout_forward_v1(x, y, key, threshold, scale, group):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = v * scale if _keep(i // group, key, threshold) else v - v  # dropped: 0, or NaN for NaN, inf


@cuda_kernel("void(float32[::1], float32[::1], int64, int64, float32, int64)")
def _dropout_backward_v1(dy, dx, key, threshold, scale, group):
    # The forward's mask, drawn again. dx may be dy: read dy[i], then write dx[i]; nothing else.
    i = cuda.grid(1)
    if i < dx.size:
        g = dy[i]
        dx[i] = g * scale if _keep(i // group, key, threshold) else g - g


# ---------------------------------------------------------------- launchers
def _check_size(op, a, group):
    if a.size > MAX_ELEMENTS:
        raise ValueError(f"{op}: at most 2**32 elements (indices are 32-bit hash counters), got {a.size}")
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1 or a.size % group:
        raise ValueError(f"{op}: group must be a positive int dividing the {a.size} elements (one decision "
                         f"per group: H * W for a channel of an (N, C, H, W) map), got {group!r}")
    return int(group)


def dropout_mask(mask, *, p, seed, group=1, stream=0, version="v1", block=BLOCK):
    """Write the keep mask of (p, seed) as uint8 0/1: the one dropout_forward and dropout_backward draw."""
    check_version(version, VERSIONS)
    key, threshold, _ = _hyper("dropout_mask", p, seed)
    check("dropout_mask mask", mask, dtype=np.uint8)
    group = _check_size("dropout_mask", mask, group)
    launch_1d(_dropout_mask_v1, mask.size, block, stream, flat(mask), key, threshold, group)


def dropout_forward(x, y, *, p, seed, group=1, stream=0, version="v1", block=BLOCK):
    """y = x * mask / (1 - p), the mask drawn from ``seed`` (one decision per ``group`` elements);
    nothing else is written."""
    check_version(version, VERSIONS)
    key, threshold, scale = _hyper("dropout_forward", p, seed)
    check("dropout_forward x", x)
    check("dropout_forward y", y, shape=x.shape)
    group = _check_size("dropout_forward", x, group)
    launch_1d(_dropout_forward_v1, x.size, block, stream, flat(x), flat(y), key, threshold, np.float32(scale),
              group)


def dropout_backward(dy, dx, *, p, seed, group=1, stream=0, version="v1", block=BLOCK):
    """dx = dy * mask / (1 - p), the forward's mask rebuilt from the same ``seed`` and ``group``;
    ``dx`` may be the same array as ``dy`` (in place)."""
    check_version(version, VERSIONS)
    key, threshold, scale = _hyper("dropout_backward", p, seed)
    check("dropout_backward dy", dy)
    check("dropout_backward dx", dx, shape=dy.shape)
    group = _check_size("dropout_backward", dy, group)
    launch_1d(_dropout_backward_v1, dx.size, block, stream, flat(dy), flat(dx), key, threshold,
              np.float32(scale), group)


OPS = {
    "dropout_forward": Op("dropout_forward", dropout_forward_ref, dropout_forward, VERSIONS),
    "dropout_backward": Op("dropout_backward", dropout_backward_ref, dropout_backward, VERSIONS),
    "dropout_mask": Op("dropout_mask", dropout_mask_ref, dropout_mask, VERSIONS),
}


def examples(rng):
    r, nan = example_arrays(rng)
    def garbage_mask(*shape):
        return np.full(shape, 7, np.uint8)  # neither 0 nor 1: every element must be written

    out = []
    for shape, p, seed in (((2, 3, 5, 7), 0.5, 0), ((301,), 0.1, 12345), ((9, 37), 0.9, 2**32 - 1),
                           ((4, 33), 0.0, 7)):
        kw = {"p": p, "seed": seed}
        out.append(Example("dropout_forward", (r(*shape), nan(*shape)), (1,), kwargs=kw, launch={"block": 64},
                           label=f"{shape} p={p}"))
        out.append(Example("dropout_backward", (r(*shape), nan(*shape)), (1,), kwargs=kw,
                           launch={"block": 64}, label=f"{shape} p={p}"))
        out.append(Example("dropout_mask", (garbage_mask(*shape),), (0,), kwargs=kw, launch={"block": 64},
                           label=f"{shape} p={p}"))
    for op, args, out_ in (("dropout_forward", (r(2, 3, 4, 5), nan(2, 3, 4, 5)), (1,)),
                           ("dropout_backward", (r(2, 3, 4, 5), nan(2, 3, 4, 5)), (1,)),
                           ("dropout_mask", (garbage_mask(2, 3, 4, 5),), (0,))):
        out.append(Example(op, args, out_, kwargs={"p": 0.5, "seed": 3, "group": 20}, launch={"block": 64},
                           label="per channel (group = H * W)"))
    dy_in_place = r(3, 5, 11)
    out.append(Example("dropout_backward", (dy_in_place, dy_in_place), (1,), kwargs={"p": 0.3, "seed": 5},
                       launch={"block": 64}, label="dx aliases dy"))
    return out


if __name__ == "__main__":
    main(__import__(__name__))
