"""The host device's convolution: im2col and one BLAS product over the whole batch, in all three
directions, and the column buffer of dy that a stride-1 layer's two backward products share (see
:mod:`kernels.host`). A grouped convolution is a stack of products, one per group: the column
buffer's rows are the groups' rows one after the other (row k = (c*KH + kh)*KW + kw), so each
group's slice of rows, of w and of the outputs is a matrix of the stack, no copy."""
from __future__ import annotations

import numpy as np

from kernels import host
from kernels.conv import _geometry
from kernels.host import compiled, fast


def _rows(k, n, dtype):
    """An empty (k, n) matrix whose rows lie 64 bytes further apart than n floats. A batch of 32
    maps of 32x32 is a row of 32,768 floats, a power of two: BLAS then reads a column of such rows
    from addresses that collide in the cache, and one cache line more per row makes the products
    that read it 10-25% faster on ResNet-8's shapes (measured; NumPy hands BLAS the row stride)."""
    return np.empty((k, n + 16), dtype)[:, :n]


def _col(x, g):
    """The column buffer of x as (C*KH*KW, N*P): row (c*KH + kh)*KW + kw, column n*P + oh*OW + ow.
    Each tap copies the part of x it sees and zeroes the padding's share (no padded copy of x,
    up to twice as fast at stride 2)."""
    (sh, sw), (ph, pw) = g.stride, g.padding
    col = _rows(g.c * g.kh * g.kw, g.n * g.p, x.dtype)  # every group's K rows
    # a view: the row stride splits, the rows do not move
    taps = col.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)
    xt = x.transpose(1, 0, 2, 3)
    for a in range(g.kh):
        r0, r1 = _inside(a, sh, ph, g.oh, g.h)
        for b in range(g.kw):
            q0, q1 = _inside(b, sw, pw, g.ow, g.w)
            tap = taps[:, a, b]
            tap[:, :, :r0] = 0.0
            tap[:, :, r1:] = 0.0
            tap[:, :, r0:r1, :q0] = 0.0
            tap[:, :, r0:r1, q1:] = 0.0
            if r0 < r1 and q0 < q1:
                i, j = r0 * sh + a - ph, q0 * sw + b - pw
                tap[:, :, r0:r1, q0:q1] = xt[:, :, i:i + sh * (r1 - r0 - 1) + 1:sh,
                                             j:j + sw * (q1 - q0 - 1) + 1:sw]
    return col


