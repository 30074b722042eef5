"""Sigmoid, the activations built on it or shaped like it (SiLU, Hardsigmoid, Hardswish, Tanh, GELU and
its tanh approximation),
and the channel scale that squeeze-and-excitation multiplies a feature map by: what MobileNet-V3,
EfficientNet and RegNet-Y add to the layers of 2015, and what other networks use in their place.
Forward and backward, each as PyTorch's CPU kernels compute it.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.sigmoid

- sigmoid: y = 1 / (1 + exp(-x)); backward dx = dy * (1 - y) * y, from y (as PyTorch's
  ``sigmoid_backward``), so ``sigmoid_backward(y, dy, dx)``; the others' backward take x, dy and dx.
- silu (x times its sigmoid, EfficientNet's activation): y = x / (1 + exp(-x)); backward
  dx = dy * s * (1 + x * (1 - s)) with s = 1 / (1 + exp(-x)) (it reads x).
- hardsigmoid (a piecewise-linear sigmoid, MobileNet-V3's gate): y = min(max(x + 3, 0), 6) / 6;
  backward dx = dy / 6 where -3 < x < 3, else 0.
- hardswish (x times its hardsigmoid, MobileNet-V3's activation): y = x * min(max(x + 3, 0), 6) / 6;
  backward dx = 0 where x <= -3, dy * (x / 3 + 0.5) where x < 3, else dy (PyTorch's sides at -3 and 3).
- tanh: y = tanh(x); backward dx = dy * (1 - y * y), from y, as sigmoid's.
- gelu (PyTorch's exact GELU, ``approximate="none"``): y = x / 2 * (1 + erf(x / sqrt 2)); backward
  dx = dy * (cdf + x * pdf), cdf = (1 + erf(x / sqrt 2)) / 2, pdf = exp(-x * x / 2) / sqrt(2 pi) (it
  reads x).
- gelu_tanh (PyTorch's GELU with ``approximate="tanh"``): y = x / 2 * (1 + tanh(k (x + 0.044715 x^3))),
  k = sqrt(2 / pi); backward dx = dy * ((1 + t) / 2 + x / 2 * (1 - t * t) * k * (1 + 3 * 0.044715 x^2)),
  t = tanh(k (x + 0.044715 x^3)), as PyTorch's ``GeluBackwardKernel`` (it reads x).
- channel_scale (squeeze-and-excitation's last step): y[n, c, h, w] = x[n, c, h, w] * s[n, c], s of
  shape (N, C, 1, 1) (the gate: a sigmoid of two 1x1 convolutions of x's channel means); backward
  dx = dy * s, and ds[n, c] = the sum over (h, w), in that order, of dy * x: one thread per (n, c), a
  fixed order, no atomics.

Each activation's backward may write dx into dy's buffer (each thread reads dy[i] before it writes
dx[i] and touches no other element), as ReLU's does. One version (v1): these are memory-bound.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_version, cuda_kernel, exp32, flat, launch_1d

BLOCK = 256  # threads per block
VERSIONS = ("v1",)
FROM_OUTPUT = ("sigmoid", "tanh")  # the activations whose backward reads y, not x


# ---------------------------------------------------------------- NumPy references
def _exp(v):
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x below about -88: y is then 0
        return np.exp(v)


def sigmoid_forward_ref(x, y):
    one = x.dtype.type(1)
    y[...] = one / (one + _exp(-x))


def sigmoid_backward_ref(y, dy, dx):
    """dx = dy * (1 - y) * y; dx may alias dy (the product is taken first)."""
    dx[...] = dy * (y.dtype.type(1) - y) * y


def silu_forward_ref(x, y):
    y[...] = x / (x.dtype.type(1) + _exp(-x))


def silu_backward_ref(x, dy, dx):
    one = x.dtype.type(1)
    s = one / (one + _exp(-x))
    dx[...] = dy * s * (one + x * (one - s))


def hardsigmoid_forward_ref(x, y):
    t = x.dtype.type
    y[...] = np.minimum(np.maximum(x + t(3), t(0)), t(6)) / t(6)


def hardsigmoid_backward_ref(x, dy, dx):
    t = x.dtype.type
    dx[...] = np.where((x > t(-3)) & (x < t(3)), dy / t(6), t(0))


def hardswish_forward_ref(x, y):
    t = x.dtype.type
    y[...] = x * np.minimum(np.maximum(x + t(3), t(0)), t(6)) / t(6)


def hardswish_backward_ref(x, dy, dx):
    t = x.dtype.type
    dx[...] = np.where(x <= t(-3), t(0), np.where(x < t(3), dy * (x / t(3) + t(0.5)), dy))


def tanh_forward_ref(x, y):
    y[...] = np.tanh(x)


def tanh_backward_ref(y, dy, dx):
    """dx = dy * (1 - y * y); dx may alias dy."""
    dx[...] = dy * (y.dtype.type(1) - y * y)


SQRT1_2 = 0.7071067811865476  # 1 / sqrt(2), as PyTorch's M_SQRT1_2
GELU_PDF = 0.3989422804014327  # 1 / sqrt(2 pi): PyTorch's M_2_SQRTPI * M_SQRT1_2 * 0.5


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v).astype(v.dtype)


def gelu_forward_ref(x, y):
    t = x.dtype.type
    y[...] = x * t(0.5) * (t(1) + _erf(x * t(SQRT1_2)))


def gelu_backward_ref(x, dy, dx):
    t = x.dtype.type
    cdf = t(0.5) * (t(1) + _erf(x * t(SQRT1_2)))
    pdf = np.exp(t(-0.5) * x * x) * t(GELU_PDF)
    dx[...] = dy * (cdf + x * pdf)


GELU_TANH_BETA = 0.7978845608028654  # sqrt(2 / pi): PyTorch's M_SQRT2 * M_2_SQRTPI * 0.5
GELU_TANH_KAPPA = 0.044715


def gelu_tanh_forward_ref(x, y):
    t = x.dtype.type
    inner = t(GELU_TANH_BETA) * (x + t(GELU_TANH_KAPPA) * (x * x * x))
    y[...] = t(0.5) * x * (t(1) + np.tanh(inner))


def gelu_tanh_backward_ref(x, dy, dx):
    t = x.dtype.type
    x_sq = x * x
    th = np.tanh(t(GELU_TANH_BETA) * (x + t(GELU_TANH_KAPPA) * (x_sq * x)))
    inner_d = t(GELU_TANH_BETA) * (t(1) + t(3 * GELU_TANH_KAPPA) * x_sq)
    dx[...] = dy * (t(0.5) * (t(1) + th) + t(0.5) * x * (t(1) - th * th) * inner_d)


def channel_scale_forward_ref(x, s, y):
    y[...] = x * s  # s is (N, C, 1, 1): broadcast over (h, w)


def channel_scale_backward_ref(x, s, dy, dx, ds):
    n, c = x.shape[:2]
    ds[...] = np.sum((dy * x).reshape(n, c, -1), axis=2, dtype=np.float32).reshape(ds.shape)
    dx[...] = dy * s


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[::1], float32[::1])")
def _sigmoid_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = float32(1.0) / (float32(1.0) + exp32(-x[i]))


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _sigmoid_backward_v1(y, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = y[i]
        dx[i] = dy[i] * (float32(1.0) - v) * v


@cuda_kernel("void(float32[::1], float32[::1])")
def _silu_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = v / (float32(1.0) + exp32(-v))


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _silu_backward_v1(x, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        s = float32(1.0) / (float32(1.0) + exp32(-v))
        dx[i] = dy[i] * s * (float32(1.0) + v * (float32(1.0) - s))


@cuda_kernel("void(float32[::1], float32[::1])")
def _hardsigmoid_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = min(max(x[i] + float32(3.0), float32(0.0)), float32(6.0)) / float32(6.0)


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _hardsigmoid_backward_v1(x, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        g = dy[i]
        dx[i] = g / float32(6.0) if float32(-3.0) < v < float32(3.0) else float32(0.0)


@cuda_kernel("void(float32[::1], float32[::1])")
def _hardswish_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = v * min(max(v + float32(3.0), float32(0.0)), float32(6.0)) / float32(6.0)


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _hardswish_backward_v1(x, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        g = dy[i]
        if v <= float32(-3.0):
            g = float32(0.0)
        elif v < float32(3.0):
            g = g * (v / float32(3.0) + float32(0.5))
        dx[i] = g


@cuda_kernel("void(float32[::1], float32[::1])")
def _tanh_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        y[i] = math.tanh(x[i])


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _tanh_backward_v1(y, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = y[i]
        dx[i] = dy[i] * (float32(1.0) - v * v)


@cuda_kernel("void(float32[::1], float32[::1])")
def _gelu_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = v * float32(0.5) * (float32(1.0) + math.erf(v * float32(SQRT1_2)))


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _gelu_backward_v1(x, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        cdf = float32(0.5) * (float32(1.0) + math.erf(v * float32(SQRT1_2)))
        pdf = math.exp(float32(-0.5) * v * v) * float32(GELU_PDF)
        dx[i] = dy[i] * (cdf + v * pdf)


@cuda_kernel("void(float32[::1], float32[::1])")
def _gelu_tanh_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        inner = float32(GELU_TANH_BETA) * (v + float32(GELU_TANH_KAPPA) * (v * v * v))
        y[i] = float32(0.5) * v * (float32(1.0) + math.tanh(inner))


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _gelu_tanh_backward_v1(x, dy, dx):
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        v_sq = v * v
        th = math.tanh(float32(GELU_TANH_BETA) * (v + float32(GELU_TANH_KAPPA) * (v_sq * v)))
        inner_d = float32(GELU_TANH_BETA) * (float32(1.0) + float32(3 * GELU_TANH_KAPPA) * v_sq)
        dx[i] = dy[i] * (float32(0.5) * (float32(1.0) + th)
                         + float32(0.5) * v * (float32(1.0) - th * th) * inner_d)


@cuda_kernel("void(float32[:, ::1], float32[::1], float32[:, ::1])")
def _channel_scale_forward_v1(x, s, y):
    # x and y as (N*C, H*W), s as N*C: one thread per element
    i = cuda.grid(1)
    hw = y.shape[1]
    if i < y.shape[0] * hw:
        r = i // hw
        y[r, i % hw] = x[r, i % hw] * s[r]


@cuda_kernel("void(float32[:, ::1], float32[::1], float32[:, ::1], float32[:, ::1], float32[::1])")
def _channel_scale_backward_v1(x, s, dy, dx, ds):
    # one thread per (n, c) row: ds in (h, w) order, then the row of dx
    r = cuda.grid(1)
    if r < ds.size:
        acc = float32(0.0)
        g = s[r]
        for j in range(dy.shape[1]):
            d = dy[r, j]
            acc += d * x[r, j]
            dx[r, j] = d * g
        ds[r] = acc


# ---------------------------------------------------------------- launchers
def _forward(name, kernel, x, y, stream, version, block):
    check_version(version, VERSIONS)
    check(f"{name} x", x)
    check(f"{name} y", y, shape=x.shape)
    launch_1d(kernel, y.size, block, stream, flat(x), flat(y))


def _backward(name, kernel, a, dy, dx, stream, version, block, a_name="x"):
    check_version(version, VERSIONS)
    check(f"{name} {a_name}", a)
    check(f"{name} dy", dy, shape=a.shape)
    check(f"{name} dx", dx, shape=a.shape)
    launch_1d(kernel, dx.size, block, stream, flat(a), flat(dy), flat(dx))


def sigmoid_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("sigmoid_forward", _sigmoid_forward_v1, x, y, stream, version, block)


def sigmoid_backward(y, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """dx = dy * (1 - y) * y, from the output y; ``dx`` may be the same array as ``dy``."""
    _backward("sigmoid_backward", _sigmoid_backward_v1, y, dy, dx, stream, version, block, a_name="y")


def silu_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("silu_forward", _silu_forward_v1, x, y, stream, version, block)


def silu_backward(x, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    _backward("silu_backward", _silu_backward_v1, x, dy, dx, stream, version, block)


def hardsigmoid_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("hardsigmoid_forward", _hardsigmoid_forward_v1, x, y, stream, version, block)


def hardsigmoid_backward(x, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """dx = dy / 6 where -3 < x < 3, else 0; ``dx`` may be the same array as ``dy``."""
    _backward("hardsigmoid_backward", _hardsigmoid_backward_v1, x, dy, dx, stream, version, block)


def hardswish_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("hardswish_forward", _hardswish_forward_v1, x, y, stream, version, block)


def hardswish_backward(x, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    _backward("hardswish_backward", _hardswish_backward_v1, x, dy, dx, stream, version, block)


def tanh_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("tanh_forward", _tanh_forward_v1, x, y, stream, version, block)


def tanh_backward(y, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """dx = dy * (1 - y * y), from the output y; ``dx`` may be the same array as ``dy``."""
    _backward("tanh_backward", _tanh_backward_v1, y, dy, dx, stream, version, block, a_name="y")


def gelu_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("gelu_forward", _gelu_forward_v1, x, y, stream, version, block)


def gelu_backward(x, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    _backward("gelu_backward", _gelu_backward_v1, x, dy, dx, stream, version, block)


def gelu_tanh_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _forward("gelu_tanh_forward", _gelu_tanh_forward_v1, x, y, stream, version, block)


def gelu_tanh_backward(x, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    _backward("gelu_tanh_backward", _gelu_tanh_backward_v1, x, dy, dx, stream, version, block)


def _rows(name, x, s):
    """x as (N*C, H*W) and s as N*C, after checking that s is x's (N, C, 1, 1)."""
    check(f"{name} x", x)
    if x.ndim != 4:
        raise ValueError(f"{name}: expected an (N, C, H, W) x, got shape {tuple(x.shape)}")
    n, c, h, w = x.shape
    check(f"{name} s", s, shape=(n, c, 1, 1))
    return x.reshape(n * c, h * w), s.reshape(n * c)


