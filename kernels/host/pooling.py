"""The host device's pooling: max pooling forward as ``np.maximum`` over strided views, and compiled
loops for max pooling's gradient and for average pooling, bit for bit the references (see
:mod:`kernels.host`). Ceil mode needs no code of its own but the padded copy's size: the loops
clip every window to the image, and y's shape says how many windows there are."""
from __future__ import annotations

import numpy as np

from kernels.host import _compiled_takes, compiled, fast
from kernels.pooling import (_avg_divisors, _params, avgpool2d_backward_ref, avgpool2d_forward_ref,
                             end_padding, maxpool2d_backward_ref)


def _padded(x, ph, pw, eh, ew, fill=0.0):
    """x with ph rows and pw columns of ``fill`` before it, eh rows and ew columns after (more than
    ph, pw where ceil mode's last window runs past the padding); x itself when there is none."""
    if not (ph or pw or eh or ew):
        return x
    n, c, h, w = x.shape
    xp = np.empty((n, c, ph + h + eh, pw + w + ew), x.dtype)
    xp[:, :, :ph] = fill
    xp[:, :, ph + h:] = fill
    xp[:, :, ph:ph + h, :pw] = fill
    xp[:, :, ph:ph + h, pw + w:] = fill
    xp[:, :, ph:ph + h, pw:pw + w] = x
    return xp


def _offsets(kh, kw, sh, sw, oh, ow):
    """(index in (kh, kw) order, the slice of rows, the slice of columns) of each window offset."""
    for a in range(kh):
        for b in range(kw):
            yield a * kw + b, slice(a, a + sh * (oh - 1) + 1, sh), slice(b, b + sw * (ow - 1) + 1, sw)


@fast("maxpool2d_forward")
def maxpool2d_forward(x, y, *, kernel, stride=None, padding=0, ceil_mode=False):
    kh, kw, sh, sw, ph, pw = _params(kernel, stride, padding)
    (h, w), (oh, ow) = x.shape[2:], y.shape[2:]
    xp = _padded(x, ph, pw, end_padding(h, oh, kh, sh, ph), end_padding(w, ow, kw, sw, pw), fill=-np.inf)
    for i, rows, cols in _offsets(kh, kw, sh, sw, *y.shape[2:]):
        if i == 0:
            y[...] = xp[:, :, rows, cols]
        else:
            np.maximum(y, xp[:, :, rows, cols], out=y)  # propagates NaN, as .max does


@fast("maxpool2d_backward")
def maxpool2d_backward(x, y, dy, dx, *, kernel, stride=None, padding=0, ceil_mode=False):
    """The reference's result, bit for bit: dy[oh, ow] goes to the first real position of window
    (oh, ow), in (kh, kw) order, where x == y; each input element sums its windows' gradients in
    (oh, ow) ascending order from 0.0 (:func:`_maxpool_grad`)."""
    if np.isnan(y).any():  # a NaN window's gradient goes to its last NaN: the reference knows how
        maxpool2d_backward_ref(x, y, dy, dx, kernel=kernel, stride=stride, padding=padding)
        return
    kh, kw, sh, sw, ph, pw = _params(kernel, stride, padding)
    out = dx if dx.flags.c_contiguous else np.empty(dx.shape, dx.dtype)
    _maxpool_grad(np.ascontiguousarray(x), np.ascontiguousarray(y), np.ascontiguousarray(dy), kh, kw, sh, sw,
                  ph, pw, out)
    if out is not dx:
        dx[...] = out


