"""Fast NumPy kernels for the host device: the same ops as the references, written for speed.

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
  in (kh, kw) order; the buffers' rows are one cache line longer than their width (:func:`_rows`).
  The results agree with the references within the conv tolerance (rtol 1e-4, atol 1e-5): a BLAS
  sums in its own order, so the bits can differ from the reference's. With stride 1 and a kernel of at
  most 3x3 and at least as many input as output channels, backward-data is instead the forward
  conv of dy with the flipped, transposed filter (a copy into columns beats col2im's scatter-add;
  a 5x5 kernel's columns, or a first layer's Cout x 9 rows against its 3 x 9, grow too large to pay).
  Measured, not guessed: each choice here was timed against the other on ResNet-8's and LeNet's
  shapes (a GEMM whose long axis is inner to both operands runs 1.3-1.6 times faster).
- Batch normalization folds gamma * invstd into one scale and takes its sums over contiguous rows.
- Max pooling forward is ``np.maximum`` over the KH*KW strided views of the input (one pass per
  window offset, no window view); its backward finds each window's first maximum the same way and
  adds the gradients window offset by window offset, in the order that gives each input element
  its windows in (oh, ow) ascending order, from 0.0: the reference's sum, bit for bit. A window
  that holds a NaN takes the reference's own path (a diverged step; rare and not worth a copy).
- ReLU uses ``np.maximum``, its gradient a bit mask (``_keep``) instead of ``np.where``.

Every function takes the reference's arguments (chunk, algo and workspace are accepted and
ignored: on the host they never change the result) and writes into the given outputs; NumPy's own
temporaries are host memory the memory accounting does not model, as with the references.
Deterministic: the same inputs give the same bits whatever the MemoryConfig, so training on the
host stays bit-identical across every flag combination. (As with the references' own products,
the bits can change with the number of BLAS threads, which may split a product differently; the
tests run with one.) This module never imports snlite.
"""
from __future__ import annotations

import numpy as np

from kernels.batchnorm import save_statistics
from kernels.conv import _geometry
from kernels.pooling import _params

FAST: dict = {}  # op name -> fast host function
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


def _col(x, g):
    """The column buffer of x as (K, N*P): row k = (c*KH + kh)*KW + kw, column n*P + oh*OW + ow."""
    (sh, sw), (ph, pw) = g.stride, g.padding
    xt = _padded(x, ph, pw).transpose(1, 0, 2, 3)  # (C, N, H', W'): a view
    col = _rows(g.k, g.n * g.p, x.dtype)
    taps = col.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)  # a view: the row stride splits, the rows do not move
    for a in range(g.kh):
        for b in range(g.kw):
            taps[:, a, b] = xt[:, :, a:a + sh * (g.oh - 1) + 1:sh, b:b + sw * (g.ow - 1) + 1:sw]
    return col


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


@fast("conv2d_backward_filter")
def conv2d_backward_filter(x, dy, dw, *, stride=1, padding=0, algo="im2col", workspace=None, chunk=1):
    g = _geometry(x.shape, dw.shape, stride, padding)
    if dw.size == 0:
        return
    if g.n == 0:
        dw[...] = 0.0
        return
    # dw^T = col @ dy^T: with the long N*P axis inner to both operands, BLAS runs this product
    # 1.3-1.6 times faster than dy @ col^T, whose second operand it would read transposed
    dwt = matmul(_col(x, g), _by_channel(dy, g.n, g.co, g.p).T)  # (K, Cout)
    dw.reshape(g.co, g.k)[...] = dwt.T