def channel_scale_forward(x, s, y, *, stream=0, version="v1", block=BLOCK):
    check_version(version, VERSIONS)
    x2, s1 = _rows("channel_scale_forward", x, s)
    check("channel_scale_forward y", y, shape=x.shape)
    launch_1d(_channel_scale_forward_v1, y.size, block, stream, x2, s1, y.reshape(x2.shape))


def channel_scale_backward(x, s, dy, dx, ds, *, stream=0, version="v1", block=BLOCK):
    """dx = dy * s and ds = dy * x summed over (h, w); ``dx`` may be the same array as ``dy``."""
    check_version(version, VERSIONS)
    x2, s1 = _rows("channel_scale_backward", x, s)
    check("channel_scale_backward dy", dy, shape=x.shape)
    check("channel_scale_backward dx", dx, shape=x.shape)
    check("channel_scale_backward ds", ds, shape=s.shape)
    launch_1d(_channel_scale_backward_v1, s1.size, block, stream, x2, s1, dy.reshape(x2.shape),
            dx.reshape(x2.shape), ds.reshape(s1.shape))


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "sigmoid_forward", "sigmoid_backward", "silu_forward", "silu_backward", "hardsigmoid_forward",
    "hardsigmoid_backward", "hardswish_forward", "hardswish_backward", "tanh_forward", "tanh_backward",
    "gelu_forward", "gelu_backward", "gelu_tanh_forward", "gelu_tanh_backward", "channel_scale_forward",
    "channel_scale_backward")}