@compiled
def _maxpool_grad(x, y, dy, kh, kw, sh, sw, ph, pw, dx):
    """Window by window in (oh, ow) order, the first position in (kh, kw) order inside the image
    where x equals the window's maximum gets its gradient, added onto 0.0 (as NumPy, with one
    boolean pass per window offset, this took 4.8 ms of LeNet's 29 ms step)."""
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    dx[...] = 0.0
    for ni in range(n):
        for ci in range(c):
            xc, yc, dyc, dxc = x[ni, ci], y[ni, ci], dy[ni, ci], dx[ni, ci]
            for r in range(oh):
                for q in range(ow):
                    m, found = yc[r, q], False
                    for a in range(kh):
                        i = r * sh + a - ph
                        if i < 0 or i >= h:
                            continue
                        for b in range(kw):
                            j = q * sw + b - pw
                            if 0 <= j < w and xc[i, j] == m:
                                dxc[i, j] += dyc[r, q]
                                found = True
                                break
                        if found:
                            break


@fast("avgpool2d_forward")
def avgpool2d_forward(x, y, *, kernel, stride=None, padding=0, count_include_pad=True, ceil_mode=False):
    """The reference's bits: each window's sum in (kh, kw) order from 0.0, divided by its divisor."""
    hp = dict(kernel=kernel, stride=stride, padding=padding, count_include_pad=count_include_pad)
    if not _compiled_takes(x, y):
        return avgpool2d_forward_ref(x, y, **hp)
    p, div = _avg_params(x.shape, y.shape, **hp)
    _avg_pool(x, *p, div, y)


@fast("avgpool2d_backward")
def avgpool2d_backward(dy, dx, *, kernel, stride=None, padding=0, count_include_pad=True, ceil_mode=False):
    """The reference's bits: dy / divisor added onto 0.0 window offset by window offset, in (kh, kw) order."""
    hp = dict(kernel=kernel, stride=stride, padding=padding, count_include_pad=count_include_pad)
    if not _compiled_takes(dy, dx):
        return avgpool2d_backward_ref(dy, dx, **hp)
    p, div = _avg_params(dx.shape, dy.shape, **hp)
    _avg_pool_grad(np.ascontiguousarray(dy / div), *p, dx)  # dy / divisor, as the reference divides


def _avg_params(x_shape, y_shape, *, kernel, stride, padding, count_include_pad):
    """(kh, kw, sh, sw, ph, pw) and each window's float32 divisor, (OH, OW)."""
    p = _params(kernel, stride, padding)
    return p, _avg_divisors(*x_shape[2:], *y_shape[2:], *p, count_include_pad).astype(np.float32)


# Average pooling: as NumPy, one small array operation per window offset (64 for ResNet's global
# 8x8 pool, 0.9 ms of a step); compiled, the loops below. Padded positions add 0.0, which changes
# no bits of a sum that starts at +0.0, so they are skipped.
@compiled
def _avg_pool(x, kh, kw, sh, sw, ph, pw, div, y):
    n, c, h, w = x.shape
    oh, ow = y.shape[2], y.shape[3]
    for ni in range(n):
        for ci in range(c):
            xc = x[ni, ci]
            for r in range(oh):
                for q in range(ow):
                    acc = np.float32(0)
                    for a in range(kh):
                        i = r * sh + a - ph
                        if i < 0 or i >= h:
                            continue
                        for b in range(kw):
                            j = q * sw + b - pw
                            if 0 <= j < w:
                                acc += xc[i, j]
                    y[ni, ci, r, q] = acc / div[r, q]


@compiled
def _avg_pool_grad(g, kh, kw, sh, sw, ph, pw, dx):
    """dx = the sum of g over the windows that hold each element, in the reference's order: by
    window offset (a, b) ascending, which is windows (r, q) DESCENDING, the order taken here."""
    n, c, h, w = dx.shape
    oh, ow = g.shape[2], g.shape[3]
    dx[...] = 0.0
    for ni in range(n):
        for ci in range(c):
            gc, dxc = g[ni, ci], dx[ni, ci]
            for r in range(oh - 1, -1, -1):
                for q in range(ow - 1, -1, -1):
                    v = gc[r, q]
                    for a in range(kh):
                        i = r * sh + a - ph
                        if i < 0 or i >= h:
                            continue
                        for b in range(kw):
                            j = q * sw + b - pw
                            if 0 <= j < w:
                                dxc[i, j] += v
