"""Fast kernels for the host device: the same ops as the references, written for speed (NumPy, BLAS, and a few loops compiled by Numba).

The references (``op_ref`` in each family) are written to be read: they say what an op computes,
and the tests compare every CUDA kernel with them. They are not written to be fast, and the host
device, which is how most users train on a laptop, paid for it: a conv's weight gradient through
``np.einsum`` (which does not use BLAS), max pooling as a window view reduced with ``.max``, its
gradient through ``np.add.at``. This module holds faster versions of the ops where the time goes;
the host device runs ``host_kernel(op)``, the fast version where there is one, else the reference.

How they are fast, and what they keep:
- Convolution, all three directions, is im2col plus ONE BLAS matrix product over the whole batch:
  the column buffer is laid out (K, N*P) (K = C*KH*KW, P = OH*OW), so forward is ``w (Cout x K) @
  col``, backward-filter ``(col @ dy^T)^T`` for dy as (Cout x N*P) (the sum over images and
  positions inside the BLAS reduction) and backward-data ``w^T @ dy`` followed by col2im's gather
  in (kh, kw) order (compiled, :func:`_col2im`). The columns are copied tap by tap from x, the
  padding's share zeroed (no padded copy of x), into rows one cache line longer than their width
  (:func:`_rows`). The results agree with the references within the conv tolerance (rtol 1e-4,
  atol 1e-5): a BLAS sums in its own order, so the bits can differ from the reference's.
- With stride 1 and a kernel of at most 3x3 and at least as many input as output channels
  (:func:`_transposed`), backward-data is instead the forward conv of dy with the flipped,
  transposed filter, and backward-filter, which runs first, computes dw from those same columns
  of dy and leaves them for it: one column buffer for the layer's backward instead of two. They
  are used only for a dy with the same bits (``_DY``); otherwise backward-data makes its own.
- Batch normalization, max pooling's gradient and ReLU's gradient are loops compiled by Numba for
  the CPU (``njit``, cached on disk beside this file), where NumPy needs a pass over the tensor
  per expression: batch norm takes a channel at a time, so its rows stay in the cache between
  the sums and the elementwise formula (one read of x forward where NumPy made five); its row
  sums let the compiler split them over vector lanes (``fastmath={"reassoc"}``, nothing else).
- Max pooling forward is ``np.maximum`` over the KH*KW strided views of the input; its gradient
  goes, window by window in (oh, ow) order, to the window's first maximum in (kh, kw) order, added
  onto 0.0: the reference's sum, bit for bit. A window that holds a NaN takes the reference's own
  path (a diverged step; rare and not worth a copy).
- ReLU uses ``np.maximum``; its gradient is dy's bits ANDed with a mask, bit for bit ``np.where``.
- Measured, not guessed: each choice here was timed against the other on ResNet-8's and LeNet's
  shapes, interleaved (``python -m snlite.bench host --breakdown`` shows where a step goes).

Every function takes the reference's arguments (chunk, algo and workspace are accepted and
ignored: on the host they never change the result) and writes into the given outputs; NumPy's own
temporaries are host memory the memory accounting does not model, as with the references.
Deterministic: the same inputs give the same bits whatever the MemoryConfig, so training on the
host stays bit-identical across every flag combination. (As with the references' own products,
the bits can change with the number of BLAS threads, which may split a product differently, and
the compiled sums with the CPU's vector width; the tests run with one thread, on one machine.)
This module never imports snlite.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from kernels.batchnorm import batchnorm_backward_ref, batchnorm_forward_train_ref, save_statistics
from kernels.conv import _geometry
from kernels.pooling import (_avg_divisors, _params, avgpool2d_backward_ref, avgpool2d_forward_ref,
                             maxpool2d_backward_ref)

FAST: dict = {}  # op name -> fast host function
# The loops compiled for the CPU: cached on disk beside this file (compiling them all takes about
# 2.5 s, once per machine), with NumPy's rules for a division by zero (inf or NaN, no exception)
compiled = functools.partial(njit, cache=True, error_model="numpy")
matmul = np.matmul  # every BLAS product here goes through this name, so a profiler can time them


def fast(name):
    """Register the decorated function as the host version of op ``name``."""
    def register(fn):
        FAST[name] = fn
        return fn
    return register


def host_kernel(op):
    """What the host device runs for ``op`` (a :class:`kernels.Op`): its fast version, else its reference."""
    return FAST.get(op.name, op.reference)


# ---------------------------------------------------------------- convolution
def _padded(x, ph, pw, fill=0.0):
    """x with ph rows and pw columns of ``fill`` on each side (x itself when there is no padding)."""
    if not (ph or pw):
        return x
    n, c, h, w = x.shape
    xp = np.empty((n, c, h + 2 * ph, w + 2 * pw), x.dtype)
    if ph:
        xp[:, :, :ph] = fill
        xp[:, :, ph + h:] = fill
    if pw:
        xp[:, :, ph:ph + h, :pw] = fill
        xp[:, :, ph:ph + h, pw + w:] = fill
    xp[:, :, ph:ph + h, pw:pw + w] = x
    return xp


def _rows(k, n, dtype):
    """An empty (k, n) matrix whose rows lie 64 bytes further apart than n floats. A batch of 32
    maps of 32x32 is a row of 32,768 floats, a power of two: BLAS then reads a column of such rows
    from addresses that collide in the cache, and one cache line more per row makes the products
    that read it 10-25% faster on ResNet-8's shapes (measured; NumPy hands BLAS the row stride)."""
    return np.empty((k, n + 16), dtype)[:, :n]