@fast("conv2d_backward_data")
def conv2d_backward_data(dy, w, dx, *, stride=1, padding=0, algo="im2col", workspace=None, chunk=1):
    g = _geometry(dx.shape, w.shape, stride, padding)
    if dx.size == 0:
        return
    (sh, sw), (ph, pw) = g.stride, g.padding
    if (sh, sw) == (1, 1) and ph < g.kh and pw < g.kw and g.kh * g.kw <= 9 and g.c >= g.co:
        # stride 1: dx is the forward conv of dy with the flipped, transposed filter, padded by
        # KH-1-ph: a copy into columns and one matrix product, no scatter-add (a 5x5 kernel's
        # columns grow too large to pay). With fewer input than output channels, as a first
        # layer's 3 against 16, col2im below moves less: its columns are C*KH*KW rows, the
        # flipped conv's Cout*KH*KW (1.6 ms against 4.4 for ResNet-8's first conv at batch 32).
        wt = np.ascontiguousarray(w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        conv2d_forward(dy, wt, dx, padding=(g.kh - 1 - ph, g.kw - 1 - pw))
        return
    dcol = matmul(w.reshape(g.co, g.k).T, _by_channel(dy, g.n, g.co, g.p))  # (K, N*P)
    dcol = dcol.reshape(g.c, g.kh, g.kw, g.n, g.oh, g.ow)
    # col2im's gather: each tap in (kh, kw) order adds onto 0.0, as col2im_ref does; channel-major,
    # as the columns are, so each add reads them in order
    dxp = np.zeros((g.c, g.n, g.h + 2 * ph, g.w + 2 * pw), dx.dtype)
    for a in range(g.kh):
        for b in range(g.kw):
            dxp[:, :, a:a + sh * (g.oh - 1) + 1:sh, b:b + sw * (g.ow - 1) + 1:sw] += dcol[:, a, b]
    dx[...] = dxp[:, :, ph:ph + g.h, pw:pw + g.w].transpose(1, 0, 2, 3)


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
    (oh, ow) ascending order from 0.0, which is window offsets in DESCENDING (kh, kw) order."""
    if np.isnan(y).any():  # a NaN window's gradient goes to its last NaN: the reference knows how
        from kernels.pooling import maxpool2d_backward_ref
        maxpool2d_backward_ref(x, y, dy, dx, kernel=kernel, stride=stride, padding=padding)
        return
    kh, kw, sh, sw, ph, pw = _params(kernel, stride, padding)
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    # padded positions hold NaN, which equals nothing, so only real positions can be a window's maximum
    xp = _padded(x, ph, pw, fill=np.nan)
    unfound = np.ones(y.shape, bool)  # windows whose maximum is not found yet
    hit = np.empty(y.shape, bool)
    grads = []  # per window offset, in (kh, kw) order: dy where that offset is the window's first maximum, else 0
    for i, rows, cols in _offsets(kh, kw, sh, sw, oh, ow):
        np.equal(xp[:, :, rows, cols], y, out=hit)
        hit &= unfound
        unfound ^= hit
        grads.append(_keep(dy, hit))
    grad = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dx.dtype)
    for (i, rows, cols), g in reversed(list(zip(_offsets(kh, kw, sh, sw, oh, ow), grads))):
        grad[:, :, rows, cols] += g
    dx[...] = grad[:, :, ph:ph + h, pw:pw + w]


# ---------------------------------------------------------------- batch normalization
def _sum_nc(a3):
    """Per-channel sums of an (N, C, S) array: over S (contiguous, pairwise), then over N."""
    return a3.sum(axis=2).sum(axis=0)


@fast("batchnorm_forward_train")
def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, *,
                            momentum=0.1, eps=1e-5, update_running=True):
    """The reference's statistics and update, in fewer passes: gamma * invstd folded into one scale."""
    t = x.dtype.type
    n_, c = x.shape[:2]
    n = x.size // c if c else 0
    if n < 2:
        raise ValueError(f"batchnorm_forward_train: expected more than 1 value per channel, got {n}")
    x3, y3 = x.reshape(n_, c, -1), y.reshape(n_, c, -1)
    mean = _sum_nc(x3) / t(n)
    np.subtract(x3, mean[:, None], out=y3)  # x - mean, in y's buffer: no temporary
    m2 = np.einsum("ncs,ncs->c", y3, y3)
    invstd = t(1) / np.sqrt(m2 / t(n) + t(eps))
    y3 *= (invstd * gamma)[:, None]
    y3 += beta[:, None]
    save_statistics(mean, m2, invstd, n, save_mean, save_invstd, running_mean, running_var, momentum, update_running)


@fast("batchnorm_backward")
def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta):
    """dx = gamma * invstd / n * (n * dy - dbeta - xhat * dgamma), as (a * dy - b * xhat) - c per channel."""
    t = x.dtype.type
    n_, c = x.shape[:2]
    n = x.size // c
    x3, dy3, dx3 = x.reshape(n_, c, -1), dy.reshape(n_, c, -1), dx.reshape(n_, c, -1)
    d = np.subtract(x3, save_mean[:, None])  # x - mean; xhat = d * invstd, never formed
    db = _sum_nc(dy3)
    dg = np.einsum("ncs,ncs->c", dy3, d) * save_invstd
    scale = gamma * save_invstd / t(n)
    d *= (scale * dg * save_invstd)[:, None]  # xhat * dgamma * scale
    np.multiply(dy3, (scale * t(n))[:, None], out=dx3)  # dx may alias dy: both sums are taken
    dx3 -= d
    dx3 -= (scale * db)[:, None]
    dgamma[...] = dg
    dbeta[...] = db


# ---------------------------------------------------------------- ReLU
@fast("relu_forward")
def relu_forward(x, y):
    np.maximum(x, x.dtype.type(0), out=y)  # NaN propagates; x <= 0 (-0.0 too) gives +0.0, as the reference


@fast("relu_backward")
def relu_backward(x, y, dy, dx):
    """dx = dy where x is not <= 0 (x > 0 or NaN); dx may alias dy or x."""
    _keep(dy, ~(x <= 0), out=dx)


def _keep(a, keep, out=None):
    """``a`` where ``keep``, else +0.0, bit for bit as ``np.where(keep, a, 0)`` (a masked copy is
    ten times slower than this: the float bits ANDed with an all-ones or all-zeros mask)."""
    mask = np.multiply(keep, np.uint32(0xFFFFFFFF), dtype=np.uint32)
    out = np.empty(a.shape, a.dtype) if out is None else out
    np.bitwise_and(a.view(np.uint32), mask, out=out.view(np.uint32))
    return out
