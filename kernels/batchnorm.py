"""Batch normalization (BatchNorm2d as PyTorch defines it; (N, C) inputs work as BatchNorm1d).

Training forward normalizes with the batch mean and the biased batch variance of each channel,
saves the mean and ``invstd = 1 / sqrt(var + eps)`` for the backward pass, and (if
``update_running``) updates the running statistics as PyTorch does::

    running_mean = (1 - momentum) * running_mean + momentum * mean
    running_var  = (1 - momentum) * running_var  + momentum * var * n / (n - 1)   # unbiased

with ``n = N * H * W``. The recompute stage runs the forward a second time with
``update_running=False`` so the running statistics move once per step. Inference uses the
running statistics. Run the self-check on the simulator:
    NUMBA_ENABLE_CUDASIM=1 python -m kernels.batchnorm

Reductions are two-pass (mean first, then the sum of squared deviations from it: no
cancellation) and deterministic, without atomics. Canonical orders, per channel c:
- v1: one thread per channel adds the n values in memory order (batch index, then spatial
  index), in float32 starting from 0.0.
- v2: one block of ``block`` threads per channel (a power of two, ``BN_BLOCK`` by default);
  thread t adds elements j = t, t + block, ... (j = batch * H*W + spatial) in that order, then a
  fixed shared-memory tree adds partial[t] += partial[t + w] for w = block/2, ..., 1.
v1 and v2 may differ in the last bits; each is bit-reproducible (v2 for a given ``block``).
The normalization and the input gradient are element-wise kernels shared by both versions;
y may alias x, and dx may alias dy (each element is read before it is written).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, ceil_div, check, check_version, cuda_kernel

VERSIONS = ("v1", "v2")
BLOCK = 256  # threads per block of the element-wise and the one-thread-per-channel kernels
BN_BLOCK = 128  # largest (and default) threads per channel block of the v2 reductions; a power of two


# ---------------------------------------------------------------- NumPy references
def _count(x):
    return x.size // x.shape[1] if x.shape[1] else 0


def _per_channel(v, x):
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


def batchnorm_forward_train_ref(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, *,
                                momentum=0.1, eps=1e-5, update_running=True):
    t = x.dtype.type
    n = _count(x)
    if n < 2:
        raise ValueError(f"batchnorm_forward_train: expected more than 1 value per channel, got {n}")
    mean = x.mean(axis=_axes(x))
    m2 = ((x - _per_channel(mean, x)) ** 2).sum(axis=_axes(x))
    invstd = t(1) / np.sqrt(m2 / t(n) + t(eps))
    y[...] = ((x - _per_channel(mean, x)) * _per_channel(invstd, x) * _per_channel(gamma, x)
              + _per_channel(beta, x))
    save_statistics(mean, m2, invstd, n, save_mean, save_invstd, running_mean, running_var,
                    momentum, update_running)


def save_statistics(mean, m2, invstd, n, save_mean, save_invstd, running_mean, running_var, momentum,
                    update_running):
    """What a training forward keeps: the batch's mean and 1/std for backward, and (unless
    ``update_running`` is False, as in a recomputed forward) the running statistics moved by
    ``momentum``, the variance unbiased (PyTorch's rule). Shared by every NumPy version."""
    t = mean.dtype.type
    save_mean[...] = mean
    save_invstd[...] = invstd
    if update_running:
        m = t(momentum)
        running_mean[...] = (t(1) - m) * running_mean + m * mean
        running_var[...] = (t(1) - m) * running_var + m * (m2 / t(n - 1))


def batchnorm_backward_ref(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta):
    """Training-mode gradient: dx = gamma * invstd / n * (n * dy - dbeta - xhat * dgamma)."""
    t = x.dtype.type
    n = _count(x)
    xhat = (x - _per_channel(save_mean, x)) * _per_channel(save_invstd, x)
    db = dy.sum(axis=_axes(x))
    dg = (dy * xhat).sum(axis=_axes(x))
    scale = _per_channel(gamma * save_invstd / t(n), x)
    dx[...] = scale * (t(n) * dy - _per_channel(db, x) - xhat * _per_channel(dg, x))
    dgamma[...] = dg
    dbeta[...] = db


def batchnorm_forward_infer_ref(x, gamma, beta, running_mean, running_var, y, *, eps=1e-5):
    invstd = x.dtype.type(1) / np.sqrt(running_var + x.dtype.type(eps))
    y[...] = ((x - _per_channel(running_mean, x)) * _per_channel(invstd, x) * _per_channel(gamma, x)
              + _per_channel(beta, x))


# ---------------------------------------------------------------- device helpers
@cuda.jit(device=True, inline=True)
def _tree_sum(partial, t, width):
    """Sum partial[0:width] (width a power of two) with a fixed tree; every thread gets the total."""
    cuda.syncthreads()
    w = width // 2
    while w > 0:
        if t < w:
            partial[t] += partial[t + w]
        cuda.syncthreads()
        w //= 2
    total = partial[0]
    cuda.syncthreads()  # everyone has read partial[0] before it is reused
    return total


@cuda.jit(device=True, inline=True)
def _save_stats(c, mean, m2, n, save_mean, save_invstd, running_mean, running_var, momentum, eps, update):
    """Write the saved statistics of channel c and, if asked, update its running statistics."""
    save_mean[c] = mean
    save_invstd[c] = float32(1.0) / math.sqrt(m2 / float32(n) + eps)
    if update:
        keep = float32(1.0) - momentum
        running_mean[c] = keep * running_mean[c] + momentum * mean
        running_var[c] = keep * running_var[c] + momentum * (m2 / float32(n - 1))


# ---------------------------------------------------------------- kernels
_STATS_SIG = ("void(float32[:, :, ::1], float32[::1], float32[::1], float32[::1], float32[::1], "
              "float32, float32, boolean)")


@cuda_kernel(_STATS_SIG)
def _bn_stats_v1(x, save_mean, save_invstd, running_mean, running_var, momentum, eps, update):
    # Naive: one thread per channel, two sequential passes (mean, then squared deviations).
    c = cuda.grid(1)
    n_, c_, s_ = x.shape
    if c < c_:
        acc = float32(0.0)
        for b in range(n_):
            for s in range(s_):
                acc += x[b, c, s]
        mean = acc / float32(n_ * s_)
        m2 = float32(0.0)
        for b in range(n_):
            for s in range(s_):
                d = x[b, c, s] - mean
                m2 += d * d
        _save_stats(c, mean, m2, n_ * s_, save_mean, save_invstd, running_mean, running_var, momentum, eps,
                    update)


@cuda_kernel(_STATS_SIG)
def _bn_stats_v2(x, save_mean, save_invstd, running_mean, running_var, momentum, eps, update):
    # One block per channel: strided per-thread sums, then a fixed-shape tree in shared memory.
    partial = cuda.shared.array(BN_BLOCK, float32)
    c = cuda.blockIdx.x
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    n_, _, s_ = x.shape
    acc = float32(0.0)
    for j in range(t, n_ * s_, width):
        acc += x[j // s_, c, j % s_]
    partial[t] = acc
    mean = _tree_sum(partial, t, width) / float32(n_ * s_)
    m2 = float32(0.0)
    for j in range(t, n_ * s_, width):
        d = x[j // s_, c, j % s_] - mean
        m2 += d * d
    partial[t] = m2
    m2 = _tree_sum(partial, t, width)
    if t == 0:
        _save_stats(c, mean, m2, n_ * s_, save_mean, save_invstd, running_mean, running_var, momentum, eps,
                    update)


@cuda_kernel("void(float32[:, :, ::1], float32[::1], float32[::1], float32[::1], float32[::1], "
             "float32[:, :, ::1])")
def _bn_apply_v1(x, gamma, beta, mean, invstd, y):
    # y = (x - mean) * invstd * gamma + beta, one thread per element (training forward).
    i = cuda.grid(1)
    n_, c_, s_ = x.shape
    if i < n_ * c_ * s_:
        b, c, s = i // (c_ * s_), (i // s_) % c_, i % s_
        y[b, c, s] = (x[b, c, s] - mean[c]) * invstd[c] * gamma[c] + beta[c]


@cuda_kernel("void(float32[:, :, ::1], float32[::1], float32[::1], float32[::1], float32[::1], "
             "float32[:, :, ::1], float32)")
def _bn_infer_v1(x, gamma, beta, running_mean, running_var, y, eps):
    # Inference: the same formula with the running statistics.
    i = cuda.grid(1)
    n_, c_, s_ = x.shape
    if i < n_ * c_ * s_:
        b, c, s = i // (c_ * s_), (i // s_) % c_, i % s_
        invstd = float32(1.0) / math.sqrt(running_var[c] + eps)
        y[b, c, s] = (x[b, c, s] - running_mean[c]) * invstd * gamma[c] + beta[c]


_GRAD_SIG = ("void(float32[:, :, ::1], float32[:, :, ::1], float32[::1], float32[::1], float32[::1], "
             "float32[::1])")


@cuda_kernel(_GRAD_SIG)
def _bn_param_grad_v1(x, dy, save_mean, save_invstd, dgamma, dbeta):
    # Naive: one thread per channel; dbeta = sum dy, dgamma = sum dy * xhat, in memory order.
    c = cuda.grid(1)
    n_, c_, s_ = x.shape
    if c < c_:
        db = float32(0.0)
        dg = float32(0.0)
        for b in range(n_):
            for s in range(s_):
                g = dy[b, c, s]
                db += g
                dg += g * ((x[b, c, s] - save_mean[c]) * save_invstd[c])
        dgamma[c] = dg
        dbeta[c] = db


@cuda_kernel(_GRAD_SIG)
def _bn_param_grad_v2(x, dy, save_mean, save_invstd, dgamma, dbeta):
    # One block per channel: strided per-thread sums, then two fixed-shape trees.
    part_b = cuda.shared.array(BN_BLOCK, float32)
    part_g = cuda.shared.array(BN_BLOCK, float32)
    c = cuda.blockIdx.x
    t = cuda.threadIdx.x
    width = cuda.blockDim.x
    n_, _, s_ = x.shape
    mean = save_mean[c]
    invstd = save_invstd[c]
    db = float32(0.0)
    dg = float32(0.0)
    for j in range(t, n_ * s_, width):
        g = dy[j // s_, c, j % s_]
        db += g
        dg += g * ((x[j // s_, c, j % s_] - mean) * invstd)
    part_b[t] = db
    part_g[t] = dg
    db = _tree_sum(part_b, t, width)
    dg = _tree_sum(part_g, t, width)
    if t == 0:
        dgamma[c] = dg
        dbeta[c] = db


@cuda_kernel("void(float32[:, :, ::1], float32[:, :, ::1], float32[::1], float32[::1], float32[::1], "
             "float32[::1], float32[::1], float32[:, :, ::1])")
def _bn_input_grad_v1(x, dy, gamma, save_mean, save_invstd, dgamma, dbeta, dx):
    # dx = gamma * invstd / n * (n * dy - dbeta - xhat * dgamma), one thread per element.
    i = cuda.grid(1)
    n_, c_, s_ = x.shape
    if i < n_ * c_ * s_:
        b, c, s = i // (c_ * s_), (i // s_) % c_, i % s_
        n = float32(n_ * s_)
        xhat = (x[b, c, s] - save_mean[c]) * save_invstd[c]
        scale = gamma[c] * save_invstd[c] / n
        dx[b, c, s] = scale * (n * dy[b, c, s] - dbeta[c] - xhat * dgamma[c])


# ---------------------------------------------------------------- launchers
def _ncs(op, name, x, c=None):
    """Check ``x`` is float32 (N, C, ...) and return its (N, C, S) view."""
    check(f"{op} {name}", x)
    if x.ndim < 2:
        raise ValueError(f"{op} {name}: expected (N, C, ...) with at least 2 dimensions, got shape "
                         f"{tuple(x.shape)}")
    n, ch = x.shape[:2]
    if c is not None and ch != c:
        raise ValueError(f"{op} {name}: expected {c} channels, got shape {tuple(x.shape)}")
    return x.reshape(n, ch, x.size // (n * ch) if n * ch else 0)


def _channels(op, c, **vectors):
    for name, v in vectors.items():
        check(f"{op} {name}", v, shape=(c,))


def _reduce_block(op, block):
    b = BN_BLOCK if block is None else int(block)
    if b < 1 or b > BN_BLOCK or b & (b - 1):
        raise ValueError(f"{op}: block must be a power of two between 1 and {BN_BLOCK}, got {block!r}")
    return b


def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, *,
                            momentum=0.1, eps=1e-5, update_running=True, stream=0, version="v2", block=None):
    """Training forward; ``block`` (v2 only) is the threads per channel, a power of two <= BN_BLOCK."""
    op = "batchnorm_forward_train"
    check_version(version, VERSIONS)
    x3 = _ncs(op, "x", x)
    y3 = _ncs(op, "y", y)
    check(f"{op} y", y, shape=x.shape)
    c = x.shape[1]
    _channels(op, c, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var,
              save_mean=save_mean, save_invstd=save_invstd)
    n = _count(x)
    if c and n < 2:
        raise ValueError(f"{op}: expected more than 1 value per channel (N*H*W), got {n}")
    if c == 0:
        return
    args = (x3, save_mean, save_invstd, running_mean, running_var, np.float32(momentum), np.float32(eps),
            bool(update_running))
    if version == "v1":
        _bn_stats_v1[ceil_div(c, BLOCK), BLOCK, stream](*args)
    else:
        _bn_stats_v2[c, _reduce_block(op, block), stream](*args)
    _bn_apply_v1[ceil_div(x.size, BLOCK), BLOCK, stream](x3, gamma, beta, save_mean, save_invstd, y3)


def batchnorm_backward(x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta, *, stream=0, version="v2",
                       block=None):
    """Training-mode backward from the statistics the forward saved; dx may alias dy."""
    op = "batchnorm_backward"
    check_version(version, VERSIONS)
    x3 = _ncs(op, "x", x)
    c = x.shape[1]
    dy3 = _ncs(op, "dy", dy, c)
    dx3 = _ncs(op, "dx", dx, c)
    check(f"{op} dy", dy, shape=x.shape)
    check(f"{op} dx", dx, shape=x.shape)
    _channels(op, c, gamma=gamma, save_mean=save_mean, save_invstd=save_invstd, dgamma=dgamma, dbeta=dbeta)
    if c == 0:
        return
    args = (x3, dy3, save_mean, save_invstd, dgamma, dbeta)
    if version == "v1":
        _bn_param_grad_v1[ceil_div(c, BLOCK), BLOCK, stream](*args)
    else:
        _bn_param_grad_v2[c, _reduce_block(op, block), stream](*args)
    if x.size:
        _bn_input_grad_v1[ceil_div(x.size, BLOCK), BLOCK, stream](x3, dy3, gamma, save_mean, save_invstd,
                                                                  dgamma, dbeta, dx3)


def batchnorm_forward_infer(x, gamma, beta, running_mean, running_var, y, *, eps=1e-5,
                            stream=0, version="v1"):
    op = "batchnorm_forward_infer"
    check_version(version, ("v1",))
    x3 = _ncs(op, "x", x)
    y3 = _ncs(op, "y", y)
    check(f"{op} y", y, shape=x.shape)
    _channels(op, x.shape[1], gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var)
    if x.size:
        _bn_infer_v1[ceil_div(x.size, BLOCK), BLOCK, stream](x3, gamma, beta, running_mean, running_var, y3,
                                                             np.float32(eps))


OPS = {
    "batchnorm_forward_train": Op("batchnorm_forward_train", batchnorm_forward_train_ref,
                                  batchnorm_forward_train, VERSIONS),
    "batchnorm_backward": Op("batchnorm_backward", batchnorm_backward_ref, batchnorm_backward, VERSIONS),
    "batchnorm_forward_infer": Op("batchnorm_forward_infer", batchnorm_forward_infer_ref,
                                  batchnorm_forward_infer),
}


def examples(rng):
    r, nan = example_arrays(rng)
    def train(shape, label, block=8, **kw):
        c = shape[1]
        args = (r(*shape, loc=3.0), r(c), r(c), nan(*shape), r(c), np.abs(r(c)) + 0.5, nan(c), nan(c))
        return Example("batchnorm_forward_train", args, (3, 4, 5, 6, 7), kwargs=kw, launch={"block": block},
                       rtol=1e-4, atol=1e-5, label=label)

    def backward(shape, label, alias=False):
        c = shape[1]
        x, dy = r(*shape), r(*shape)
        mean = x.mean(axis=_axes(x)).astype(np.float32)
        invstd = (1 / np.sqrt(x.var(axis=_axes(x)) + 1e-5)).astype(np.float32)
        args = (x, dy, r(c), mean, invstd, dy if alias else nan(*shape), nan(c), nan(c))
        return Example("batchnorm_backward", args, (5, 6, 7), launch={"block": 8}, rtol=1e-4, atol=1e-5,
                       label=label)

    return [
        train((3, 5, 4, 3), "3x5x4x3"),
        train((2, 3, 7, 5), "momentum=.3 eps=1e-3", momentum=0.3, eps=1e-3),
        train((4, 2, 3, 3), "update_running=False", update_running=False),
        train((6, 7), "(N, C) input", block=4),
        train((2, 2, 1, 1), "n=2 per channel"),
        backward((3, 5, 4, 3), "3x5x4x3"),
        backward((2, 3, 5, 3), "dx aliases dy", alias=True),
        backward((9, 4), "(N, C) input"),
        Example("batchnorm_forward_infer",
                (r(2, 3, 5, 4), r(3), r(3), r(3), np.abs(r(3)) + 0.1, nan(2, 3, 5, 4)), (5,),
                kwargs={"eps": 1e-3}, rtol=1e-5, atol=1e-5, label="2x3x5x4"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
