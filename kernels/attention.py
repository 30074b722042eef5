"""Multi-head softmax attention, fused: the core of PyTorch's ``nn.MultiheadAttention`` (batch_first, no
mask, dropout 0) after its ``in_proj`` and before its ``out_proj``. Forward and backward; the forward
saves only each row's log-sum-exp, and the backward recomputes the attention weights from it.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.attention

Layout: snlite keeps a token sequence, PyTorch's (N, T, D), as an NCHW array (N, D, T, 1); any
(N, C, H, W) is accepted and its H*W positions are the T tokens. ``qkv`` (N, 3D, H, W) holds the
in-projection's output packed as PyTorch packs it: q in channels [0, D), k in [D, 2D), v in [2D, 3D),
each split into ``heads`` heads of dh = D / heads channels in order, so head h reads q[h*dh + e],
k[D + h*dh + e] and v[2D + h*dh + e] for e < dh, and writes y[h*dh + e] (y is (N, D, H, W)).

- attention_forward(qkv, y, lse, *, heads): with scale = float32(1 / sqrt(dh)), for each image n,
  head h and query token i::

      s_ij = (sum_e q[e, i] * k[e, j]) * scale
      m_i = max_j s_ij,   l_i = sum_j exp(s_ij - m_i)                (the max keeps exp from overflowing)
      y[e, i] = (sum_j exp(s_ij - m_i) * v[e, j]) / l_i,   lse_i = m_i + log(l_i)

  lse has N*heads*T values laid out as (N, heads, T) (any shape of that size is accepted). A NaN
  logit makes its row's max NaN (as NumPy's max and PyTorch's softmax do).
- attention_backward(qkv, y, dy, lse, dqkv, *, heads): with p_ij = exp(s_ij - lse_i) recomputed,
  D_i = sum_e dy[e, i] * y[e, i], dp_ij = sum_e dy[e, i] * v[e, j] and ds_ij = p_ij * (dp_ij - D_i)::

      dq_i = scale * sum_j ds_ij k_j,   dk_j = scale * sum_i ds_ij q_i,   dv_j = sum_i p_ij dy_i

  written into dqkv (N, 3D, H, W) in the packing of qkv.

Canonical orders, all in float32 from 0.0, no atomics (every result is bit-reproducible): each dot
product over e ascending; the forward's one thread per (n, h, i) takes the max over j ascending, then
adds l_i and y's numerators over j ascending (accumulating straight into y, divided by l_i last). The
backward's first kernel, one thread per (n, h, i), adds dq over j ascending; its second, one thread per
(n, h, j), adds dk and dv over i ascending, recomputing D_i and s_ij for each i (O(T * dh) work per
i: these kernels are for teaching, not for long sequences). y must NOT alias qkv; dqkv must NOT alias
any input. One version (v1).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Launch, Op, ceil_div, check_apart, check_version, cuda_kernel
from kernels.layernorm import _elements, _nchw

BLOCK = 128  # threads per block
VERSIONS = ("v1",)


# ---------------------------------------------------------------- NumPy references
def _split(qkv, heads):
    """q, k, v of ``qkv`` (N, 3D, H, W), each as (N, heads, dh, T)."""
    n, c = qkv.shape[:2]
    d = c // 3
    parts = qkv.reshape(n, 3, heads, d // heads, -1)
    return parts[:, 0], parts[:, 1], parts[:, 2]


def _scale(dtype, dh):
    """1 / sqrt(dh) in ``dtype`` (for float32 arrays the float32 the launcher passes)."""
    return dtype.type(1.0 / np.sqrt(dh))


def _logits(q, k, scale):
    """s[n, h, i, j] = (sum_e q[e, i] * k[e, j]) * scale."""
    return np.einsum("nhei,nhej->nhij", q, k) * scale


def attention_forward_ref(qkv, y, lse, *, heads):
    _, dh = _heads("attention_forward", qkv, heads)
    q, k, v = _split(qkv, heads)
    s = _logits(q, k, _scale(qkv.dtype, dh))
    m = s.max(axis=-1, keepdims=True)  # NaN-propagating, as the kernel's max
    p = np.exp(s - m)
    l = p.sum(axis=-1, dtype=qkv.dtype)
    out = np.einsum("nhij,nhej->nhei", p, v) / l[:, :, None, :]
    lse[...] = (m[..., 0] + np.log(l)).reshape(lse.shape)
    y[...] = out.reshape(y.shape)


def attention_backward_ref(qkv, y, dy, lse, dqkv, *, heads):
    _, dh = _heads("attention_backward", qkv, heads)
    n = qkv.shape[0]
    scale = _scale(qkv.dtype, dh)
    q, k, v = _split(qkv, heads)
    yh, dyh = y.reshape(q.shape), dy.reshape(q.shape)
    p = np.exp(_logits(q, k, scale) - lse.reshape(n, heads, 1, -1).swapaxes(2, 3))
    big_d = np.sum(dyh * yh, axis=2, dtype=qkv.dtype)  # D_i, (N, heads, T)
    dp = np.einsum("nhei,nhej->nhij", dyh, v)
    ds = p * (dp - big_d[..., None])
    dq = scale * np.einsum("nhij,nhej->nhei", ds, k)
    dk = scale * np.einsum("nhij,nhei->nhej", ds, q)
    dv = np.einsum("nhij,nhei->nhej", p, dyh)
    dqkv[...] = np.stack([dq, dk, dv], axis=1).reshape(dqkv.shape)


# ---------------------------------------------------------------- kernels
_F3 = "float32[:, :, ::1]"  # an (N, C, H, W) array as (N, C, H*W)
_F1 = "float32[::1]"


@cuda.jit(device=True, inline=True)
def _logit(qkv, b, qc, kc, i, j, dh, scale):
    # s_ij of the head whose q channels start at qc and k channels at kc: e ascending, then scaled.
    acc = float32(0.0)
    for e in range(dh):
        acc += qkv[b, qc + e, i] * qkv[b, kc + e, j]
    return acc * scale


@cuda.jit(device=True, inline=True)
def _row_of(p, heads, t_):
    # Thread p = (n * heads + h) * T + i -> (n, h, i).
    return p // (heads * t_), (p // t_) % heads, p % t_


@cuda_kernel(f"void({_F3}, {_F3}, {_F1}, int64, float32)")
def _attention_forward_v1(qkv, y, lse, heads, scale):
    # One thread per (n, h, i): the max over j, then l_i and y's numerators over j, then y /= l_i.
    p = cuda.grid(1)
    n_, c_, t_ = qkv.shape
    d = c_ // 3
    dh = d // heads
    if p < n_ * heads * t_:
        b, h, i = _row_of(p, heads, t_)
        qc, kc, vc = h * dh, d + h * dh, 2 * d + h * dh
        m = _logit(qkv, b, qc, kc, i, 0, dh, scale)
        for j in range(1, t_):
            s = _logit(qkv, b, qc, kc, i, j, dh, scale)
            if s > m or math.isnan(s):  # NaN-propagating max
                m = s
        for e in range(dh):
            y[b, qc + e, i] = float32(0.0)
        l = float32(0.0)
        for j in range(t_):
            w = float32(math.exp(_logit(qkv, b, qc, kc, i, j, dh, scale) - m))
            l += w
            for e in range(dh):
                y[b, qc + e, i] += w * qkv[b, vc + e, j]
        for e in range(dh):
            y[b, qc + e, i] = y[b, qc + e, i] / l
        lse[p] = m + float32(math.log(l))


@cuda.jit(device=True, inline=True)
def _row_delta(y, dy, b, qc, i, dh):
    # D_i = sum_e dy[e, i] * y[e, i], e ascending.
    acc = float32(0.0)
    for e in range(dh):
        acc += dy[b, qc + e, i] * y[b, qc + e, i]
    return acc


@cuda.jit(device=True, inline=True)
def _weight_grad(qkv, dy, b, qc, vc, i, j, dh, big_d, p):
    # ds_ij = p_ij * (dp_ij - D_i), dp_ij = sum_e dy[e, i] * v[e, j] (e ascending).
    dp = float32(0.0)
    for e in range(dh):
        dp += dy[b, qc + e, i] * qkv[b, vc + e, j]
    return p * (dp - big_d)


@cuda_kernel(f"void({_F3}, {_F3}, {_F3}, {_F1}, {_F3}, int64, float32)")
def _attention_backward_dq_v1(qkv, y, dy, lse, dqkv, heads, scale):
    # One thread per (n, h, i): dq_i = scale * sum_j ds_ij k_j, j ascending.
    p = cuda.grid(1)
    n_, c_, t_ = qkv.shape
    d = c_ // 3
    dh = d // heads
    if p < n_ * heads * t_:
        b, h, i = _row_of(p, heads, t_)
        qc, kc, vc = h * dh, d + h * dh, 2 * d + h * dh
        big_d = _row_delta(y, dy, b, qc, i, dh)
        for e in range(dh):
            dqkv[b, qc + e, i] = float32(0.0)
        for j in range(t_):
            w = float32(math.exp(_logit(qkv, b, qc, kc, i, j, dh, scale) - lse[p]))
            ds = _weight_grad(qkv, dy, b, qc, vc, i, j, dh, big_d, w)
            for e in range(dh):
                dqkv[b, qc + e, i] += ds * qkv[b, kc + e, j]
        for e in range(dh):
            dqkv[b, qc + e, i] = scale * dqkv[b, qc + e, i]


@cuda_kernel(f"void({_F3}, {_F3}, {_F3}, {_F1}, {_F3}, int64, float32)")
def _attention_backward_dkv_v1(qkv, y, dy, lse, dqkv, heads, scale):
    # One thread per (n, h, j): dk_j = scale * sum_i ds_ij q_i and dv_j = sum_i p_ij dy_i, i ascending.
    p = cuda.grid(1)
    n_, c_, t_ = qkv.shape
    d = c_ // 3
    dh = d // heads
    if p < n_ * heads * t_:
        b, h, j = _row_of(p, heads, t_)
        qc, kc, vc = h * dh, d + h * dh, 2 * d + h * dh
        row = p - j  # lse index of (n, h, 0)
        for e in range(dh):
            dqkv[b, kc + e, j] = float32(0.0)
            dqkv[b, vc + e, j] = float32(0.0)
        for i in range(t_):
            big_d = _row_delta(y, dy, b, qc, i, dh)
            w = float32(math.exp(_logit(qkv, b, qc, kc, i, j, dh, scale) - lse[row + i]))
            ds = _weight_grad(qkv, dy, b, qc, vc, i, j, dh, big_d, w)
            for e in range(dh):
                dqkv[b, kc + e, j] += ds * qkv[b, qc + e, i]
                dqkv[b, vc + e, j] += w * dy[b, qc + e, i]
        for e in range(dh):
            dqkv[b, kc + e, j] = scale * dqkv[b, kc + e, j]


# ---------------------------------------------------------------- launchers
def _heads(op, qkv, heads):
    """(D, dh) of ``qkv`` (N, 3D, H, W) split into ``heads`` heads; a ValueError naming ``op`` if it
    cannot be."""
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        raise ValueError(f"{op}: heads must be a positive int, got {heads!r}")
    c = qkv.shape[1] if len(qkv.shape) > 1 else 0
    if c % 3 or c == 0:
        raise ValueError(f"{op} qkv: expected 3*D channels (q, k and v, D >= 1), got {c}")
    d = c // 3
    if d % int(heads):
        raise ValueError(f"{op}: heads={int(heads)} does not divide D={d} (qkv has {c} channels)")
    return d, d // int(heads)


def _lse(op, qkv, lse, heads):
    n, _, h, w = qkv.shape
    return _elements(op, "lse", lse, n * heads * h * w,
                     f"N*heads*T, laid out as (N, heads, T) = {(n, heads, h * w)}")


def _prepare(op, qkv, heads, version):
    """Checks shared by both launchers: (qkv as (N, 3D, T), the (N, D, H, W) shape of y, heads, scale)."""
    check_version(version, VERSIONS)
    qkv3 = _nchw(op, "qkv", qkv)
    d, dh = _heads(op, qkv, heads)
    n, _, h, w = qkv.shape
    return qkv3, (n, d, h, w), int(heads), np.float32(1.0 / math.sqrt(dh))


def _launch(kernel, rows, t, dots, dh, block, stream, *args):
    """``kernel`` over ``rows`` threads (one per (n, h, token)), each taking ``t`` steps of ``dots``
    dot products (or updates) of length dh, and its work for the time model: a multiply-add and one
    load from global memory each (fma_share 1/3, as the naive direct convolution's)."""
    macs = rows * t * dots * dh
    kernel.launch(Launch(kernel.name, ceil_div(rows, block), block, flops=2 * macs, bytes=4 * macs,
                         fma_share=1 / 3), stream, *args)


def attention_forward(qkv, y, lse, *, heads, stream=0, version="v1", block=BLOCK):
    """Softmax attention of each head of ``qkv`` into ``y``, saving each row's log-sum-exp in ``lse``;
    ``y`` must not alias ``qkv``."""
    op = "attention_forward"
    qkv3, yshape, heads, scale = _prepare(op, qkv, heads, version)
    y3 = _nchw(op, "y", y, shape=yshape)
    lse1 = _lse(op, qkv, lse, heads)
    check_apart(op, ("y", y), ("qkv", qkv))
    check_apart(op, ("lse", lse), ("qkv", qkv))
    # per (i, j): s_ij for the max, s_ij again, and y's update
    _launch(_attention_forward_v1, lse1.size, qkv3.shape[2], 3, yshape[1] // heads, block, stream, qkv3, y3,
            lse1, heads, scale)


def attention_backward(qkv, y, dy, lse, dqkv, *, heads, stream=0, version="v1", block=BLOCK):
    """Gradient of attention_forward w.r.t. ``qkv`` from its ``y`` and ``lse``; ``dqkv`` must not alias
    any input."""
    op = "attention_backward"
    qkv3, yshape, heads, scale = _prepare(op, qkv, heads, version)
    y3 = _nchw(op, "y", y, shape=yshape)
    dy3 = _nchw(op, "dy", dy, shape=yshape)
    dqkv3 = _nchw(op, "dqkv", dqkv, shape=qkv.shape)
    lse1 = _lse(op, qkv, lse, heads)
    check_apart(op, ("dqkv", dqkv), ("qkv", qkv), ("y", y), ("dy", dy), ("lse", lse))
    args, t, dh = (qkv3, y3, dy3, lse1, dqkv3, heads, scale), qkv3.shape[2], yshape[1] // heads
    _launch(_attention_backward_dq_v1, lse1.size, t, 3, dh, block, stream, *args)  # s_ij, dp_ij, dq's update
    _launch(_attention_backward_dkv_v1, lse1.size, t, 5, dh, block, stream, *args)  # D_i, s_ij, dp_ij, dk, dv


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "attention_forward", "attention_backward")}