def _col(x, g, xp=None):
    """The column buffer of x as (K, N*P): row k = (c*KH + kh)*KW + kw, column n*P + oh*OW + ow.
    Each tap copies the part of x it sees and zeroes the padding's share (no padded copy of x,
    up to twice as fast at stride 2), or copies from ``xp``, x already padded."""
    (sh, sw), (ph, pw) = g.stride, g.padding
    col = _rows(g.k, g.n * g.p, x.dtype)
    taps = col.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)  # a view: the row stride splits, the rows do not move
    if xp is not None:
        xt = xp.transpose(1, 0, 2, 3)  # (C, N, H', W'): a view
        for a in range(g.kh):
            for b in range(g.kw):
                taps[:, a, b] = xt[:, :, a:a + sh * (g.oh - 1) + 1:sh, b:b + sw * (g.ow - 1) + 1:sw]
        return col
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
                tap[:, :, r0:r1, q0:q1] = xt[:, :, i:i + sh * (r1 - r0 - 1) + 1:sh, j:j + sw * (q1 - q0 - 1) + 1:sw]
    return col


def _inside(a, s, p, out, size):
    """The outputs [o0, o1) whose tap ``a`` (stride s, padding p) falls inside [0, size): 0 <= o*s + a - p < size."""
    o0 = min(out, max(0, -((a - p) // s)))
    o1 = min(out, (size - 1 - a + p) // s + 1) if size - 1 - a + p >= 0 else 0
    return o0, max(o0, o1)


def _by_channel(a, n, c, p):
    """(N, C, ...) -> (C, N*P), a copy: the layout of the big matrix products."""
    out = _rows(c, n * p, a.dtype)
    out.reshape(c, n, p)[...] = a.reshape(n, c, p).transpose(1, 0, 2)
    return out


@fast("conv2d_forward")
def conv2d_forward(x, w, y, *, stride=1, padding=0, algo="im2col", workspace=None, chunk=1):
    g = _geometry(x.shape, w.shape, stride, padding)
    if y.size == 0:
        return
    out = matmul(w.reshape(g.co, g.k), _col(x, g))  # (Cout, N*P)
    y.reshape(g.n, g.co, g.p)[...] = out.reshape(g.co, g.n, g.p).transpose(1, 0, 2)


def _transposed(g):
    """Whether backward-data runs as a forward conv of dy (the flipped, transposed filter, padding
    KH-1-ph): stride 1 and a kernel of at most 3x3 and at least as many input as output channels.
    A copy into columns beats col2im's scatter-add there; a 5x5 kernel's columns, or a first
    layer's Cout x 9 rows against its 3 x 9, grow too large to pay (1.6 ms against 4.4 for
    ResNet-8's first conv at batch 32, by col2im)."""
    (sh, sw), (ph, pw) = g.stride, g.padding
    return (sh, sw) == (1, 1) and ph < g.kh and pw < g.kw and g.kh * g.kw <= 9 and g.c >= g.co


def _dy_columns(dy, g):
    """The column buffer of dy for the transposed conv, (Cout*KH*KW, N*H*W), and a copy of dy's bits
    as they were (the padded copy's interior): backward-filter makes both, backward-data uses the
    columns if dy has not changed since (see ``_DY``)."""
    ph, pw = g.kh - 1 - g.padding[0], g.kw - 1 - g.padding[1]
    gt = _geometry(dy.shape, (g.c, g.co, g.kh, g.kw), 1, (ph, pw))
    dyp = _padded(dy, ph, pw) if (ph or pw) else dy.copy()
    return _col(dy, gt, dyp), dyp[:, :, ph:ph + g.oh, pw:pw + g.ow]


# "last": (dy's columns, dy's bits, geometry), left by the last backward-filter for the
# backward-data that follows it, which takes them (and the next backward-filter drops them). One
# slot, for one thread: the host device runs one kernel at a time.
_DY = {}


@fast("conv2d_backward_filter")
def conv2d_backward_filter(x, dy, dw, *, stride=1, padding=0, algo="im2col", workspace=None, chunk=1):
    g = _geometry(x.shape, dw.shape, stride, padding)
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
        d = matmul(cols, _by_channel(x, g.n, g.c, g.h * g.w).T)  # (Cout*KH*KW, C)
        dw[...] = d.reshape(g.co, g.kh, g.kw, g.c)[:, ::-1, ::-1].transpose(0, 3, 1, 2)
        _DY["last"] = (cols, seen, g)
        return
    # dw^T = col @ dy^T: with the long N*P axis inner to both operands, BLAS runs this product
    # 1.3-1.6 times faster than dy @ col^T, whose second operand it would read transposed
    dwt = matmul(_col(x, g), _by_channel(dy, g.n, g.co, g.p).T)  # (K, Cout)
    dw.reshape(g.co, g.k)[...] = dwt.T


@fast("conv2d_backward_data")
def conv2d_backward_data(dy, w, dx, *, stride=1, padding=0, algo="im2col", workspace=None, chunk=1):
    g = _geometry(dx.shape, w.shape, stride, padding)
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
        out = matmul(wt, cols)  # (C, N*H*W)
        dx.reshape(g.n, g.c, g.h * g.w)[...] = out.reshape(g.c, g.n, g.h * g.w).transpose(1, 0, 2)
        return
    dcol = matmul(w.reshape(g.co, g.k).T, _by_channel(dy, g.n, g.co, g.p))  # (K, N*P)
    out = dx if dx.flags.c_contiguous and dx.dtype == dcol.dtype else np.empty(dx.shape, dcol.dtype)
    _col2im(dcol.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow), sh, sw, ph, pw, out)
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


# ---------------------------------------------------------------- max pooling
def _offsets(kh, kw, sh, sw, oh, ow):
    """(index in (kh, kw) order, the slice of rows, the slice of columns) of each window offset."""
    for a in range(kh):
        for b in range(kw):
            yield a * kw + b, slice(a, a + sh * (oh - 1) + 1, sh), slice(b, b + sw * (ow - 1) + 1, sw)


@fast("maxpool2d_forward")
def maxpool2d_forward(x, y, *, kernel, stride=None, padding=0):
    kh, kw, sh, sw, ph, pw = _params(kernel, stride, padding)
    xp = _padded(x, ph, pw, fill=-np.inf)
    for i, rows, cols in _offsets(kh, kw, sh, sw, *y.shape[2:]):
        if i == 0:
            y[...] = xp[:, :, rows, cols]
        else:
            np.maximum(y, xp[:, :, rows, cols], out=y)  # propagates NaN, as .max does


@fast("maxpool2d_backward")
def maxpool2d_backward(x, y, dy, dx, *, kernel, stride=None, padding=0):
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
def avgpool2d_forward(x, y, *, kernel, stride=None, padding=0, count_include_pad=True):
    """The reference's bits: each window's sum in (kh, kw) order from 0.0, divided by its divisor."""
    hp = dict(kernel=kernel, stride=stride, padding=padding, count_include_pad=count_include_pad)
    if not _compiled_takes(x, y):
        return avgpool2d_forward_ref(x, y, **hp)
    p, div = _avg_params(x.shape, y.shape, **hp)
    _avg_pool(x, *p, div, y)


@fast("avgpool2d_backward")
def avgpool2d_backward(dy, dx, *, kernel, stride=None, padding=0, count_include_pad=True):
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


# ---------------------------------------------------------------- batch normalization
# Batch norm is memory-bound, and a training step's tensors are no longer in the cache when their
# layer runs: NumPy's version made 5 passes over x forward and 9 backward. These loops, compiled by
# Numba for the CPU (``njit``, cached on disk), take one channel at a time: its N rows (128 KB for
# a batch of 32 maps of 32x32) are read from memory once and stay in the cache for the passes that
# follow, the sums and then the elementwise formula.


@compiled(fastmath={"reassoc"})
def _row_sums(ra, ma, rb, mb):
    """The sum of (ra - ma) and the sum of (ra - ma) * (rb - mb) over one contiguous row, float32.
    ``reassoc`` lets the compiler split each sum over its vector lanes (four times faster than one
    running sum): the order is then the compiled code's, the same on every run on a machine (a
    CPU with other vector widths may round differently, as a BLAS may)."""
    s, d = np.float32(0), np.float32(0)
    for j in range(ra.size):
        v = ra[j] - ma
        s += v
        d += v * (rb[j] - mb)
    return s, d


@compiled
def _centred_sums(a3, ma, b3, mb, ci):
    """Over channel ci of two (N, C, S) arrays: the sum of (a - ma) and the sum of (a - ma) * (b - mb),
    each row's float32 sums folded into float64 in row order."""
    total_sum, total_dot = 0.0, 0.0
    for ni in range(a3.shape[0]):
        s, d = _row_sums(a3[ni, ci], ma, b3[ni, ci], mb)  # contiguous rows: the loop vectorizes
        total_sum += s
        total_dot += d
    return total_sum, total_dot


@compiled
def _bn_forward(x3, gamma, beta, eps, y3, mean, m2, invstd):
    """Per channel c: its mean, its centred sum of squares m2, invstd = 1 / sqrt(m2 / n + eps), all
    float32 as the reference computes them, then y = (x - mean) * (invstd * gamma) + beta."""
    n_, c, s = x3.shape
    n = np.float32(n_ * s)
    zero = np.float32(0)
    for ci in range(c):
        mean[ci] = np.float32(_centred_sums(x3, zero, x3, zero, ci)[0]) / n
        m2[ci] = np.float32(_centred_sums(x3, mean[ci], x3, mean[ci], ci)[1])
        invstd[ci] = np.float32(1) / np.sqrt(m2[ci] / n + eps)
        m, a, b = mean[ci], invstd[ci] * gamma[ci], beta[ci]
        for ni in range(n_):
            rx, ry = x3[ni, ci], y3[ni, ci]
            for j in range(s):
                ry[j] = (rx[j] - m) * a + b


@compiled
def _bn_backward(x3, dy3, gamma, mean, invstd, dx3, dgamma, dbeta):
    """Per channel c: dbeta = sum dy, dgamma = sum dy * (x - mean) * invstd, then
    dx = (a * dy - b * (x - mean)) - d with a = gamma * invstd, b = a * dgamma * invstd / n and
    d = a * dbeta / n: the reference's gamma * invstd / n * (n * dy - dbeta - xhat * dgamma)."""
    n_, c, s = x3.shape
    n = np.float32(n_ * s)
    for ci in range(c):
        db, dot = _centred_sums(dy3, np.float32(0), x3, mean[ci], ci)
        dbeta[ci] = np.float32(db)
        dgamma[ci] = np.float32(dot) * invstd[ci]
        scale = gamma[ci] * invstd[ci] / n
        m, a, b, d = mean[ci], scale * n, scale * dgamma[ci] * invstd[ci], scale * dbeta[ci]
        for ni in range(n_):
            rd, rx, ro = dy3[ni, ci], x3[ni, ci], dx3[ni, ci]
            for j in range(s):
                ro[j] = (a * rd[j] - b * (rx[j] - m)) - d


def _compiled_takes(*arrays):
    """Whether the compiled loops take these arrays: C-contiguous float32 (else the reference does)."""
    return all(a.flags.c_contiguous and a.dtype == np.float32 for a in arrays)


@fast("batchnorm_forward_train")
def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, *,
                            momentum=0.1, eps=1e-5, update_running=True):
    """The reference's statistics and update, a channel at a time (:func:`_bn_forward`)."""
    c = x.shape[1] if x.ndim > 1 else 0
    n = x.size // c if c else 0
    if n < 2:
        raise ValueError(f"batchnorm_forward_train: expected more than 1 value per channel, got {n}")
    if not _compiled_takes(x, y, gamma, beta):
        return batchnorm_forward_train_ref(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd,
                                           momentum=momentum, eps=eps, update_running=update_running)
    mean, m2, invstd = (np.empty(c, x.dtype) for _ in range(3))
    _bn_forward(x.reshape(x.shape[0], c, -1), gamma, beta, np.float32(eps), y.reshape(x.shape[0], c, -1),
                mean, m2, invstd)
    save_statistics(mean, m2, invstd, n, save_mean, save_invstd, running_mean, running_var, momentum, update_running)


@fast("batchnorm_backward")
def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta):
    """The reference's gradient, a channel at a time (:func:`_bn_backward`); dx may be dy."""
    if not _compiled_takes(x, dy, dx, gamma, save_mean, save_invstd):
        return batchnorm_backward_ref(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta)
    n_, c = x.shape[:2]
    db, dg = np.empty(c, x.dtype), np.empty(c, x.dtype)
    _bn_backward(x.reshape(n_, c, -1), dy.reshape(n_, c, -1), gamma, save_mean, save_invstd,
                 dx.reshape(n_, c, -1), dg, db)  # all of a channel's sums are taken before its dx is written
    dgamma[...] = dg
    dbeta[...] = db


# ---------------------------------------------------------------- ReLU
@fast("relu_forward")
def relu_forward(x, y):
    np.maximum(x, x.dtype.type(0), out=y)  # NaN propagates; x <= 0 (-0.0 too) gives +0.0, as the reference


@fast("relu_backward")
def relu_backward(x, y, dy, dx):
    """dx = dy where x is not <= 0 (x > 0 or NaN); dx may alias dy or x."""
    if not (x.flags.c_contiguous and dy.flags.c_contiguous and dx.flags.c_contiguous and dy.dtype == np.float32):
        _keep(dy, ~(x <= 0), out=dx)
    elif _same_memory(dx, dy):  # in place, as the executor runs it: one array to write
        _relu_grad_in_place(x.reshape(-1), dx.reshape(-1).view(np.uint32))
    elif np.shares_memory(dx, x) or np.shares_memory(dx, dy):
        _keep(dy, ~(x <= 0), out=dx)
    else:
        _relu_grad(x.reshape(-1), dy.reshape(-1).view(np.uint32), dx.reshape(-1).view(np.uint32))


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
    ten times slower than this: the float bits ANDed with an all-ones or all-zeros mask)."""
    mask = np.multiply(keep, np.uint32(0xFFFFFFFF), dtype=np.uint32)
    out = np.empty(a.shape, a.dtype) if out is None else out
    np.bitwise_and(a.view(np.uint32), mask, out=out.view(np.uint32))
    return out
