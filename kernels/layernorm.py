"""Layer normalization over the channels of each pixel, and the per-channel layer scale: what ConvNeXt
adds to the layers of 2015. Forward and backward, each as PyTorch computes it.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.layernorm

- layer_norm: ConvNeXt's ``F.layer_norm(x.permute(0, 2, 3, 1), (C,), weight, bias, eps)`` permuted
  back, computed on the NCHW layout itself (no permute): at each pixel (n, h, w) the C values
  x[n, :, h, w] are normalized, then scaled and shifted per channel::

      mean = sum_c x / C,   var = sum_c (x - mean)^2 / C   (biased; two passes: no cancellation)
      rstd = 1 / sqrt(var + eps),   y = (x - mean) * rstd * weight[c] + bias[c]

  The forward saves mean and rstd per pixel (N*H*W values each, laid out as (N, H, W); any shape of
  that size is accepted). Backward, with xhat = (x - mean) * rstd and g = dy * weight[c]::

      dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))      (means over the pixel's C channels)
      dweight[c] = sum_{n, h, w} dy * xhat,   dbias[c] = sum_{n, h, w} dy

- layer_scale (ConvNeXt's learned per-channel scale, PyTorch's parameter of shape (C, 1, 1); any
  shape of C elements is accepted): y[n, c, h, w] = x[n, c, h, w] * gamma[c]; backward
  dx = dy * gamma[c] and dgamma[c] = sum_{n, h, w} dy * x.

Canonical orders, all in float32 from 0.0, no atomics (so every result is bit-reproducible): one
thread per pixel adds its channels in ascending c (the mean, then the squared deviations, then in
backward the two channel means); one thread per channel adds the parameters' gradients over
(n, h, w) in memory order. The backward launches the per-channel reduction first, then the
element-wise kernel. y may alias x (a thread reads its pixel's channels before it writes them);
in both backwards dx must NOT alias dy or x. One version (v1): these are memory-bound.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_apart, check_version, contiguous, cuda_kernel, flat, launch_1d

BLOCK = 256  # threads per block
VERSIONS = ("v1",)


# ---------------------------------------------------------------- NumPy references
def _per_channel(v):
    return v.reshape(1, -1, 1, 1)


def _per_pixel(v, x):
    n, _, h, w = x.shape
    return v.reshape(n, 1, h, w)


def layer_norm_forward_ref(x, weight, bias, y, save_mean, save_rstd, *, eps):
    """y may alias x (it is written last)."""
    t = x.dtype.type
    c = t(x.shape[1])
    mean = np.sum(x, axis=1, keepdims=True, dtype=x.dtype) / c
    var = np.sum((x - mean) ** 2, axis=1, keepdims=True, dtype=x.dtype) / c
    rstd = t(1) / np.sqrt(var + t(eps))
    save_mean[...] = mean.reshape(save_mean.shape)
    save_rstd[...] = rstd.reshape(save_rstd.shape)
    y[...] = (x - mean) * rstd * _per_channel(weight) + _per_channel(bias)


def layer_norm_backward_ref(x, dy, weight, save_mean, save_rstd, dx, dweight, dbias):
    t = x.dtype.type
    c = t(x.shape[1])
    rstd = _per_pixel(save_rstd, x)
    xhat = (x - _per_pixel(save_mean, x)) * rstd
    g = dy * _per_channel(weight)
    mean_g = np.sum(g, axis=1, keepdims=True, dtype=x.dtype) / c
    mean_gx = np.sum(g * xhat, axis=1, keepdims=True, dtype=x.dtype) / c
    dweight[...] = np.sum(dy * xhat, axis=(0, 2, 3), dtype=x.dtype)
    dbias[...] = np.sum(dy, axis=(0, 2, 3), dtype=x.dtype)
    dx[...] = rstd * (g - mean_g - xhat * mean_gx)


def layer_scale_forward_ref(x, gamma, y):
    y[...] = x * _per_channel(gamma)


def layer_scale_backward_ref(x, gamma, dy, dx, dgamma):
    dgamma[...] = np.sum(dy * x, axis=(0, 2, 3), dtype=x.dtype).reshape(dgamma.shape)
    dx[...] = dy * _per_channel(gamma)


# ---------------------------------------------------------------- kernels
_F3 = "float32[:, :, ::1]"  # an (N, C, H, W) array as (N, C, H*W)
_F1 = "float32[::1]"


@cuda_kernel(f"void({_F3}, {_F1}, {_F1}, {_F3}, {_F1}, {_F1}, float32)")
def _layer_norm_forward_v1(x, weight, bias, y, save_mean, save_rstd, eps):
    # One thread per pixel p = n * S + s: its C channels in ascending order, three passes.
    p = cuda.grid(1)
    n_, c_, s_ = x.shape
    if p < n_ * s_:
        b, s = p // s_, p % s_
        acc = float32(0.0)
        for c in range(c_):
            acc += x[b, c, s]
        mean = acc / float32(c_)
        m2 = float32(0.0)
        for c in range(c_):
            d = x[b, c, s] - mean
            m2 += d * d
        rstd = float32(1.0) / math.sqrt(m2 / float32(c_) + eps)
        save_mean[p] = mean
        save_rstd[p] = rstd
        for c in range(c_):
            y[b, c, s] = (x[b, c, s] - mean) * rstd * weight[c] + bias[c]


@cuda_kernel(f"void({_F3}, {_F3}, {_F1}, {_F1}, {_F1}, {_F3})")
def _layer_norm_backward_dx_v1(x, dy, weight, save_mean, save_rstd, dx):
    # One thread per pixel: the two channel means in ascending c, then the pixel's dx.
    p = cuda.grid(1)
    n_, c_, s_ = x.shape
    if p < n_ * s_:
        b, s = p // s_, p % s_
        mean = save_mean[p]
        rstd = save_rstd[p]
        sg = float32(0.0)
        sgx = float32(0.0)
        for c in range(c_):
            g = dy[b, c, s] * weight[c]
            sg += g
            sgx += g * ((x[b, c, s] - mean) * rstd)
        mean_g = sg / float32(c_)
        mean_gx = sgx / float32(c_)
        for c in range(c_):
            xhat = (x[b, c, s] - mean) * rstd
            dx[b, c, s] = rstd * (dy[b, c, s] * weight[c] - mean_g - xhat * mean_gx)


@cuda_kernel(f"void({_F3}, {_F3}, {_F1}, {_F1}, {_F1}, {_F1})")
def _layer_norm_backward_params_v1(x, dy, save_mean, save_rstd, dweight, dbias):
    # One thread per channel: dweight = sum dy * xhat, dbias = sum dy, over (n, h, w) in memory order.
    c = cuda.grid(1)
    n_, c_, s_ = x.shape
    if c < c_:
        dw = float32(0.0)
        db = float32(0.0)
        for b in range(n_):
            for s in range(s_):
                p = b * s_ + s
                g = dy[b, c, s]
                db += g
                dw += g * ((x[b, c, s] - save_mean[p]) * save_rstd[p])
        dweight[c] = dw
        dbias[c] = db


@cuda_kernel(f"void({_F3}, {_F1}, {_F3})")
def _layer_scale_forward_v1(x, gamma, y):
    # y = x * gamma[c], one thread per element (the backward's dx = dy * gamma[c] too).
    i = cuda.grid(1)
    n_, c_, s_ = x.shape
    if i < n_ * c_ * s_:
        b, c, s = i // (c_ * s_), (i // s_) % c_, i % s_
        y[b, c, s] = x[b, c, s] * gamma[c]


@cuda_kernel(f"void({_F3}, {_F3}, {_F1})")
def _layer_scale_backward_dgamma_v1(x, dy, dgamma):
    # One thread per channel: dgamma = sum dy * x over (n, h, w) in memory order.
    c = cuda.grid(1)
    n_, c_, s_ = x.shape
    if c < c_:
        acc = float32(0.0)
        for b in range(n_):
            for s in range(s_):
                acc += dy[b, c, s] * x[b, c, s]
        dgamma[c] = acc


# ---------------------------------------------------------------- launchers
def _nchw(op, name, a, shape=None):
    """Check ``a`` is a float32 (N, C, H, W) array (of ``shape``, if given); return its (N, C, H*W) view."""
    check(f"{op} {name}", a, shape=shape)
    if a.ndim != 4:
        raise ValueError(f"{op} {name}: expected an (N, C, H, W) array, got shape {tuple(a.shape)}")
    contiguous(f"{op} {name}", a)
    n, c, h, w = a.shape
    return a.reshape(n, c, h * w)


def _elements(op, name, a, size, what):
    """Check ``a`` is float32 with ``size`` elements, any shape; return it as 1-D."""
    check(f"{op} {name}", a)
    if a.size != size:
        raise ValueError(f"{op} {name}: expected {size} elements ({what}), got shape {tuple(a.shape)}")
    contiguous(f"{op} {name}", a)
    return flat(a)


def _stats(op, x, **arrays):
    """The saved per-pixel statistics, each N*H*W values laid out as (N, H, W), as 1-D."""
    n, _, h, w = x.shape
    return [_elements(op, name, a, n * h * w, f"N*H*W, laid out as (N, H, W) = {(n, h, w)}")
            for name, a in arrays.items()]


def _channels(op, x, **arrays):
    """Per-channel vectors of exactly shape (C,)."""
    for name, a in arrays.items():
        check(f"{op} {name}", a, shape=(x.shape[1],))


def _some_channels(op, x):
    if x.shape[1] < 1:
        raise ValueError(f"{op}: expected at least 1 channel to normalize over, got shape {tuple(x.shape)}")


def layer_norm_forward(x, weight, bias, y, save_mean, save_rstd, *, eps, stream=0, version="v1", block=BLOCK):
    """Normalize each pixel of x over its channels; ``y`` may be the same array as ``x``."""
    op = "layer_norm_forward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    y3 = _nchw(op, "y", y, shape=x.shape)
    _some_channels(op, x)
    _channels(op, x, weight=weight, bias=bias)
    mean, rstd = _stats(op, x, save_mean=save_mean, save_rstd=save_rstd)
    launch_1d(_layer_norm_forward_v1, mean.size, block, stream, x3, weight, bias, y3, mean, rstd,
              np.float32(eps))


def layer_norm_backward(x, dy, weight, save_mean, save_rstd, dx, dweight, dbias, *, stream=0, version="v1",
                        block=BLOCK):
    """Gradient of layer_norm_forward from the statistics it saved; ``dx`` must not alias ``dy`` or ``x``."""
    op = "layer_norm_backward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    dy3 = _nchw(op, "dy", dy, shape=x.shape)
    dx3 = _nchw(op, "dx", dx, shape=x.shape)
    _some_channels(op, x)
    _channels(op, x, weight=weight, dweight=dweight, dbias=dbias)
    mean, rstd = _stats(op, x, save_mean=save_mean, save_rstd=save_rstd)
    check_apart(op, ("dx", dx), ("x", x), ("dy", dy))
    launch_1d(_layer_norm_backward_params_v1, x.shape[1], block, stream, x3, dy3, mean, rstd, dweight, dbias)
    launch_1d(_layer_norm_backward_dx_v1, mean.size, block, stream, x3, dy3, weight, mean, rstd, dx3)


def _gamma(op, x, name, gamma):
    return _elements(op, name, gamma, x.shape[1], "C, one per channel")


def layer_scale_forward(x, gamma, y, *, stream=0, version="v1", block=BLOCK):
    """y = x * gamma[c]; ``gamma`` of any shape with C elements (PyTorch's (C, 1, 1))."""
    op = "layer_scale_forward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    y3 = _nchw(op, "y", y, shape=x.shape)
    launch_1d(_layer_scale_forward_v1, x.size, block, stream, x3, _gamma(op, x, "gamma", gamma), y3)


def layer_scale_backward(x, gamma, dy, dx, dgamma, *, stream=0, version="v1", block=BLOCK):
    """dgamma[c] = sum of dy * x over (n, h, w), then dx = dy * gamma[c]; ``dx`` must not alias ``dy``
    or ``x``. ``gamma`` and ``dgamma``: any shape with C elements."""
    op = "layer_scale_backward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    dy3 = _nchw(op, "dy", dy, shape=x.shape)
    dx3 = _nchw(op, "dx", dx, shape=x.shape)
    g = _gamma(op, x, "gamma", gamma)
    dg = _gamma(op, x, "dgamma", dgamma)
    check_apart(op, ("dx", dx), ("x", x), ("dy", dy))
    launch_1d(_layer_scale_backward_dgamma_v1, x.shape[1], block, stream, x3, dy3, dg)
    launch_1d(_layer_scale_forward_v1, x.size, block, stream, dy3, g, dx3)


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "layer_norm_forward", "layer_norm_backward", "layer_scale_forward", "layer_scale_backward")}


