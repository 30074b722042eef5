"""Softmax with cross-entropy loss, averaged over the batch (``nn.CrossEntropyLoss()`` on logits).

``softmax_xent_forward(logits, labels, prob, loss)``: logits (N, K) float32, labels (N,) int32,
prob (N, K) = softmax of each row (the row max subtracted first), loss (1,) = the mean over the
batch of ``-log prob[n, labels[n]]``, computed from the logits as ``logsumexp(row) - logit[label]``
so a tiny probability never becomes ``-log 0``. prob may alias logits (in place): the loss is
computed first, and each row is read whole before any of it is written.
``softmax_xent_backward(prob, labels, dlogits)``: dlogits = (prob - onehot(labels)) / N;
dlogits MAY alias prob (cuDNN's convention, as in the paper: the backward writes into its input).
Run the self-check on the simulator:
    NUMBA_ENABLE_CUDASIM=1 python -m kernels.softmax

Invalid labels (outside [0, K)): a launcher cannot read device labels without a copy, so the
kernels do not raise; they make the failure loud instead: the loss becomes NaN and the offending
row of dlogits is all NaN. The references raise ValueError, and :func:`check_labels` is the
host-side check the runtime runs on a batch's labels before it uploads them.

Canonical orders (float32, deterministic, no atomics):
- v1: one thread per row takes the max and adds exp(logit - max) for k = 0..K-1 in order; one
  thread adds the N row losses for n = 0..N-1 in order, then divides by N.
- v2: one block of ``block`` threads per row (a power of two, ``XENT_BLOCK`` by default): thread
  t covers k = t, t + block, ..., then fixed shared-memory trees (w = block/2, ..., 1) give the
  max and the sum; the loss is one block: thread t adds the losses of rows t, t + block, ...
  (each row's log-sum-exp computed sequentially over k), then the same fixed tree.
v1 and v2 may differ in the last bits; each is bit-reproducible (v2 for a given ``block``).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, ceil_div, check, check_version, cuda_kernel

VERSIONS = ("v1", "v2")
BLOCK = 256  # threads per block of the element-wise and one-thread-per-row kernels
XENT_BLOCK = 128  # largest (and default) threads per block of the v2 reductions; a power of two


# ---------------------------------------------------------------- NumPy references
def check_labels(labels, k: int) -> None:
    """Raise ValueError if a label is outside [0, k); cheap on the host, before the upload."""
    bad = (labels < 0) | (labels >= k)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"softmax_xent: label {int(labels[i])} at batch index {i} is outside [0, {k})")


def softmax_xent_forward_ref(logits, labels, prob, loss):
    check_labels(labels, logits.shape[1])
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - m)
    s = e.sum(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(s[:, 0])
    loss[0] = np.mean(lse - logits[np.arange(logits.shape[0]), labels])
    prob[...] = e / s  # last: prob may alias logits


def softmax_xent_backward_ref(prob, labels, dlogits):
    check_labels(labels, prob.shape[1])
    d = prob.copy()
    d[np.arange(prob.shape[0]), labels] -= prob.dtype.type(1)
    dlogits[...] = d / prob.dtype.type(prob.shape[0])


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _row_max_sum(logits, r):
    """Max of row r and the sum of exp(logit - max), sequentially over k."""
    m = float32(-math.inf)
    for k in range(logits.shape[1]):
        m = max(m, logits[r, k])
    s = float32(0.0)
    for k in range(logits.shape[1]):
        s += math.exp(logits[r, k] - m)
    return m, s


@cuda.jit(device=True, inline=True)
def _row_loss(logits, labels, r):
    """logsumexp(row r) - logit[label]; NaN for a label outside [0, K)."""
    lab = labels[r]
    if lab < 0 or lab >= logits.shape[1]:
        return float32(math.nan)
    m, s = _row_max_sum(logits, r)
    return m + math.log(s) - logits[r, lab]


@cuda.jit(device=True, inline=True)
def _tree(part, t, width, take_max):
    """Fixed-shape tree over part[0:width] (sum, or max); every thread gets the result."""
    cuda.syncthreads()
    w = width // 2
    while w > 0:
        if t < w:
            part[t] = max(part[t], part[t + w]) if take_max else part[t] + part[t + w]
        cuda.syncthreads()
        w //= 2
    out = part[0]
    cuda.syncthreads()  # everyone has read part[0] before it is reused
    return out


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[:, ::1], float32[:, ::1])")
def _softmax_rows_v1(logits, prob):
    # Naive: one thread per row, three sequential passes (max, sum, write).
    r = cuda.grid(1)
    if r < logits.shape[0]:
        m, s = _row_max_sum(logits, r)
        for k in range(logits.shape[1]):
            prob[r, k] = math.exp(logits[r, k] - m) / s


@cuda_kernel("void(float32[:, ::1], int32[::1], float32[::1])")
def _xent_loss_v1(logits, labels, loss):
    # Naive: a single thread adds the row losses in batch order.
    if cuda.grid(1) == 0:
        acc = float32(0.0)
        for r in range(logits.shape[0]):
            acc += _row_loss(logits, labels, r)
        loss[0] = acc / float32(logits.shape[0])


@cuda_kernel("void(float32[:, ::1], float32[:, ::1])")
def _softmax_rows_v2(logits, prob):
    # One block per row: strided per-thread max and sum, each finished by a fixed tree.
    part = cuda.shared.array(XENT_BLOCK, float32)
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    k_ = logits.shape[1]
    m = float32(-math.inf)
    for k in range(t, k_, width):
        m = max(m, logits[r, k])
    part[t] = m
    m = _tree(part, t, width, True)
    s = float32(0.0)
    for k in range(t, k_, width):
        s += math.exp(logits[r, k] - m)
    part[t] = s
    s = _tree(part, t, width, False)
    for k in range(t, k_, width):
        prob[r, k] = math.exp(logits[r, k] - m) / s


@cuda_kernel("void(float32[:, ::1], int32[::1], float32[::1])")
def _xent_loss_v2(logits, labels, loss):
    # One block: thread t adds rows t, t + width, ...; a fixed tree adds the threads.
    part = cuda.shared.array(XENT_BLOCK, float32)
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    acc = float32(0.0)
    for r in range(t, logits.shape[0], width):
        acc += _row_loss(logits, labels, r)
    part[t] = acc
    total = _tree(part, t, width, False)
    if t == 0:
        loss[0] = total / float32(logits.shape[0])


@cuda_kernel("void(float32[:, ::1], int32[::1], float32[:, ::1])")
def _xent_backward_v1(prob, labels, dlogits):
    # dlogits = (prob - onehot) / N, one thread per element; a bad label gives a NaN row.
    i = cuda.grid(1)
    n_, k_ = prob.shape
    if i < n_ * k_:
        r, k = i // k_, i % k_
        lab = labels[r]
        v = prob[r, k]
        if k == lab:
            v -= float32(1.0)
        if lab < 0 or lab >= k_:
            v = float32(math.nan)
        dlogits[r, k] = v / float32(n_)


# ---------------------------------------------------------------- launchers
def _check_nk(op, logits, labels, names):
    check(f"{op} {names[0]}", logits)
    if logits.ndim != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"{op} {names[0]}: expected a non-empty (N, K) array, got shape "
                         f"{tuple(logits.shape)}")
    check(f"{op} labels", labels, shape=logits.shape[:1], dtype=np.int32)


def _reduce_block(op, block):
    b = XENT_BLOCK if block is None else int(block)
    if b < 1 or b > XENT_BLOCK or b & (b - 1):
        raise ValueError(f"{op}: block must be a power of two between 1 and {XENT_BLOCK}, got {block!r}")
    return b


def softmax_xent_forward(logits, labels, prob, loss, *, stream=0, version="v2", block=None):
    """prob = softmax(logits) (may alias logits), loss[0] = mean cross-entropy; ``block``: v2 threads."""
    op = "softmax_xent_forward"
    check_version(version, VERSIONS)
    _check_nk(op, logits, labels, ("logits",))
    check(f"{op} prob", prob, shape=logits.shape)
    check(f"{op} loss", loss, shape=(1,))
    n = logits.shape[0]
    # The loss first, from the logits: then prob may overwrite them (in place).
    if version == "v1":
        _xent_loss_v1[1, 1, stream](logits, labels, loss)
        _softmax_rows_v1[ceil_div(n, BLOCK), BLOCK, stream](logits, prob)
    else:
        b = _reduce_block(op, block)
        _xent_loss_v2[1, b, stream](logits, labels, loss)
        _softmax_rows_v2[n, b, stream](logits, prob)


def softmax_xent_backward(prob, labels, dlogits, *, stream=0, version="v1"):
    """dlogits = (prob - onehot(labels)) / N; dlogits may be prob itself (in place)."""
    op = "softmax_xent_backward"
    check_version(version, ("v1",))
    _check_nk(op, prob, labels, ("prob",))
    check(f"{op} dlogits", dlogits, shape=prob.shape)
    _xent_backward_v1[ceil_div(prob.size, BLOCK), BLOCK, stream](prob, labels, dlogits)


OPS = {
    "softmax_xent_forward": Op("softmax_xent_forward", softmax_xent_forward_ref,
                               softmax_xent_forward, VERSIONS),
    "softmax_xent_backward": Op("softmax_xent_backward", softmax_xent_backward_ref, softmax_xent_backward),
}


def examples(rng):
    _, nan = example_arrays(rng)

    def logits(n, k, loc=0.0):
        return (3 * rng.standard_normal((n, k)) + loc).astype(np.float32)

    def labels(n, k):
        return rng.integers(0, k, n).astype(np.int32)

    def forward(x, lab, label, block=8, alias=False):
        args = (x, lab, x if alias else nan(*x.shape), nan(1))
        return Example("softmax_xent_forward", args, (2, 3), launch={"block": block},
                       rtol=1e-5, atol=1e-6, label=label)

    def backward(n, k, label, alias=False):
        x, lab = logits(n, k), labels(n, k)
        prob = np.empty_like(x)
        softmax_xent_forward_ref(x, lab, prob, np.empty(1, np.float32))
        out = prob if alias else nan(n, k)
        return Example("softmax_xent_backward", (prob, lab, out), (2,), label=label)

    far = logits(4, 6)
    far[1, 0], far[1, 1] = 200.0, -200.0  # prob[1, 1] underflows to 0; the loss must stay finite
    far_lab = np.array([2, 1, 0, 5], np.int32)
    return [
        forward(logits(7, 13), labels(7, 13), "7x13"),
        forward(logits(5, 3, loc=1000.0), labels(5, 3), "logits near 1000"),
        forward(far, far_lab, "label prob underflows"),
        forward(logits(9, 2), labels(9, 2), "N > block, K=2", block=4),
        forward(logits(1, 1), np.zeros(1, np.int32), "1x1"),
        forward(logits(6, 9), labels(6, 9), "prob aliases logits", alias=True),
        backward(7, 13, "7x13"),
        backward(5, 11, "dlogits aliases prob", alias=True),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