def examples(rng):
    r, nan = example_arrays(rng)
    # the ends of each piece exactly (+-3, 0), just inside and outside them, large values either side
    x = (r(4, 3, 5, 7) * 3).astype(np.float32)
    f = np.float32  # float32's neighbours of -3 and 3 (a Python float's are float64's, which round back)
    x.flat[:10] = [-3.0, 3.0, 0.0, -0.0, np.nextafter(f(-3), f(0)), np.nextafter(f(3), f(4)), 50.0, -50.0,
                   80.0, -80.0]
    dy = r(*x.shape)
    out = []
    for act in ("sigmoid", "silu", "hardsigmoid", "hardswish", "tanh", "gelu", "gelu_tanh"):
        a = x
        if act in FROM_OUTPUT:  # its backward reads the output
            a = np.empty_like(x)
            globals()[f"{act}_forward_ref"](x, a)
        in_place = dy.copy()
        # gelu_tanh's backward, in PyTorch's float32 formula, cancels in 1 + tanh and 1 - tanh^2 for
        # x below about -3: up to 1.3e-6 from float64's at dy = 1 (the simulator's tanh is float64's)
        tol = {"atol": 4e-6} if act == "gelu_tanh" else {}
        out += [Example(f"{act}_forward", (x, nan(*x.shape)), (1,), label="4x3x5x7, the ends, large"),
                Example(f"{act}_forward", (r(301), nan(301)), (1,), launch={"block": 64}, label="1-D 301"),
                Example(f"{act}_backward", (a, dy, nan(*x.shape)), (2,), label="4x3x5x7", **tol),
                Example(f"{act}_backward", (a, in_place, in_place), (2,), label="dx aliases dy", **tol)]
    xs, s, dys = r(3, 4, 5, 6), r(3, 4, 1, 1), r(3, 4, 5, 6)
    in_place = dys.copy()
    out += [
        Example("channel_scale_forward", (xs, s, nan(*xs.shape)), (2,), label="3x4x5x6"),
        Example("channel_scale_forward", (r(2, 3, 1, 1), r(2, 3, 1, 1), nan(2, 3, 1, 1)), (2,), label="1x1"),
        Example("channel_scale_backward", (xs, s, dys, nan(*xs.shape), nan(*s.shape)), (3, 4),
                label="3x4x5x6", launch={"block": 8}),
        Example("channel_scale_backward", (xs, s, in_place, in_place, nan(*s.shape)), (3, 4),
                label="dx aliases dy"),
    ]
    return out


if __name__ == "__main__":
    main(__import__(__name__))
