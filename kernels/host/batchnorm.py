"""The host device's batch normalization: compiled loops that take a channel at a time (see
:mod:`kernels.host`)."""
from __future__ import annotations

import numpy as np

from kernels.batchnorm import batchnorm_backward_ref, batchnorm_forward_train_ref, save_statistics
from kernels.host import _compiled_takes, compiled, fast


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


@fast("batchnorm_forward_train")
def batchnorm_forward_train(x, gamma, beta, y, running_mean, running_var, save_mean, save_invstd, *,
                            momentum=0.1, eps=1e-5, update_running=True):
    """The reference's statistics and update, a channel at a time (:func:`_bn_forward`)."""
    c = x.shape[1] if x.ndim > 1 else 0
    n = x.size // c if c else 0
    if n < 2:
        raise ValueError(f"batchnorm_forward_train: expected more than 1 value per channel, got {n}")
    if not _compiled_takes(x, y, gamma, beta):
        return batchnorm_forward_train_ref(x, gamma, beta, y, running_mean, running_var, save_mean,
                                           save_invstd, momentum=momentum, eps=eps,
                                           update_running=update_running)
    mean, m2, invstd = (np.empty(c, x.dtype) for _ in range(3))
    _bn_forward(x.reshape(x.shape[0], c, -1), gamma, beta, np.float32(eps), y.reshape(x.shape[0], c, -1),
                mean, m2, invstd)
    save_statistics(mean, m2, invstd, n, save_mean, save_invstd, running_mean, running_var,
                    momentum, update_running)


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
