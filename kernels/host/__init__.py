"""Fast kernels for the host device: the same ops as the references, written for speed (NumPy,
BLAS, and a few loops compiled by Numba).

The references (``op_ref`` in each family) are written to be read: they say what an op computes,
and the tests compare every CUDA kernel with them. They are not written to be fast, and the host
device, which is how most users train on a laptop, paid for it: a conv's weight gradient through
``np.einsum`` (which does not use BLAS), max pooling as a window view reduced with ``.max``, its
gradient through ``np.add.at``. This package holds faster versions of the ops where the time goes;
the host device runs ``host_kernel(op)``, the fast version where there is one, else the reference.

How they are fast, and what they keep:
- Convolution, all three directions, is im2col plus ONE BLAS matrix product over the whole batch:
  the column buffer is laid out (K, N*P) (K = C*KH*KW, P = OH*OW), so forward is ``w (Cout x K) @
  col``, backward-filter ``(col @ dy^T)^T`` for dy as (Cout x N*P) (the sum over images and
  positions inside the BLAS reduction) and backward-data ``w^T @ dy`` followed by col2im's gather
  in (kh, kw) order (compiled, :func:`kernels.host.conv._col2im`). The columns are copied tap by
  tap from x, the padding's share zeroed (no padded copy of x), into rows one cache line longer
  than their width (``conv._rows``). The results agree with the references within the conv
  tolerance (rtol 1e-4, atol 1e-5): a BLAS sums in its own order, so the bits can differ from the
  reference's.
- With stride 1 and a kernel of at most 3x3 and at least as many input as output channels
  (``conv._transposed``), backward-data is instead the forward conv of dy with the flipped,
  transposed filter, and backward-filter, which runs first, computes dw from those same columns
  of dy and leaves them for it: one column buffer for the layer's backward instead of two. They
  are used only for a dy with the same bits (``conv._DY``); otherwise backward-data makes its own.
- Batch normalization, the pooling gradients, average pooling and ReLU's gradient are loops compiled
  by Numba for the CPU (``njit``, cached on disk beside their files), where NumPy needs a pass over
  the tensor per expression: batch norm takes a channel at a time, so its rows stay in the cache
  between the sums and the elementwise formula (one read of x forward where NumPy made five); its
  row sums let the compiler split them over vector lanes (``fastmath={"reassoc"}``, nothing else).
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
This package never imports snlite. One module per kernel family, as in ``kernels/``: ``conv``,
``pooling``, ``batchnorm``, ``activation``; this file holds what they share.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

FAST: dict = {}  # op name -> fast host function
# The loops compiled for the CPU: cached on disk beside their files (compiling them all takes about
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


def _compiled_takes(*arrays):
    """Whether the compiled loops take these arrays: C-contiguous float32 (else the reference does)."""
    return all(a.flags.c_contiguous and a.dtype == np.float32 for a in arrays)


# each family's module registers its ops in FAST as it is imported
from kernels.host.activation import relu6_backward, relu6_forward, relu_backward, relu_forward  # noqa: E402
from kernels.host.batchnorm import batchnorm_backward, batchnorm_forward_train  # noqa: E402
from kernels.host.conv import conv2d_backward_data, conv2d_backward_filter, conv2d_forward  # noqa: E402
from kernels.host.pooling import (avgpool2d_backward, avgpool2d_forward, maxpool2d_backward,  # noqa: E402
                                  maxpool2d_forward)

__all__ = ["FAST", "compiled", "fast", "host_kernel", "matmul",
           "avgpool2d_backward", "avgpool2d_forward", "batchnorm_backward", "batchnorm_forward_train",
           "conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward", "maxpool2d_backward",
           "maxpool2d_forward", "relu6_backward", "relu6_forward", "relu_backward", "relu_forward"]
