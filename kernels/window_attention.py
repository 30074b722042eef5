"""Shifted-window multi-head attention, fused: the core of torchvision's ``shifted_window_attention``
(Swin Transformer V1) after its qkv projection and before its output projection, for maps whose sides
the window divides (no padding) and attention_dropout 0. Forward and backward; the forward saves only
each query's log-sum-exp, and the backward recomputes the attention weights from it.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.window_attention

Layout: snlite keeps PyTorch's channels-last (N, H, W, C) Swin map as an NCHW array (N, C, H, W).
``qkv`` (N, 3C, H, W) holds ``F.linear(x, qkv_weight, qkv_bias)`` packed as torchvision packs it:
channel part*C + head*dh + e (part 0 q, 1 k, 2 v; dh = C / heads); ``y`` is (N, C, H, W) with head h
in channels [h*dh, (h+1)*dh). ``table`` is the relative_position_bias_table, ((2wh-1)*(2ww-1), heads),
element [index, head]. window = (wh, ww) divides (H, W); shift = (sh, sw) with 0 <= sh < wh and
0 <= sw < ww, and 0 where the window covers the whole side (torchvision zeroes it there).

Geometry (torchvision's roll by (-sh, -sw), window partition, and the roll back): the original pixel
(h, w) sits at the rolled position (r, c) = ((h - sh) mod H, (w - sw) mod W), in window
(r // wh, c // ww) as token a*ww + b, (a, b) = (r % wh, c % ww). Its keys are the wh*ww tokens of that
window in token order. With scale = float32(dh ** -0.5)::

    s_ij = sum_e (q_i[e] * scale) * k_j[e] + table[(a_i - a_j + wh - 1) * (2ww - 1) + b_i - b_j + ww - 1, h]
           (- 100 when shifted, sh + sw > 0, and i and j lie in different regions)
    y_i = sum_j softmax_j(s_ij) v_j (max subtracted),   lse_i = m_i + log(l_i)

y_i is written at i's ORIGINAL pixel. A rolled position's region is 3 * band(r, H, wh, sh) +
band(c, W, ww, sw), band(r) = 0 if r < H - wh, 1 if r < H - sh, else 2 (torchvision's h_slices and
w_slices labels; a window lies in one band of a side whose shift is 0). lse has N*heads*H*W values
laid out (N, heads, H, W) (any shape of that size is accepted).

- window_attention_forward(qkv, table, y, lse, *, heads, window, shift)
- window_attention_backward(qkv, table, y, dy, lse, dqkv, dtable, *, heads, window, shift): with
  p_ij = exp(s_ij - lse_i), D_i = sum_e dy_i[e] y_i[e], dp_ij = sum_e dy_i[e] v_j[e] and
  ds_ij = p_ij (dp_ij - D_i)::

      dq_i = scale * sum_j ds_ij k_j,  dk_j = scale * sum_i ds_ij q_i,  dv_j = sum_i p_ij dy_i,
      dtable[index, h] = sum of ds_ij over every (n, window, i, j) at that relative index

Canonical orders, float32 from 0.0, no atomics (every result is bit-reproducible): each dot product
over e ascending; the forward's one thread per (n, h, pixel i) takes the max over its keys in token
order, then adds l_i and y's numerators (straight into y, divided by l_i last). The backward's dq
kernel, one thread per (n, h, pixel i), adds over j in token order; its dk/dv kernel, one thread per
(n, h, pixel j), over the queries i of j's window in token order; its dtable kernel, one thread per
(index, h), over n ascending, then over the rolled positions of i row by row, taking for each the one
key at that offset if it lies in i's window. y must NOT alias qkv; dqkv and dtable must NOT alias any
input. One version (v1).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Launch, Op, ceil_div, check, check_apart, check_version, contiguous, cuda_kernel
from kernels.attention import _heads, _row_delta, _weight_grad  # D_i and ds_ij, as there
from kernels.layernorm import _elements, _nchw

BLOCK = 128  # threads per block
VERSIONS = ("v1",)


# ---------------------------------------------------------------- NumPy references
def _windows(a, window, shift):
    """(N, K, H, W) rolled by (-sh, -sw) and cut into windows: (N, nWin, K, wh*ww), tokens row by row."""
    (wh, ww), (sh, sw) = window, shift
    n, k, h, w = a.shape
    a = np.roll(a, (-sh, -sw), axis=(2, 3)).reshape(n, k, h // wh, wh, w // ww, ww)
    return a.transpose(0, 2, 4, 1, 3, 5).reshape(n, (h // wh) * (w // ww), k, wh * ww)


def _unwindows(a, shape, window, shift):
    """The inverse of :func:`_windows`: (N, nWin, K, T) back to (N, K, H, W), rolled back by (sh, sw)."""
    (wh, ww), (sh, sw) = window, shift
    n, k, h, w = shape
    a = a.reshape(n, h // wh, w // ww, k, wh, ww).transpose(0, 3, 1, 4, 2, 5).reshape(shape)
    return np.roll(a, (sh, sw), axis=(2, 3))


def relative_index(window):
    """(T, T) int64: the table row of each (query token i, key token j) pair of a window."""
    wh, ww = window
    a, b = np.divmod(np.arange(wh * ww), ww)
    return (a[:, None] - a[None, :] + wh - 1) * (2 * ww - 1) + (b[:, None] - b[None, :] + ww - 1)


def _bands(r, n, win, s):
    return np.where(r < n - win, 0, np.where(r < n - s, 1, 2))


def _mask(hw, window, shift, dtype):
    """(nWin, 1, T, T): -100 between tokens of different regions, 0 within one (torchvision's attn_mask)."""
    (h, w), (wh, ww), (sh, sw) = hw, window, shift
    region = 3 * _bands(np.arange(h), h, wh, sh)[:, None] + _bands(np.arange(w), w, ww, sw)[None, :]
    region = _windows(region[None, None], window, (0, 0))[0, :, 0]  # already in rolled coordinates
    return np.where(region[:, :, None] != region[:, None, :], -100.0, 0.0).astype(dtype)[:, None]


def _logits(qkv, table, heads, window, shift):
    """(q, k, v) as (N, nWin, heads, dh, T), scale and s (N, nWin, heads, T, T)."""
    n, c3 = qkv.shape[:2]
    dh = c3 // 3 // heads
    parts = _windows(qkv, window, shift)
    parts = parts.reshape(n, parts.shape[1], 3, heads, dh, -1)
    q, k, v = parts[:, :, 0], parts[:, :, 1], parts[:, :, 2]
    scale = qkv.dtype.type(dh ** -0.5)
    s = np.einsum("nwhei,nwhej->nwhij", q * scale, k)
    s = s + table[relative_index(window)].transpose(2, 0, 1)
    if sum(shift) > 0:
        s = s + _mask(qkv.shape[2:], window, shift, qkv.dtype)
    return q, k, v, scale, s


def window_attention_forward_ref(qkv, table, y, lse, *, heads, window, shift):
    window, shift = tuple(window), tuple(shift)
    _, _, v, _, s = _logits(qkv, table, heads, window, shift)
    m = s.max(axis=-1, keepdims=True)  # NaN-propagating, as the kernel's max
    p = np.exp(s - m)
    l = p.sum(axis=-1, dtype=qkv.dtype)
    out = np.einsum("nwhij,nwhej->nwhei", p, v) / l[:, :, :, None, :]
    n, _, h, w = qkv.shape
    y[...] = _unwindows(out.reshape(n, out.shape[1], -1, out.shape[-1]), y.shape, window, shift)
    lse[...] = _unwindows(m[..., 0] + np.log(l), (n, heads, h, w), window, shift).reshape(lse.shape)


def window_attention_backward_ref(qkv, table, y, dy, lse, dqkv, dtable, *, heads, window, shift):
    window, shift = tuple(window), tuple(shift)
    q, k, v, scale, s = _logits(qkv, table, heads, window, shift)
    n, _, h, w = qkv.shape
    yw, dyw = (_windows(a, window, shift).reshape(q.shape) for a in (y, dy))
    lsew = _windows(lse.reshape(n, heads, h, w), window, shift)  # (N, nWin, heads, T)
    p = np.exp(s - lsew[..., None])
    big_d = np.sum(dyw * yw, axis=3, dtype=qkv.dtype)  # D_i, (N, nWin, heads, T)
    ds = p * (np.einsum("nwhei,nwhej->nwhij", dyw, v) - big_d[..., None])
    dq = scale * np.einsum("nwhij,nwhej->nwhei", ds, k)
    dk = scale * np.einsum("nwhij,nwhei->nwhej", ds, q)
    dv = np.einsum("nwhij,nwhei->nwhej", p, dyw)
    grads = np.stack([dq, dk, dv], axis=2)  # (N, nWin, 3, heads, dh, T)
    dqkv[...] = _unwindows(grads.reshape(n, grads.shape[1], -1, grads.shape[-1]), dqkv.shape, window, shift)
    dtable[...] = 0
    np.add.at(dtable, relative_index(window).reshape(-1), ds.sum(axis=(0, 1)).reshape(heads, -1).T)


# ---------------------------------------------------------------- kernels
_F3 = "float32[:, :, ::1]"  # an (N, C, H, W) array as (N, C, H*W)
_F2 = "float32[:, ::1]"
_F1 = "float32[::1]"
_GEO = "UniTuple(int64, 6)"  # (H, W, wh, ww, sh, sw)


@cuda.jit(device=True, inline=True)
def _pixel(r, c, geo):
    # The original pixel (flat, h * W + w) of the rolled position (r, c).
    hh, w_, _, _, sh, sw = geo
    return ((r + sh) % hh) * w_ + (c + sw) % w_


@cuda.jit(device=True, inline=True)
def _band(r, n, win, s):
    if r < n - win:
        return 0
    if r < n - s:
        return 1
    return 2


@cuda.jit(device=True, inline=True)
def _logit(qkv, table, b, hd, qc, kc, dh, ri, ci, rj, cj, geo, scale):
    # s_ij for the query at rolled (ri, ci) and the key at rolled (rj, cj) of the same window.
    hh, w_, wh, ww, sh, sw = geo
    i, j = _pixel(ri, ci, geo), _pixel(rj, cj, geo)
    acc = float32(0.0)
    for e in range(dh):
        acc += (qkv[b, qc + e, i] * scale) * qkv[b, kc + e, j]
    acc += table[(ri % wh - rj % wh + wh - 1) * (2 * ww - 1) + (ci % ww - cj % ww + ww - 1), hd]
    if sh + sw > 0:
        if (3 * _band(ri, hh, wh, sh) + _band(ci, w_, ww, sw)
                != 3 * _band(rj, hh, wh, sh) + _band(cj, w_, ww, sw)):
            acc += float32(-100.0)
    return acc


@cuda.jit(device=True, inline=True)
def _thread(p, heads, qkv, geo):
    # Thread p = (n * heads + h) * H*W + pix -> (n, h, pix, dh, q/k/v channels, rolled (r, c), window origin).
    n_, c3, t_ = qkv.shape
    d = c3 // 3
    dh = d // heads
    b, hd, pix = p // (heads * t_), (p // t_) % heads, p % t_
    hh, w_, _, _, sh, sw = geo
    r, c = (pix // w_ - sh + hh) % hh, (pix % w_ - sw + w_) % w_  # pix's rolled position
    return b, hd, pix, dh, hd * dh, d + hd * dh, 2 * d + hd * dh, r, c, r - r % geo[2], c - c % geo[3]


@cuda_kernel(f"void({_F3}, {_F2}, {_F3}, {_F1}, int64, {_GEO}, float32)")
def _window_attention_forward_v1(qkv, table, y, lse, heads, geo, scale):
    # One thread per (n, h, pixel i): the max over its window's keys, then l_i and y's numerators, y /= l_i.
    p = cuda.grid(1)
    if p < qkv.shape[0] * heads * qkv.shape[2]:
        b, hd, i, dh, qc, kc, vc, ri, ci, r0, c0 = _thread(p, heads, qkv, geo)
        wh, ww = geo[2], geo[3]
        m = _logit(qkv, table, b, hd, qc, kc, dh, ri, ci, r0, c0, geo, scale)
        for t in range(1, wh * ww):
            s = _logit(qkv, table, b, hd, qc, kc, dh, ri, ci, r0 + t // ww, c0 + t % ww, geo, scale)
            if s > m or math.isnan(s):  # NaN-propagating max
                m = s
        for e in range(dh):
            y[b, qc + e, i] = float32(0.0)
        l = float32(0.0)
        for t in range(wh * ww):
            rj, cj = r0 + t // ww, c0 + t % ww
            w = float32(math.exp(_logit(qkv, table, b, hd, qc, kc, dh, ri, ci, rj, cj, geo, scale) - m))
            l += w
            j = _pixel(rj, cj, geo)
            for e in range(dh):
                y[b, qc + e, i] += w * qkv[b, vc + e, j]
        for e in range(dh):
            y[b, qc + e, i] = y[b, qc + e, i] / l
        lse[p] = m + float32(math.log(l))


@cuda_kernel(f"void({_F3}, {_F2}, {_F3}, {_F3}, {_F1}, {_F3}, int64, {_GEO}, float32)")
def _window_attention_backward_dq_v1(qkv, table, y, dy, lse, dqkv, heads, geo, scale):
    # One thread per (n, h, pixel i): dq_i = scale * sum_j ds_ij k_j, j in token order.
    p = cuda.grid(1)
    if p < qkv.shape[0] * heads * qkv.shape[2]:
        b, hd, i, dh, qc, kc, vc, ri, ci, r0, c0 = _thread(p, heads, qkv, geo)
        ww = geo[3]
        big_d = _row_delta(y, dy, b, qc, i, dh)
        for e in range(dh):
            dqkv[b, qc + e, i] = float32(0.0)
        for t in range(geo[2] * ww):
            rj, cj = r0 + t // ww, c0 + t % ww
            j = _pixel(rj, cj, geo)
            w = float32(math.exp(_logit(qkv, table, b, hd, qc, kc, dh, ri, ci, rj, cj, geo, scale) - lse[p]))
            ds = _weight_grad(qkv, dy, b, qc, vc, i, j, dh, big_d, w)
            for e in range(dh):
                dqkv[b, qc + e, i] += ds * qkv[b, kc + e, j]
        for e in range(dh):
            dqkv[b, qc + e, i] = scale * dqkv[b, qc + e, i]


@cuda_kernel(f"void({_F3}, {_F2}, {_F3}, {_F3}, {_F1}, {_F3}, int64, {_GEO}, float32)")
def _window_attention_backward_dkv_v1(qkv, table, y, dy, lse, dqkv, heads, geo, scale):
    # One thread per (n, h, pixel j): dk_j = scale * sum_i ds_ij q_i and dv_j = sum_i p_ij dy_i over the
    # queries i of j's window in token order.
    p = cuda.grid(1)
    if p < qkv.shape[0] * heads * qkv.shape[2]:
        b, hd, j, dh, qc, kc, vc, rj, cj, r0, c0 = _thread(p, heads, qkv, geo)
        ww = geo[3]
        row = p - j  # lse index of (n, h, pixel 0)
        for e in range(dh):
            dqkv[b, kc + e, j] = float32(0.0)
            dqkv[b, vc + e, j] = float32(0.0)
        for t in range(geo[2] * ww):
            ri, ci = r0 + t // ww, c0 + t % ww
            i = _pixel(ri, ci, geo)
            big_d = _row_delta(y, dy, b, qc, i, dh)
            s = _logit(qkv, table, b, hd, qc, kc, dh, ri, ci, rj, cj, geo, scale)
            w = float32(math.exp(s - lse[row + i]))
            ds = _weight_grad(qkv, dy, b, qc, vc, i, j, dh, big_d, w)
            for e in range(dh):
                dqkv[b, kc + e, j] += ds * qkv[b, qc + e, i]
                dqkv[b, vc + e, j] += w * dy[b, qc + e, i]
        for e in range(dh):
            dqkv[b, kc + e, j] = scale * dqkv[b, kc + e, j]


@cuda_kernel(f"void({_F3}, {_F2}, {_F3}, {_F3}, {_F1}, {_F2}, {_GEO}, float32)")
def _window_attention_backward_dtable_v1(qkv, table, y, dy, lse, dtable, geo, scale):
    # One thread per (index, h): the sum of ds_ij over n ascending, then the rolled positions of i row by
    # row, each with the one key j at the index's offset (a_i - a_j, b_i - b_j) if it is in i's window.
    p = cuda.grid(1)
    heads = table.shape[1]
    if p < table.shape[0] * heads:
        hh, w_, wh, ww = geo[0], geo[1], geo[2], geo[3]
        n_, c3, t_ = qkv.shape
        d = c3 // 3
        dh = d // heads
        index, hd = p // heads, p % heads
        qc, kc, vc = hd * dh, d + hd * dh, 2 * d + hd * dh
        da, db = index // (2 * ww - 1) - (wh - 1), index % (2 * ww - 1) - (ww - 1)
        acc = float32(0.0)
        for b in range(n_):
            for ri in range(hh):
                if 0 <= ri % wh - da < wh:
                    for ci in range(w_):
                        if 0 <= ci % ww - db < ww:
                            i, j = _pixel(ri, ci, geo), _pixel(ri - da, ci - db, geo)
                            big_d = _row_delta(y, dy, b, qc, i, dh)
                            s = _logit(qkv, table, b, hd, qc, kc, dh, ri, ci, ri - da, ci - db, geo, scale)
                            w = float32(math.exp(s - lse[(b * heads + hd) * t_ + i]))
                            acc += _weight_grad(qkv, dy, b, qc, vc, i, j, dh, big_d, w)
        dtable[index, hd] = acc


# ---------------------------------------------------------------- launchers
def _ints(op, name, v):
    """An (h, w) pair of ints, or a ValueError naming ``name``."""
    if not (isinstance(v, (tuple, list)) and len(v) == 2
            and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v)):
        raise ValueError(f"{op} {name}: expected a pair of ints (h, w), got {v!r}")
    return int(v[0]), int(v[1])


def _geometry(op, qkv, window, shift):
    """(H, W, wh, ww, sh, sw) for the kernels, after checking window and shift against qkv's map."""
    (wh, ww), (sh, sw) = _ints(op, "window", window), _ints(op, "shift", shift)
    h, w = qkv.shape[2:]
    if wh < 1 or ww < 1 or h % wh or w % ww:
        raise ValueError(f"{op} window: {(wh, ww)} must be positive and divide the map's (H, W) = {(h, w)} "
                         f"(torchvision pads the map; snlite's window attention does not)")
    for s, win, side, axis in ((sh, wh, h, "H"), (sw, ww, w, "W")):
        if not 0 <= s < win:
            raise ValueError(f"{op} shift: expected 0 <= shift < window on each side, got shift {(sh, sw)} "
                             f"for window {(wh, ww)}")
        if s and win == side:
            raise ValueError(f"{op} shift: {(sh, sw)} shifts {axis}, which the window covers whole "
                             f"({win} of {side}): torchvision sets that shift to 0, and so must the caller")
    return h, w, wh, ww, sh, sw


def _prepare(op, qkv, table, heads, window, shift, version):
    """Checks shared by both launchers: (qkv as (N, 3C, H*W), the shape of y, heads, geo, scale, table)."""
    check_version(version, VERSIONS)
    qkv3 = _nchw(op, "qkv", qkv)
    c, dh = _heads(op, qkv, heads)
    geo = _geometry(op, qkv, window, shift)
    n, _, h, w = qkv.shape
    return qkv3, (n, c, h, w), int(heads), geo, np.float32(dh ** -0.5), _table(op, "table", table, geo, heads)


def _table(op, name, table, geo, heads):
    check(f"{op} {name}", table, shape=((2 * geo[2] - 1) * (2 * geo[3] - 1), heads))
    contiguous(f"{op} {name}", table)
    return table


def _lse(op, qkv, lse, heads):
    n, _, h, w = qkv.shape
    return _elements(op, "lse", lse, n * heads * h * w,
                     f"N*heads*H*W, laid out as (N, heads, H, W) = {(n, heads, h, w)}")


def _launch(kernel, threads, macs, block, stream, *args):
    """``kernel`` over ``threads`` threads and its work for the time model: ``macs`` multiply-adds, each
    with one load from global memory (fma_share 1/3, as attention's)."""
    kernel.launch(Launch(kernel.name, ceil_div(threads, block), block, flops=2 * macs, bytes=4 * macs,
                         fma_share=1 / 3), stream, *args)


def window_attention_forward(qkv, table, y, lse, *, heads, window, shift, stream=0, version="v1",
                             block=BLOCK):
    """Shifted-window attention of each head of ``qkv`` into ``y``, saving each query's log-sum-exp in
    ``lse``; ``y`` must not alias ``qkv``."""
    op = "window_attention_forward"
    qkv3, yshape, heads, geo, scale, table = _prepare(op, qkv, table, heads, window, shift, version)
    y3 = _nchw(op, "y", y, shape=yshape)
    lse1 = _lse(op, qkv, lse, heads)
    for out in (("y", y), ("lse", lse)):
        check_apart(op, out, ("qkv", qkv), ("table", table))
    # per (i, j): s_ij for the max, s_ij again, and y's update
    macs = lse1.size * geo[2] * geo[3] * 3 * (yshape[1] // heads)
    _launch(_window_attention_forward_v1, lse1.size, macs, block, stream, qkv3, table, y3, lse1, heads, geo,
            scale)


def window_attention_backward(qkv, table, y, dy, lse, dqkv, dtable, *, heads, window, shift, stream=0,
                              version="v1", block=BLOCK):
    """Gradient of window_attention_forward w.r.t. ``qkv`` and ``table`` from its ``y`` and ``lse``;
    ``dqkv`` and ``dtable`` must not alias any input."""
    op = "window_attention_backward"
    qkv3, yshape, heads, geo, scale, table = _prepare(op, qkv, table, heads, window, shift, version)
    y3 = _nchw(op, "y", y, shape=yshape)
    dy3 = _nchw(op, "dy", dy, shape=yshape)
    dqkv3 = _nchw(op, "dqkv", dqkv, shape=qkv.shape)
    dtable = _table(op, "dtable", dtable, geo, heads)
    lse1 = _lse(op, qkv, lse, heads)
    for out in (("dqkv", dqkv), ("dtable", dtable)):
        check_apart(op, out, ("qkv", qkv), ("table", table), ("y", y), ("dy", dy), ("lse", lse))
    check_apart(op, ("dtable", dtable), ("dqkv", dqkv))
    args = (qkv3, table, y3, dy3, lse1, dqkv3, heads, geo, scale)
    # dot products of length dh per (i, j) pair: s, dp, dq; D, s, dp, dk, dv; D, s, dp
    macs = lse1.size * geo[2] * geo[3] * (yshape[1] // heads)
    _launch(_window_attention_backward_dq_v1, lse1.size, 3 * macs, block, stream, *args)
    _launch(_window_attention_backward_dkv_v1, lse1.size, 5 * macs, block, stream, *args)
    _launch(_window_attention_backward_dtable_v1, dtable.size, 3 * macs, block, stream, qkv3, table, y3, dy3,
            lse1, dtable, geo, scale)


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "window_attention_forward", "window_attention_backward")}


def examples(rng):
    r, nan = example_arrays(rng)
    def geometry(heads, window, shift):
        table = r((2 * window[0] - 1) * (2 * window[1] - 1), heads)
        return {"heads": heads, "window": window, "shift": shift}, table

    def forward(n, c, heads, hw, window, shift, label, loc=0.0, block=BLOCK):
        kwargs, table = geometry(heads, window, shift)
        args = (r(n, 3 * c, *hw, loc=loc), table, nan(n, c, *hw), nan(n, heads, *hw))
        return Example("window_attention_forward", args, (2, 3), kwargs=kwargs, launch={"block": block},
                       label=label, rtol=1e-4, atol=1e-5)

    def backward(n, c, heads, hw, window, shift, label, loc=0.0, block=BLOCK):
        kwargs, table = geometry(heads, window, shift)
        qkv, dy = r(n, 3 * c, *hw, loc=loc), r(n, c, *hw)
        y, lse = np.empty_like(dy), np.empty((n, heads, *hw), np.float32)
        window_attention_forward_ref(qkv, table, y, lse, **kwargs)
        args = (qkv, table, y, dy, lse, nan(*qkv.shape), nan(*table.shape))
        return Example("window_attention_backward", args, (5, 6), kwargs=kwargs, launch={"block": block},
                       label=label, rtol=1e-4, atol=1e-4)

    cases = [
        (1, 2, 1, (4, 4), (2, 2), (0, 0), "4x4, 2x2 windows, 1 head", 0.0, 8),
        (2, 4, 2, (4, 4), (2, 2), (1, 1), "4x4 shifted 1, 2 heads", 0.0, BLOCK),
        (1, 4, 2, (2, 4), (2, 2), (0, 0), "2x4, 2x2 windows", 0.0, BLOCK),
        (2, 2, 1, (2, 4), (2, 2), (0, 1), "2x4 shifted (0, 1)", 0.0, 16),
        (1, 6, 3, (2, 3), (2, 3), (0, 0), "window = map 2x3, 3 heads", 0.0, BLOCK),
        (1, 2, 2, (4, 6), (2, 3), (1, 2), "4x6, 2x3 windows, dh=1", 0.0, BLOCK),
        (1, 4, 2, (4, 4), (2, 2), (1, 1), "logits ~1000: max", 30.0, BLOCK),
    ]
    return ([forward(*case[:7], loc=case[7], block=case[8]) for case in cases]
            + [backward(*case[:7], loc=case[7], block=case[8]) for case in cases])


if __name__ == "__main__":
    main(__import__(__name__))