def examples(rng):
    r, nan = example_arrays(rng)
    def forward(n, d, heads, hw, label, loc=0.0, lse_shape=None, block=BLOCK):
        t = hw[0] * hw[1]
        args = (r(n, 3 * d, *hw, loc=loc), nan(n, d, *hw), nan(*(lse_shape or (n, heads, t))))
        return Example("attention_forward", args, (1, 2), kwargs={"heads": heads}, launch={"block": block},
                       label=label, rtol=1e-4, atol=1e-5)

    def backward(n, d, heads, hw, label, loc=0.0, block=BLOCK):
        qkv, dy = r(n, 3 * d, *hw, loc=loc), r(n, d, *hw)
        y, lse = np.empty_like(dy), np.empty((n, heads, hw[0] * hw[1]), np.float32)
        attention_forward_ref(qkv, y, lse, heads=heads)
        args = (qkv, y, dy, lse, nan(*qkv.shape))
        return Example("attention_backward", args, (4,), kwargs={"heads": heads}, launch={"block": block},
                       label=label, rtol=1e-4, atol=1e-4)

    return [
        forward(2, 4, 2, (5, 1), "2 heads, T=5", block=8),
        forward(2, 6, 3, (3, 2), "3 heads, H*W 3x2"),
        forward(2, 3, 1, (4, 1), "1 head, dh=3", lse_shape=(2 * 4,)),
        forward(1, 3, 3, (2, 2), "dh=1"),
        forward(2, 4, 2, (1, 1), "T=1"),
        forward(2, 4, 2, (2, 2), "logits ~1000: max", loc=30.0),
        backward(2, 4, 2, (5, 1), "2 heads, T=5", block=8),
        backward(2, 6, 3, (3, 2), "3 heads, H*W 3x2"),
        backward(1, 3, 1, (4, 1), "1 head, dh=3"),
        backward(2, 2, 2, (3, 1), "dh=1"),
        backward(1, 4, 2, (1, 1), "T=1"),
        backward(1, 4, 2, (3, 1), "mean 3", loc=3.0),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