def _inside(a, s, p, out, size):
    """The outputs [o0, o1) whose tap ``a`` (stride s, padding p) falls inside [0, size):
    0 <= o*s + a - p < size."""
    o0 = min(out, max(0, -((a - p) // s)))
    o1 = min(out, (size - 1 - a + p) // s + 1) if size - 1 - a + p >= 0 else 0
    return o0, max(o0, o1)


def _by_channel(a, n, c, p):
    """(N, C, ...) -> (C, N*P), a copy: the layout of the big matrix products."""
    out = _rows(c, n * p, a.dtype)
    out.reshape(c, n, p)[...] = a.reshape(n, c, p).transpose(1, 0, 2)
    return out


@fast("conv2d_forward")
def conv2d_forward(x, w, y, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None, chunk=1):
    g = _geometry(x.shape, w.shape, stride, padding, groups)
    if y.size == 0:
        return
    col = _col(x, g)  # (groups*K, N*P): per group, a (K, N*P) matrix
    out = host.matmul(w.reshape(g.groups, g.cog, g.k), col.reshape(g.groups, g.k, col.shape[1]))
    y.reshape(g.n, g.co, g.p)[...] = out.reshape(g.co, g.n, g.p).transpose(1, 0, 2)


def _transposed(g):
    """Whether backward-data runs as a forward conv of dy (the flipped, transposed filter, padding
    KH-1-ph): stride 1 and a kernel of at most 3x3 and at least as many input as output channels.
    A copy into columns beats col2im's scatter-add there; a 5x5 kernel's columns, or a first
    layer's Cout x 9 rows against its 3 x 9, grow too large to pay (1.6 ms against 4.4 for
    ResNet-8's first conv at batch 32, by col2im)."""
    (sh, sw), (ph, pw) = g.stride, g.padding
    return ((sh, sw) == (1, 1) and ph < g.kh and pw < g.kw and g.kh * g.kw <= 9 and g.c >= g.co
            and g.groups == 1)


def _dy_columns(dy, g):
    """The column buffer of dy for the transposed conv, (Cout*KH*KW, N*H*W), and a copy of dy as
    it was: backward-filter makes both, backward-data uses the columns if dy has not changed since
    (see ``_DY``)."""
    gt = _geometry(dy.shape, (g.c, g.co, g.kh, g.kw), 1, (g.kh - 1 - g.padding[0], g.kw - 1 - g.padding[1]))
    return _col(dy, gt), dy.copy()


# "last": (dy's columns, dy's bits, geometry), left by the last backward-filter for the
# backward-data that follows it, which takes them (and the next backward-filter drops them). One
# slot, for one thread: the host device runs one kernel at a time.
_DY = {}


@fast("conv2d_backward_filter")
def conv2d_backward_filter(x, dy, dw, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None,
                           chunk=1):
    g = _geometry(x.shape, dw.shape, stride, padding, groups)
    _DY.clear()
    if dw.size == 0:
        return
    if g.n == 0:
        dw[...] = 0.0
        return
    if _transposed(g):
        # backward-data will need dy's columns (the transposed conv's), and they give dw too:
        # dw[co, c, KH-1-a, KW-1-b] = sum over (n, i, j) of cols[(co, a, b), (n, i, j)] * x[n, c, i, j]
        cols, seen = _dy_columns(dy, g)
        d = host.matmul(cols, _by_channel(x, g.n, g.c, g.h * g.w).T)  # (Cout*KH*KW, C)
        dw[...] = d.reshape(g.co, g.kh, g.kw, g.c)[:, ::-1, ::-1].transpose(0, 3, 1, 2)
        _DY["last"] = (cols, seen, g)
        return
    # dw^T = col @ dy^T: with the long N*P axis inner to both operands, BLAS runs this product
    # 1.3-1.6 times faster than dy @ col^T, whose second operand it would read transposed
    col, dyc = _col(x, g), _by_channel(dy, g.n, g.co, g.p)
    np_ = col.shape[1]
    dwt = host.matmul(col.reshape(g.groups, g.k, np_),
                      dyc.reshape(g.groups, g.cog, np_).transpose(0, 2, 1))
    dw.reshape(g.groups, g.cog, g.k)[...] = dwt.transpose(0, 2, 1)  # per group (K, Cout/groups), transposed


@fast("conv2d_backward_data")
def conv2d_backward_data(dy, w, dx, *, stride=1, padding=0, groups=1, algo="im2col", workspace=None, chunk=1):
    g = _geometry(dx.shape, w.shape, stride, padding, groups)
    last = _DY.pop("last", None)
    if dx.size == 0:
        return
    (sh, sw), (ph, pw) = g.stride, g.padding
    if _transposed(g):
        # dx is the forward conv of dy with the flipped, transposed filter: a copy into columns
        # and one matrix product, no scatter-add. The columns are backward-filter's when it just
        # made them from the same dy, bit for bit (a layer's backward runs filter, then data)
        cols, seen, g_last = last if last is not None else (None, None, None)
        if g_last != g or not _same_bits(seen, dy):
            cols = _dy_columns(dy, g)[0]
        wt = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3).reshape(g.c, g.co * g.kh * g.kw)
        out = host.matmul(wt, cols)  # (C, N*H*W)
        dx.reshape(g.n, g.c, g.h * g.w)[...] = out.reshape(g.c, g.n, g.h * g.w).transpose(1, 0, 2)
        return
    dyc = _by_channel(dy, g.n, g.co, g.p)
    dcol = host.matmul(w.reshape(g.groups, g.cog, g.k).transpose(0, 2, 1),
                       dyc.reshape(g.groups, g.cog, dyc.shape[1]))  # per group (K, N*P)
    out = dx if dx.flags.c_contiguous and dx.dtype == dcol.dtype else np.empty(dx.shape, dcol.dtype)
    _col2im(dcol.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow), sh, sw, ph, pw, out)  # c = group*C/groups + c
    if out is not dx:
        dx[...] = out


@compiled
def _col2im(dcol, sh, sw, ph, pw, dx):
    """col2im's gather: dx (N, C, H, W) = the taps of dcol (C, KH, KW, N, OH, OW) that fall inside
    the image, each element's in (kh, kw) order onto 0.0, as col2im_ref adds them. Compiled: as
    NumPy, the strided adds of short rows took 1.5-3 times longer (LeNet's conv2: 4.1 ms against
    1.2). (The ``continue`` is deliberate: the same test as an ``if`` block compiled 4-7 times slower.)"""
    c, kh, kw, n, oh, ow = dcol.shape
    h, w = dx.shape[2], dx.shape[3]
    dx[...] = 0.0
    for ni in range(n):
        for ci in range(c):
            out = dx[ni, ci]
            for a in range(kh):
                for b in range(kw):
                    src = dcol[ci, a, b, ni]
                    for r in range(oh):
                        i = r * sh + a - ph
                        if i < 0 or i >= h:
                            continue
                        orow = out[i]
                        srow = src[r]
                        for q in range(ow):
                            j = q * sw + b - pw
                            if 0 <= j < w:
                                orow[j] += srow[q]


def _same_bits(a, b):
    """Whether two float arrays hold the same bits (NaN payloads and the sign of zero included)."""
    if a is None or a.shape != b.shape or a.dtype != b.dtype:
        return False
    bits = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(a.view(bits), b.view(bits)))
