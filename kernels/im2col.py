"""im2col and col2im: the layout transforms behind GEMM convolution (``kernels.conv``).

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.im2col

Layouts, for an input (N, C, H, W), a kernel (KH, KW), stride (sh, sw), padding (ph, pw) and an
output (OH, OW) = ((H + 2*ph - KH)//sh + 1, (W + 2*pw - KW)//sw + 1):
- ``col`` is (N, K, P) with K = C*KH*KW and P = OH*OW; row ``k = (c*KH + kh)*KW + kw``, column
  ``p = oh*OW + ow`` holds ``x[n, c, oh*sh - ph + kh, ow*sw - pw + kw]``, or 0.0 where that tap
  falls in the padding. Per image, conv forward is then ``w (Cout x K) @ col[n] (K x P)``.
- ``col2im`` is the adjoint: ``dx[n, c, ih, iw]`` GATHERS (no atomics) the entries of ``col``
  that im2col copied from that position. Canonical order, which ``conv2d_backward_data``'s
  direct kernel repeats: ``total = 0.0`` then ``total += col[n, k, p]`` for kh ascending, then
  kw ascending, over the taps that hit (ih, iw). A position no tap reads (stride > kernel) is 0.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Launch, Op, ceil_div, check, check_version, cuda_kernel, pair, unravel4

BLOCK = 128  # threads per block of the 1-D launches


def output_hw(hw, kernel_size, stride=1, padding=0, *, who="im2col") -> tuple[int, int]:
    """(OH, OW) of a window of ``kernel_size`` sliding over ``hw``; ValueErrors name ``who``."""
    h, w = pair(hw, f"{who} input size")
    kh, kw = pair(kernel_size, f"{who} kernel_size")
    sh, sw = pair(stride, f"{who} stride")
    ph, pw = pair(padding, f"{who} padding")
    if sh < 1 or sw < 1:
        raise ValueError(f"{who}: stride must be >= 1, got {(sh, sw)}")
    if ph < 0 or pw < 0:
        raise ValueError(f"{who}: padding must be >= 0, got {(ph, pw)}")
    if kh < 1 or kw < 1:
        raise ValueError(f"{who}: kernel must be at least 1x1, got {kh}x{kw}")
    if kh > h + 2 * ph or kw > w + 2 * pw:
        raise ValueError(f"{who}: kernel {kh}x{kw} is larger than the padded input {h + 2 * ph}x{w + 2 * pw} "
                         f"(input {h}x{w}, padding {(ph, pw)})")
    return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


# ---------------------------------------------------------------- NumPy references
def _taps(x_shape, kernel_size, stride, padding):
    """Yield (kh, kw, row slice, column slice) of the padded input read by each kernel tap."""
    oh, ow = output_hw(x_shape[2:], kernel_size, stride, padding)
    (kh_, kw_), (sh, sw) = pair(kernel_size, "kernel_size"), pair(stride, "stride")
    for kh in range(kh_):
        for kw in range(kw_):
            yield kh, kw, slice(kh, kh + sh * (oh - 1) + 1, sh), slice(kw, kw + sw * (ow - 1) + 1, sw)


def im2col_ref(x, col, *, kernel_size, stride=1, padding=0):
    n, c = x.shape[:2]
    (kh_, kw_), (ph, pw) = pair(kernel_size, "kernel_size"), pair(padding, "padding")
    oh, ow = output_hw(x.shape[2:], kernel_size, stride, padding)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    col6 = np.empty((n, c, kh_, kw_, oh, ow), x.dtype)
    for kh, kw, rows, cols in _taps(x.shape, kernel_size, stride, padding):
        col6[:, :, kh, kw] = xp[:, :, rows, cols]
    col[...] = col6.reshape(col.shape)


def col2im_ref(col, dx, *, kernel_size, stride=1, padding=0):
    n, c, h, w = dx.shape
    (kh_, kw_), (ph, pw) = pair(kernel_size, "kernel_size"), pair(padding, "padding")
    oh, ow = output_hw((h, w), kernel_size, stride, padding)
    col6 = col.reshape(n, c, kh_, kw_, oh, ow)
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), col.dtype)
    for kh, kw, rows, cols in _taps(dx.shape, kernel_size, stride, padding):
        dxp[:, :, rows, cols] += col6[:, :, kh, kw]
    dx[...] = dxp[:, :, ph:ph + h, pw:pw + w]


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _tap(x, n, c, ih, iw):
    """x[n, c, ih, iw], or 0.0 where (ih, iw) lies in the padding."""
    if ih >= 0 and ih < x.shape[2] and iw >= 0 and iw < x.shape[3]:
        return x[n, c, ih, iw]
    return float32(0.0)


@cuda.jit(device=True, inline=True)
def _col_value(x, n, k, p, kh_, kw_, ow_, sh, sw, ph, pw):
    """col[n, k, p] computed from x (see the module docstring for the layout)."""
    c = k // (kh_ * kw_)
    r = k - c * (kh_ * kw_)
    kh = r // kw_
    oh = p // ow_
    return _tap(x, n, c, oh * sh - ph + kh, (p - oh * ow_) * sw - pw + (r - kh * kw_))


@cuda.jit(device=True, inline=True)
def _out_index(t, s, o_):
    """The output index o with o*s == t and 0 <= o < o_, or -1 if this tap misses (t = i + pad - k)."""
    if t < 0 or t % s != 0 or t // s >= o_:
        return -1
    return t // s


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[:, :, :, ::1], float32[:, :, ::1], int64, int64, int64, int64, int64, int64, "
             "int64)")
def _im2col_v1(x, col, kh_, kw_, ow_, sh, sw, ph, pw):
    # One thread per element of col; neighbouring threads write neighbouring columns p.
    i = cuda.grid(1)
    nb, k_, p_ = col.shape
    if i < nb * k_ * p_:
        p = i % p_
        k = (i // p_) % k_
        n = i // (p_ * k_)
        col[n, k, p] = _col_value(x, n, k, p, kh_, kw_, ow_, sh, sw, ph, pw)


@cuda_kernel("void(float32[:, :, ::1], float32[:, :, :, ::1], int64, int64, int64, int64, int64, int64, "
             "int64, int64)")
def _col2im_v1(col, dx, kh_, kw_, oh_, ow_, sh, sw, ph, pw):
    # One thread per element of dx gathers its taps in the canonical order (kh, then kw).
    i = cuda.grid(1)
    n_, c_, h_, w_ = dx.shape
    if i < n_ * c_ * h_ * w_:
        n, c, ih, iw = unravel4(i, c_, h_, w_)
        total = float32(0.0)
        for kh in range(kh_):
            oh = _out_index(ih + ph - kh, sh, oh_)
            if oh >= 0:
                for kw in range(kw_):
                    ow = _out_index(iw + pw - kw, sw, ow_)
                    if ow >= 0:
                        total += col[n, (c * kh_ + kh) * kw_ + kw, oh * ow_ + ow]
        dx[n, c, ih, iw] = total


# ---------------------------------------------------------------- launchers
def _geometry(name, x_shape, col_shape, kernel_size, stride, padding):
    """Check both shapes; return the kernel arguments after (x, col): kh, kw, oh, ow, sh, sw, ph, pw."""
    if len(x_shape) != 4:
        raise ValueError(f"{name}: expected an (N, C, H, W) image, got shape {tuple(x_shape)}")
    (kh, kw), (sh, sw) = pair(kernel_size, "kernel_size"), pair(stride, "stride")
    ph, pw = pair(padding, "padding")
    oh, ow = output_hw(x_shape[2:], (kh, kw), stride, padding, who=name)
    want = (x_shape[0], x_shape[1] * kh * kw, oh * ow)
    if tuple(col_shape) != want:
        raise ValueError(f"{name} col: expected shape {want} (N, C*KH*KW, OH*OW), got {tuple(col_shape)}")
    return kh, kw, oh, ow, sh, sw, ph, pw


def im2col_geometry(col_shape) -> Launch:
    """The launch of ``im2col`` writing a column buffer of ``col_shape``: one thread per element;
    it reads x once per element written (taps overlap, so mostly from cache: counted once)."""
    size = int(np.prod(col_shape))
    return Launch("kernels.im2col._im2col_v1", ceil_div(size, BLOCK), BLOCK, flops=0, bytes=4 * 2 * size)


def col2im_geometry(col_shape, dx_shape) -> Launch:
    """The launch of ``col2im`` gathering ``col_shape`` into ``dx_shape``: one thread per element of dx."""
    size = int(np.prod(dx_shape))
    return Launch("kernels.im2col._col2im_v1", ceil_div(size, BLOCK), BLOCK, flops=0,
                  bytes=4 * (int(np.prod(col_shape)) + size))


def im2col(x, col, *, kernel_size, stride=1, padding=0, stream=0, version="v1"):
    """Copy every kernel window of x (N, C, H, W) into the columns of col (N, C*KH*KW, OH*OW)."""
    check_version(version, ("v1",))
    check("im2col x", x)
    check("im2col col", col)
    kh, kw, _, ow, sh, sw, ph, pw = _geometry("im2col", x.shape, col.shape, kernel_size, stride, padding)
    _im2col_v1.launch(im2col_geometry(col.shape), stream, x, col, kh, kw, ow, sh, sw, ph, pw)


def col2im(col, dx, *, kernel_size, stride=1, padding=0, stream=0, version="v1"):
    """dx (N, C, H, W) = the adjoint of im2col applied to col: each element gathers its taps."""
    check_version(version, ("v1",))
    check("col2im col", col)
    check("col2im dx", dx)
    geo = _geometry("col2im", dx.shape, col.shape, kernel_size, stride, padding)
    _col2im_v1.launch(col2im_geometry(col.shape, dx.shape), stream, col, dx, *geo)


OPS = {
    "im2col": Op("im2col", im2col_ref, im2col),
    "col2im": Op("col2im", col2im_ref, col2im),
}


def examples(rng):
    r, nan = example_arrays(rng)
    out = []
    # (x shape, kernel, stride, padding, label): padding, stride 2, asymmetric, stride > kernel (gaps)
    for xs, k, s, p, label in (((2, 3, 5, 6), 3, 1, 1, "3x3 pad 1"),
                               ((2, 2, 7, 5), (3, 2), (2, 1), (2, 0), "3x2 s(2,1) pad(2,0)"),
                               ((1, 3, 4, 9), (1, 7), 1, (0, 3), "1x7 pad(0,3)"),
                               ((2, 2, 5, 5), 1, 2, 0, "1x1 s2: gaps")):
        oh, ow = output_hw(xs[2:], k, s, p)
        hyper = {"kernel_size": k, "stride": s, "padding": p}
        kh, kw = pair(k, "kernel_size")
        colshape = (xs[0], xs[1] * kh * kw, oh * ow)
        out.append(Example("im2col", (r(*xs), nan(*colshape)), (1,), kwargs=hyper, label=label))
        out.append(Example("col2im", (r(*colshape), nan(*xs)), (1,), kwargs=hyper, label=label))
    return out


if __name__ == "__main__":
    main(__import__(__name__))