def examples(rng):
    r, nan = example_arrays(rng)
    tol = {"rtol": 1e-4, "atol": 1e-5}

    def forward(shape, label, eps=1e-5, loc=0.0, stats=None, alias=False, block=BLOCK):
        n, c, h, w = shape
        x = r(*shape, loc=loc)
        stats = stats or (n, h, w)
        args = (x, r(c), r(c), x if alias else nan(*shape), nan(*stats), nan(*stats))
        return Example("layer_norm_forward", args, (3, 4, 5), kwargs={"eps": eps}, launch={"block": block},
                       label=label, **tol)

    def backward(shape, label, loc=0.0, eps=1e-5):
        n, c, h, w = shape
        x, weight = r(*shape, loc=loc), r(c)
        mean, rstd = np.empty((n, h, w), np.float32), np.empty((n, h, w), np.float32)
        layer_norm_forward_ref(x, weight, r(c), np.empty_like(x), mean, rstd, eps=eps)
        args = (x, r(*shape), weight, mean, rstd, nan(*shape), nan(c), nan(c))
        return Example("layer_norm_backward", args, (5, 6, 7), launch={"block": 8}, label=label, **tol)

    xs, dys = r(2, 4, 3, 5), r(2, 4, 3, 5)
    return [
        forward((2, 5, 3, 3), "2x5x3x3", block=8),
        forward((3, 4, 2, 5), "mean 3, eps=1e-6", eps=1e-6, loc=3.0),
        forward((2, 3, 2, 3), "stats (N, 1, H, W)", stats=(2, 1, 2, 3)),
        forward((2, 1, 3, 2), "C=1: var 0"),
        forward((1, 6, 1, 1), "1x1 pixel"),
        forward((2, 3, 4, 2), "y aliases x", alias=True),
        backward((2, 5, 3, 3), "2x5x3x3"),
        backward((3, 4, 2, 3), "mean 3", loc=3.0),
        backward((2, 1, 2, 3), "C=1"),
        Example("layer_scale_forward", (xs, r(4, 1, 1), nan(*xs.shape)), (2,), label="gamma (C, 1, 1)"),
        Example("layer_scale_forward", (r(3, 2, 1, 4), r(2), nan(3, 2, 1, 4)), (2,), launch={"block": 8},
                label="gamma (C,)"),
        Example("layer_scale_backward", (xs, r(4, 1, 1), dys, nan(*xs.shape), nan(4, 1, 1)), (3, 4),
                launch={"block": 8}, **tol, label="2x4x3x5"),
        Example("layer_scale_backward", (r(3, 2, 1, 4), r(2), r(3, 2, 1, 4), nan(3, 2, 1, 4), nan(2)), (3, 4),
                **tol, label="gamma (C,)"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
