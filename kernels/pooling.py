"""2-D max and average pooling (NCHW), forward and backward, PyTorch semantics (floor or ceil mode).

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.pooling

Window (oh, ow) covers input rows ``oh*sh - ph ... oh*sh - ph + kh - 1`` (columns likewise);
padded positions are -inf for max and 0 for average (PyTorch requires padding <= kernel / 2,
so every window holds at least one real element).

Output size, PyTorch's rule: OH = floor((H + 2*ph - kh) / sh) + 1, or with ``ceil_mode`` the
ceiling, less one if that last window would start at or past H + ph (the last window must start
inside the input or its left padding). In ceil mode the last windows may run off the end, past the
right padding: positions there are skipped as padding is, and average pooling's divisor counts
only the window clipped to the padded input (H + ph), as PyTorch's. The kernels take the window
range from y's shape and clip every window to the input, so both modes run the same kernels;
only the shape the launchers check differs.

Canonical orders:
- forward: one thread per output element scans its window in (kh, kw) order (row-major).
- maxpool backward, as cuDNN: the gradient of window (oh, ow) goes to the FIRST real position in
  (kh, kw) order whose x equals y[oh, ow] (ties go to the earliest); it reads x, y and dy. A dx
  thread checks x[ih, iw] == y[oh, ow], then scans only the window positions before its own.
- maxpool forward propagates NaN (as PyTorch: a NaN in the window makes its output NaN), and
  the gradient of a NaN window goes to the LAST NaN of the window in (kh, kw) order, the index
  PyTorch's forward records (its scan replaces the running maximum at every NaN it meets). A
  window of nothing but -inf sends its gradient to its first real position, as PyTorch's does.
- backward (both): a GATHER, one thread per dx element summing the windows that contain it from
  0.0, in the reference's order (so the host device's bits too): maxpool's in (oh, ow) ascending
  order, avgpool's descending (its reference adds window offset by window offset, (kh, kw)
  ascending, which meets an element's windows last first); no atomics, so every version gives the
  same bits.
- avgpool divides the window sum by the divisor (PyTorch's ``sum / divide_factor``); the backward
  adds ``dy[oh, ow] / divisor`` per window.

Versions: forwards are v1 only (each thread already does just its window). Backwards: v1 tries
every output window for each dx element (O(OH*OW) per thread, naive); v2 computes the range of
windows that overlap the element (O(ceil(kh/sh) * ceil(kw/sw)) per thread). Both sum in the
same order, so v1 and v2 are bit-identical.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_version, cuda_kernel, launch_1d, pair, unravel4

BLOCK = 128  # threads per block (1-D launches over output or input elements)
VERSIONS = ("v1",)
BACKWARD_VERSIONS = ("v1", "v2")


# ---------------------------------------------------------------- geometry (host)
def _params(kernel, stride, padding, op="pool"):
    """Normalise and validate to ints (kh, kw, sh, sw, ph, pw); stride None means stride = kernel."""
    kh, kw = pair(kernel, f"{op} kernel")
    sh, sw = (kh, kw) if stride is None else pair(stride, f"{op} stride")
    ph, pw = pair(padding, f"{op} padding")
    if kh < 1 or kw < 1:
        raise ValueError(f"{op}: kernel must be positive, got {(kh, kw)}")
    if sh < 1 or sw < 1:
        raise ValueError(f"{op}: stride must be positive, got {(sh, sw)}")
    if ph < 0 or pw < 0 or 2 * ph > kh or 2 * pw > kw:
        raise ValueError(f"{op}: padding must be in [0, kernel // 2], got padding {(ph, pw)} "
                         f"for kernel {(kh, kw)}")
    return kh, kw, sh, sw, ph, pw


def _out_size(size, k, s, p, ceil_mode):
    """Windows along one axis, PyTorch's ``pooling_output_shape`` (no dilation)."""
    if not ceil_mode:
        return (size + 2 * p - k) // s + 1
    out = -(-(size + 2 * p - k) // s) + 1
    return out - 1 if (out - 1) * s >= size + p else out  # the last window starts inside


def pool_output_shape(x_shape, kernel, stride=None, padding=0, *, op="pool", ceil_mode=False):
    """(N, C, OH, OW) with OH = (H + 2*ph - kh) // sh + 1 (floor mode), or PyTorch's ceil-mode rule
    (the module docstring); ValueError if the kernel does not fit."""
    if len(x_shape) != 4:
        raise ValueError(f"{op}: expected x of shape (N, C, H, W), got {tuple(x_shape)}")
    kh, kw, sh, sw, ph, pw = _params(kernel, stride, padding, op)
    n, c, h, w = (int(v) for v in x_shape)
    if h + 2 * ph < kh or w + 2 * pw < kw:
        raise ValueError(f"{op}: kernel {(kh, kw)} with padding {(ph, pw)} does not fit input {h}x{w}")
    return n, c, _out_size(h, kh, sh, ph, ceil_mode), _out_size(w, kw, sw, pw, ceil_mode)


def end_padding(size, out, k, s, p):
    """Padding after the input along one axis that holds every window of ``out``: p, or more where
    ceil mode's last window runs past it (the hosts' and references' padded copies use it)."""
    return max(p, (out - 1) * s + k - p - size)


# ---------------------------------------------------------------- NumPy references
def _windows(a, kh, kw, sh, sw, ph, pw, fill, oh, ow):
    """View (N, C, OH, OW, kh, kw) of ``a`` padded with ``fill`` (past the end as far as the last
    window reaches: ceil mode's may run past the padding)."""
    n, c, h, w = a.shape
    eh, ew = end_padding(h, oh, kh, sh, ph), end_padding(w, ow, kw, sw, pw)
    padded = np.full((n, c, ph + h + eh, pw + w + ew), fill, dtype=a.dtype)
    padded[:, :, ph:ph + h, pw:pw + w] = a
    win = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(2, 3))
    return win[:, :, ::sh, ::sw][:, :, :oh, :ow]


def _avg_divisors(h, w, oh, ow, kh, kw, sh, sw, ph, pw, count_include_pad):
    """(OH, OW) divisors as PyTorch: the window clipped to the padded input, or to the real input."""
    def axis(o, s, p, k, size):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, size + p)
        return end - start, np.minimum(end, size) - np.maximum(start, 0)
    pool_h, real_h = axis(oh, sh, ph, kh, h)
    pool_w, real_w = axis(ow, sw, pw, kw, w)
    return np.outer(pool_h, pool_w) if count_include_pad else np.outer(real_h, real_w)


# ceil_mode is accepted (the launchers' arguments) and needs no code: y's shape says how many windows.
def maxpool2d_forward_ref(x, y, *, kernel, stride=None, padding=0, ceil_mode=False):
    p = _params(kernel, stride, padding)
    y[...] = _windows(x, *p, -np.inf, *y.shape[2:]).max(axis=(4, 5))


def maxpool2d_backward_ref(x, y, dy, dx, *, kernel, stride=None, padding=0, ceil_mode=False):
    """dy[oh, ow] goes to the first position of window (oh, ow), in (kh, kw) order, where x == y;
    where y is NaN, to the last NaN position of the window."""
    kh, kw, sh, sw, ph, pw = p = _params(kernel, stride, padding)
    n, c, h, w = x.shape
    real = _windows(np.ones(x.shape, bool), *p, False, *y.shape[2:]).reshape(y.shape + (-1,))
    win = _windows(x, *p, -np.inf, *y.shape[2:]).reshape(y.shape + (-1,))
    hit, nan, y_nan = (win == y[..., None]) & real, np.isnan(win) & real, np.isnan(y)
    pos = np.where(y_nan, kh * kw - 1 - nan[..., ::-1].argmax(-1), hit.argmax(-1))
    found = np.where(y_nan, nan.any(-1), hit.any(-1))  # False only if y does not come from this x
    ni, ci, oi, wi = np.indices(y.shape)
    grad = np.zeros(real.shape[:2] + _padded_hw(h, w, *y.shape[2:], *p), dtype=dy.dtype)
    g = np.where(found, dy, dy.dtype.type(0))
    np.add.at(grad, (ni, ci, oi * sh + pos // kw, wi * sw + pos % kw), g)  # in (oh, ow) order
    dx[...] = grad[:, :, ph:ph + h, pw:pw + w]


def _padded_hw(h, w, oh, ow, kh, kw, sh, sw, ph, pw):
    """(rows, columns) of the input padded to hold every window."""
    return ph + h + end_padding(h, oh, kh, sh, ph), pw + w + end_padding(w, ow, kw, sw, pw)


def avgpool2d_forward_ref(x, y, *, kernel, stride=None, padding=0, count_include_pad=True, ceil_mode=False):
    kh, kw, sh, sw, ph, pw = p = _params(kernel, stride, padding)
    win = _windows(x, *p, 0, *y.shape[2:])
    acc = np.zeros(y.shape, dtype=x.dtype)
    for a in range(kh):  # (kh, kw) order, as the kernel (adding a padded 0 changes no bits)
        for b in range(kw):
            acc += win[..., a, b]
    y[...] = acc / _avg_divisors(*x.shape[2:], *y.shape[2:], *p, count_include_pad).astype(x.dtype)


def avgpool2d_backward_ref(dy, dx, *, kernel, stride=None, padding=0, count_include_pad=True,
                           ceil_mode=False):
    kh, kw, sh, sw, ph, pw = p = _params(kernel, stride, padding)
    n, c, h, w = dx.shape
    oh, ow = dy.shape[2:]
    g = dy / _avg_divisors(h, w, oh, ow, *p, count_include_pad).astype(dy.dtype)
    grad = np.zeros((n, c) + _padded_hw(h, w, oh, ow, *p), dtype=dy.dtype)
    for a in range(kh):
        for b in range(kw):
            grad[:, :, a:a + sh * oh:sh, b:b + sw * ow:sw] += g
    dx[...] = grad[:, :, ph:ph + h, pw:pw + w]


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _no_earlier_match(x, n, c, h0, w0, kw, ih, iw, v):
    """True iff no real position of the window at (h0, w0) before (ih, iw), in (kh, kw) order, holds v."""
    for a in range(max(h0, 0), ih + 1):
        for b in range(max(w0, 0), min(w0 + kw, x.shape[3])):
            if a == ih and b == iw:
                return True
            if x[n, c, a, b] == v:
                return False
    return True


@cuda.jit(device=True, inline=True)
def _no_later_nan(x, n, c, h0, w0, kh, kw, ih, iw):
    """True iff no real position of the window at (h0, w0) after (ih, iw), in (kh, kw) order, is NaN."""
    for a in range(ih, min(h0 + kh, x.shape[2])):
        for b in range(max(w0, 0), min(w0 + kw, x.shape[3])):
            if (a > ih or b > iw) and x[n, c, a, b] != x[n, c, a, b]:
                return False
    return True


@cuda.jit(device=True, inline=True)
def _divisor(oh, ow, h_, w_, kh, kw, sh, sw, ph, pw, count_include_pad):
    h0 = oh * sh - ph
    w0 = ow * sw - pw
    h1 = min(h0 + kh, h_ + ph)
    w1 = min(w0 + kw, w_ + pw)
    if count_include_pad:
        return float32((h1 - h0) * (w1 - w0))
    return float32((min(h1, h_) - max(h0, 0)) * (min(w1, w_) - max(w0, 0)))


@cuda.jit(device=True, inline=True)
def _overlapping(i, s, p, k, n_out):
    """Range [lo, hi) of output windows along one axis whose span contains input index i."""
    lo = max(0, -((k - 1 - i - p) // s))  # ceil((i + p - k + 1) / s)
    return lo, min(n_out, (i + p) // s + 1)


@cuda.jit(device=True, inline=True)
def _maxpool_window_grad(x, y, dy, n, c, ih, iw, oh, ow, kh, kw, sh, sw, ph, pw):
    """dy[oh, ow] if (ih, iw) is inside window (oh, ow) and is its first maximum (its last NaN,
    for a NaN window), else 0."""
    h0 = oh * sh - ph
    w0 = ow * sw - pw
    v = x[n, c, ih, iw]
    if h0 <= ih < h0 + kh and w0 <= iw < w0 + kw:
        m = y[n, c, oh, ow]
        if m == v and _no_earlier_match(x, n, c, h0, w0, kw, ih, iw, v):
            return dy[n, c, oh, ow]
        if m != m and v != v and _no_later_nan(x, n, c, h0, w0, kh, kw, ih, iw):
            return dy[n, c, oh, ow]
    return float32(0.0)


# ---------------------------------------------------------------- kernels
_I6 = "int64, int64, int64, int64, int64, int64"
_T4 = "float32[:, :, :, ::1]"


@cuda_kernel(f"void({_T4}, {_T4}, {_I6})")
def _maxpool2d_forward_v1(x, y, kh, kw, sh, sw, ph, pw):
    # One thread per output element scans its window; strict > keeps the first maximum, and a NaN
    # propagates (v != v), as in PyTorch and np.max.
    i = cuda.grid(1)
    if i < y.size:
        n, c, oh, ow = unravel4(i, y.shape[1], y.shape[2], y.shape[3])
        h0 = oh * sh - ph
        w0 = ow * sw - pw
        best = float32(-math.inf)
        for a in range(max(h0, 0), min(h0 + kh, x.shape[2])):
            for b in range(max(w0, 0), min(w0 + kw, x.shape[3])):
                v = x[n, c, a, b]
                if v > best or v != v:
                    best = v
        y[n, c, oh, ow] = best


@cuda_kernel(f"void({_T4}, {_T4}, {_T4}, {_T4}, {_I6})")
def _maxpool2d_backward_v1(x, y, dy, dx, kh, kw, sh, sw, ph, pw):
    # Naive gather: each dx element tries every output window.
    i = cuda.grid(1)
    if i < dx.size:
        n, c, ih, iw = unravel4(i, dx.shape[1], dx.shape[2], dx.shape[3])
        acc = float32(0.0)
        for oh in range(dy.shape[2]):
            for ow in range(dy.shape[3]):
                acc += _maxpool_window_grad(x, y, dy, n, c, ih, iw, oh, ow, kh, kw, sh, sw, ph, pw)
        dx[n, c, ih, iw] = acc


@cuda_kernel(f"void({_T4}, {_T4}, {_T4}, {_T4}, {_I6})")
def _maxpool2d_backward_v2(x, y, dy, dx, kh, kw, sh, sw, ph, pw):
    # Gather over only the windows that overlap the element, in the same (oh, ow) order as v1.
    i = cuda.grid(1)
    if i < dx.size:
        n, c, ih, iw = unravel4(i, dx.shape[1], dx.shape[2], dx.shape[3])
        oh0, oh1 = _overlapping(ih, sh, ph, kh, dy.shape[2])
        ow0, ow1 = _overlapping(iw, sw, pw, kw, dy.shape[3])
        acc = float32(0.0)
        for oh in range(oh0, oh1):
            for ow in range(ow0, ow1):
                acc += _maxpool_window_grad(x, y, dy, n, c, ih, iw, oh, ow, kh, kw, sh, sw, ph, pw)
        dx[n, c, ih, iw] = acc


@cuda_kernel(f"void({_T4}, {_T4}, {_I6}, boolean)")
def _avgpool2d_forward_v1(x, y, kh, kw, sh, sw, ph, pw, count_include_pad):
    i = cuda.grid(1)
    if i < y.size:
        n, c, oh, ow = unravel4(i, y.shape[1], y.shape[2], y.shape[3])
        h0 = oh * sh - ph
        w0 = ow * sw - pw
        acc = float32(0.0)
        for a in range(max(h0, 0), min(h0 + kh, x.shape[2])):
            for b in range(max(w0, 0), min(w0 + kw, x.shape[3])):
                acc += x[n, c, a, b]
        div = _divisor(oh, ow, x.shape[2], x.shape[3], kh, kw, sh, sw, ph, pw, count_include_pad)
        y[n, c, oh, ow] = acc / div


@cuda_kernel(f"void({_T4}, {_T4}, {_I6}, boolean)")
def _avgpool2d_backward_v1(dy, dx, kh, kw, sh, sw, ph, pw, count_include_pad):
    # Naive gather: each dx element tries every output window, last first (the reference's order).
    i = cuda.grid(1)
    if i < dx.size:
        n, c, ih, iw = unravel4(i, dx.shape[1], dx.shape[2], dx.shape[3])
        h_, w_ = dx.shape[2], dx.shape[3]
        acc = float32(0.0)
        for a in range(dy.shape[2]):  # (a count up, oh down: a negative range step costs registers)
            oh = dy.shape[2] - 1 - a
            for b in range(dy.shape[3]):
                ow = dy.shape[3] - 1 - b
                h0 = oh * sh - ph
                w0 = ow * sw - pw
                if h0 <= ih < h0 + kh and w0 <= iw < w0 + kw:
                    acc += dy[n, c, oh, ow] / _divisor(oh, ow, h_, w_, kh, kw, sh, sw, ph, pw,
                                                       count_include_pad)
        dx[n, c, ih, iw] = acc


@cuda_kernel(f"void({_T4}, {_T4}, {_I6}, boolean)")
def _avgpool2d_backward_v2(dy, dx, kh, kw, sh, sw, ph, pw, count_include_pad):
    # Gather over only the overlapping windows, in the same (oh, ow) order as v1: last first.
    i = cuda.grid(1)
    if i < dx.size:
        n, c, ih, iw = unravel4(i, dx.shape[1], dx.shape[2], dx.shape[3])
        h_, w_ = dx.shape[2], dx.shape[3]
        oh0, oh1 = _overlapping(ih, sh, ph, kh, dy.shape[2])
        ow0, ow1 = _overlapping(iw, sw, pw, kw, dy.shape[3])
        acc = float32(0.0)
        for a in range(oh1 - oh0):  # as in v1
            oh = oh1 - 1 - a
            for b in range(ow1 - ow0):
                ow = ow1 - 1 - b
                acc += dy[n, c, oh, ow] / _divisor(oh, ow, h_, w_, kh, kw, sh, sw, ph, pw, count_include_pad)
        dx[n, c, ih, iw] = acc


# ---------------------------------------------------------------- launchers
def _check_pool(op, x, y, kernel, stride, padding, ceil_mode, x_name="x", y_name="y"):
    """Validate x (N, C, H, W) and y (N, C, OH, OW); return (kh, kw, sh, sw, ph, pw)."""
    check(f"{op} {x_name}", x)
    check(f"{op} {y_name}", y, shape=pool_output_shape(x.shape, kernel, stride, padding, op=op,
                                                       ceil_mode=ceil_mode))
    return _params(kernel, stride, padding, op)


def maxpool2d_forward(x, y, *, kernel, stride=None, padding=0, ceil_mode=False, stream=0, version="v1",
                      block=BLOCK):
    check_version(version, VERSIONS)
    p = _check_pool("maxpool2d_forward", x, y, kernel, stride, padding, ceil_mode)
    launch_1d(_maxpool2d_forward_v1, y.size, block, stream, x, y, *p)


def maxpool2d_backward(x, y, dy, dx, *, kernel, stride=None, padding=0, ceil_mode=False, stream=0,
                       version="v2", block=BLOCK):
    check_version(version, BACKWARD_VERSIONS)
    op = "maxpool2d_backward"
    p = _check_pool(op, x, y, kernel, stride, padding, ceil_mode)
    check(f"{op} dy", dy, shape=y.shape)
    check(f"{op} dx", dx, shape=x.shape)
    kern = _maxpool2d_backward_v1 if version == "v1" else _maxpool2d_backward_v2
    launch_1d(kern, dx.size, block, stream, x, y, dy, dx, *p)


def avgpool2d_forward(x, y, *, kernel, stride=None, padding=0, count_include_pad=True, ceil_mode=False,
                      stream=0, version="v1", block=BLOCK):
    check_version(version, VERSIONS)
    p = _check_pool("avgpool2d_forward", x, y, kernel, stride, padding, ceil_mode)
    launch_1d(_avgpool2d_forward_v1, y.size, block, stream, x, y, *p, bool(count_include_pad))


def avgpool2d_backward(dy, dx, *, kernel, stride=None, padding=0, count_include_pad=True, ceil_mode=False,
                       stream=0, version="v2", block=BLOCK):
    check_version(version, BACKWARD_VERSIONS)
    p = _check_pool("avgpool2d_backward", dx, dy, kernel, stride, padding, ceil_mode, x_name="dx",
                    y_name="dy")
    kern = _avgpool2d_backward_v1 if version == "v1" else _avgpool2d_backward_v2
    launch_1d(kern, dx.size, block, stream, dy, dx, *p, bool(count_include_pad))


OPS = {
    "maxpool2d_forward": Op("maxpool2d_forward", maxpool2d_forward_ref, maxpool2d_forward, VERSIONS),
    "maxpool2d_backward": Op("maxpool2d_backward", maxpool2d_backward_ref, maxpool2d_backward,
                             BACKWARD_VERSIONS),
    "avgpool2d_forward": Op("avgpool2d_forward", avgpool2d_forward_ref, avgpool2d_forward, VERSIONS),
    "avgpool2d_backward": Op("avgpool2d_backward", avgpool2d_backward_ref, avgpool2d_backward,
                             BACKWARD_VERSIONS),
}


def examples(rng):
    r, nan = example_arrays(rng)
    cases = [  # (x shape, hyper-parameters, label)
        ((2, 3, 9, 11), {"kernel": 3, "stride": 2, "padding": 1}, "k3 s2 p1 overlapping"),
        ((2, 3, 8, 7), {"kernel": 2}, "k2 default stride, odd W"),
        ((1, 2, 7, 9), {"kernel": (3, 2), "stride": (1, 2), "padding": (1, 0)}, "k3x2 s1x2 p1x0"),
        # ceil mode: SqueezeNet's and GoogLeNet's 3x3 stride 2 (the last window runs off the end),
        # padding with it, and a window that would start in the right padding (dropped)
        ((2, 2, 8, 7), {"kernel": 3, "stride": 2, "ceil_mode": True}, "ceil k3 s2"),
        ((1, 2, 8, 7), {"kernel": (3, 2), "stride": (2, 3), "padding": (1, 0), "ceil_mode": True},
         "ceil k3x2 s2x3 p1x0"),
        ((1, 1, 5, 5), {"kernel": 2, "stride": 2, "padding": 1, "ceil_mode": True}, "ceil drops a window"),
    ]
    out = []
    for shape, hp, label in cases:
        oshape = pool_output_shape(shape, hp["kernel"], hp.get("stride"), hp.get("padding", 0),
                                   ceil_mode=hp.get("ceil_mode", False))
        x = r(*shape)
        y = np.empty(oshape, np.float32)
        maxpool2d_forward_ref(x, y, **hp)
        out += [
            Example("maxpool2d_forward", (x, nan(*oshape)), (1,), kwargs=hp,
                    launch={"block": 64}, label=label),
            Example("maxpool2d_backward", (x, y, r(*oshape), nan(*shape)), (3,), kwargs=hp,
                    launch={"block": 64}, label=label),
            Example("avgpool2d_forward", (x, nan(*oshape)), (1,), kwargs=hp,
                    launch={"block": 64}, label=label),
            Example("avgpool2d_backward", (r(*oshape), nan(*shape)), (1,), kwargs=hp, launch={"block": 64},
                    label=label),
        ]
    # Ties: small integers, overlapping windows; the gradient must go to the first maximum.
    hp = {"kernel": 3, "stride": 2, "padding": 1}
    x = rng.integers(0, 3, (2, 2, 7, 8)).astype(np.float32)
    oshape = pool_output_shape(x.shape, **hp)
    y = np.empty(oshape, np.float32)
    maxpool2d_forward_ref(x, y, **hp)
    out.append(Example("maxpool2d_backward", (x, y, r(*oshape), nan(*x.shape)), (3,), kwargs=hp,
                       launch={"block": 64}, label="ties go to first max"))
    # NaN and -inf: a NaN window's output is NaN and its gradient goes to its last NaN (PyTorch's).
    x = r(2, 2, 7, 8)
    x.flat[::5], x.flat[2::7] = np.nan, -np.inf
    y = np.empty(oshape, np.float32)
    maxpool2d_forward_ref(x, y, **hp)
    out += [Example("maxpool2d_forward", (x, nan(*oshape)), (1,), kwargs=hp, launch={"block": 64},
                    label="NaN, -inf"),
            Example("maxpool2d_backward", (x, y, r(*oshape), nan(*x.shape)), (3,), kwargs=hp,
                    launch={"block": 64}, label="NaN windows")]
    for include in (True, False):
        hp = {"kernel": 3, "stride": 2, "padding": 1, "count_include_pad": include}
        x = r(1, 3, 6, 7)
        oshape = pool_output_shape(x.shape, 3, 2, 1)
        out += [
            Example("avgpool2d_forward", (x, nan(*oshape)), (1,), kwargs=hp, label=f"include_pad={include}"),
            Example("avgpool2d_backward", (r(*oshape), nan(*x.shape)), (1,), kwargs=hp,
                    label=f"include_pad={include}"),
        ]
    return out


if __name__ == "__main__":
    main(__import__(__name__))
