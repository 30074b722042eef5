"""ReLU, ReLU6 and LeakyReLU, forward and backward, on arrays of any shape (viewed as 1-D, no copy).

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.activation

- forward: y = 0 where x <= 0, else x (y is a separate array: the backward reads x). NaN stays
  NaN and +inf stays +inf, as PyTorch's relu; written ``x <= 0`` rather than ``x > 0`` because
  every comparison with NaN is false.
- backward: dx = 0 where x <= 0, else dy, as PyTorch (the gradient at exactly 0 is 0; at a NaN
  x the gradient passes, as PyTorch's ``threshold_backward`` lets it). It takes y too, as
  cuDNN's API does, but reads only x. dx MAY ALIAS dy: the runtime writes the gradient
  into dy's buffer in place, as cuDNN and the SuperNeurons paper do. Each thread reads dy[i]
  before it writes dx[i] and touches no other element, so the in-place form is safe.

ReLU6 (PyTorch's ReLU6, which is ``hardtanh(x, 0, 6)``), as PyTorch computes it:
- forward: y = 0 where x < 0, 6 where x > 6, else x: NaN stays NaN, -0.0 stays -0.0, +-inf
  clamps to 0 or 6.
- backward: dx = 0 where x <= 0 or x >= 6, else dy (hardtanh's backward: the gradient is 0 at both
  ends and passes at a NaN x, as PyTorch's CUDA kernel and scalar CPU loop do; its vectorized CPU
  loop gives 0 there). dx may alias dy, as for ReLU.

LeakyReLU (PyTorch's, ``negative_slope`` a hyper-parameter): y = x where x > 0, else x times the
slope; backward dx = dy where x > 0, else dy times the slope (at exactly 0: the slope, as PyTorch).
Its backward reads x and dy only: ``leaky_relu_backward(x, dy, dx, *, negative_slope)``.

No reductions, so no order to fix; one version (v1): the ops are memory-bound already.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_version, cuda_kernel, flat, launch_1d

BLOCK = 256  # threads per block
VERSIONS = ("v1",)


# ---------------------------------------------------------------- NumPy references
def relu_forward_ref(x, y):
    y[...] = np.where(x <= 0, x.dtype.type(0), x)  # NaN is not <= 0: it propagates


def relu_backward_ref(x, y, dy, dx):
    """dx = dy where x is not <= 0 (x > 0 or NaN); dx may alias dy (the temporary is taken first)."""
    dx[...] = np.where(x <= 0, dy.dtype.type(0), dy)


RELU6_MAX = 6.0


def relu6_forward_ref(x, y):
    t = x.dtype.type
    y[...] = np.where(x < 0, t(0), np.where(x > RELU6_MAX, t(RELU6_MAX), x))  # NaN is neither: it propagates


def relu6_backward_ref(x, y, dy, dx):
    """dx = dy where neither x <= 0 nor x >= 6 (0 < x < 6, or NaN); dx may alias dy."""
    dx[...] = np.where((x <= 0) | (x >= RELU6_MAX), dy.dtype.type(0), dy)


def leaky_relu_forward_ref(x, y, *, negative_slope):
    y[...] = np.where(x > 0, x, x * x.dtype.type(negative_slope))


def leaky_relu_backward_ref(x, dy, dx, *, negative_slope):
    """dx = dy where x > 0, else dy * negative_slope; dx may alias dy."""
    dx[...] = np.where(x > 0, dy, dy * dy.dtype.type(negative_slope))


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[::1], float32[::1])")
def _relu_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = float32(0.0) if v <= float32(0.0) else v  # NaN propagates


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _relu_backward_v1(x, dy, dx):
    # dx may be dy: read dy[i], then write dx[i]; no other element is touched.
    i = cuda.grid(1)
    if i < dx.size:
        g = dy[i]
        dx[i] = float32(0.0) if x[i] <= float32(0.0) else g


@cuda_kernel("void(float32[::1], float32[::1])")
def _relu6_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        if v < float32(0.0):
            v = float32(0.0)
        elif v > float32(RELU6_MAX):
            v = float32(RELU6_MAX)
        y[i] = v  # NaN (neither test holds) and -0.0 pass unchanged


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _relu6_backward_v1(x, dy, dx):
    # dx may be dy: read dy[i], then write dx[i]; no other element is touched.
    i = cuda.grid(1)
    if i < dx.size:
        g = dy[i]
        v = x[i]
        dx[i] = float32(0.0) if v <= float32(0.0) or v >= float32(RELU6_MAX) else g


@cuda_kernel("void(float32[::1], float32[::1], float32)")
def _leaky_relu_forward_v1(x, y, slope):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = v if v > float32(0.0) else v * slope


@cuda_kernel("void(float32[::1], float32[::1], float32[::1], float32)")
def _leaky_relu_backward_v1(x, dy, dx, slope):
    # dx may be dy: read dy[i], then write dx[i]; no other element is touched.
    i = cuda.grid(1)
    if i < dx.size:
        g = dy[i]
        dx[i] = g if x[i] > float32(0.0) else g * slope


# ---------------------------------------------------------------- launchers
def relu_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    check_version(version, VERSIONS)
    check("relu_forward x", x)
    check("relu_forward y", y, shape=x.shape)
    launch_1d(_relu_forward_v1, y.size, block, stream, flat(x), flat(y))


def relu_backward(x, y, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """dx = 0 where x <= 0 else dy; ``dx`` may be the same array as ``dy`` (in place)."""
    check_version(version, VERSIONS)
    check("relu_backward x", x)
    for name, a in (("y", y), ("dy", dy), ("dx", dx)):
        check(f"relu_backward {name}", a, shape=x.shape)
    launch_1d(_relu_backward_v1, dx.size, block, stream, flat(x), flat(dy), flat(dx))


def relu6_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    check_version(version, VERSIONS)
    check("relu6_forward x", x)
    check("relu6_forward y", y, shape=x.shape)
    launch_1d(_relu6_forward_v1, y.size, block, stream, flat(x), flat(y))


def relu6_backward(x, y, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """dx = 0 where x <= 0 or x >= 6 else dy; ``dx`` may be the same array as ``dy`` (in place)."""
    check_version(version, VERSIONS)
    check("relu6_backward x", x)
    for name, a in (("y", y), ("dy", dy), ("dx", dx)):
        check(f"relu6_backward {name}", a, shape=x.shape)
    launch_1d(_relu6_backward_v1, dx.size, block, stream, flat(x), flat(dy), flat(dx))


def leaky_relu_forward(x, y, *, negative_slope, stream=0, version="v1", block=BLOCK):
    check_version(version, VERSIONS)
    check("leaky_relu_forward x", x)
    check("leaky_relu_forward y", y, shape=x.shape)
    launch_1d(_leaky_relu_forward_v1, y.size, block, stream, flat(x), flat(y), np.float32(negative_slope))


def leaky_relu_backward(x, dy, dx, *, negative_slope, stream=0, version="v1", block=BLOCK):
    """dx = dy where x > 0 else dy * negative_slope; ``dx`` may be the same array as ``dy``."""
    check_version(version, VERSIONS)
    check("leaky_relu_backward x", x)
    for name, a in (("dy", dy), ("dx", dx)):
        check(f"leaky_relu_backward {name}", a, shape=x.shape)
    launch_1d(_leaky_relu_backward_v1, dx.size, block, stream, flat(x), flat(dy), flat(dx),
              np.float32(negative_slope))


OPS = {
    "relu_forward": Op("relu_forward", relu_forward_ref, relu_forward, VERSIONS),
    "relu_backward": Op("relu_backward", relu_backward_ref, relu_backward, VERSIONS),
    "relu6_forward": Op("relu6_forward", relu6_forward_ref, relu6_forward, VERSIONS),
    "relu6_backward": Op("relu6_backward", relu6_backward_ref, relu6_backward, VERSIONS),
    "leaky_relu_forward": Op("leaky_relu_forward", leaky_relu_forward_ref, leaky_relu_forward, VERSIONS),
    "leaky_relu_backward": Op("leaky_relu_backward", leaky_relu_backward_ref, leaky_relu_backward, VERSIONS),
}


def examples(rng):
    r, nan = example_arrays(rng)
    x = r(2, 3, 5, 7)
    x.flat[::11] = 0.0  # exact zeros: gradient 0 there, as PyTorch
    y = np.empty_like(x)
    relu_forward_ref(x, y)
    dy = r(*x.shape)
    x2 = r(9, 37)
    y2 = np.empty_like(x2)
    relu_forward_ref(x2, y2)
    dy2 = r(9, 37)
    x3 = r(5, 13)
    x3.flat[::4], x3.flat[1::6], x3.flat[2::9] = np.nan, np.inf, -np.inf
    y3 = np.empty_like(x3)
    relu_forward_ref(x3, y3)
    # ReLU6: both ends exactly (0, -0.0, 6), just inside and outside them, NaN and +-inf
    x6 = (r(4, 29) * 4 + 3).astype(np.float32)
    six = np.float32(RELU6_MAX)  # float32's neighbours of 6 (a Python 6's are float64's, which round to 6)
    above, below = np.nextafter(six, 7, dtype=np.float32), np.nextafter(six, 0, dtype=np.float32)
    x6.flat[:9] = [0.0, -0.0, 6.0, above, below, 1e-45, np.nan, np.inf, -np.inf]
    y6 = np.empty_like(x6)
    relu6_forward_ref(x6, y6)
    dy6 = r(*x6.shape)
    slope = {"negative_slope": 0.2}
    in_place = dy.copy()
    leaky = [
        Example("leaky_relu_forward", (x3, nan(*x3.shape)), (1,), kwargs=slope, label="NaN and inf"),
        Example("leaky_relu_forward", (x, nan(*x.shape)), (1,), kwargs={"negative_slope": 0.01},
                launch={"block": 64}, label="2x3x5x7 with zeros, PyTorch's default slope"),
        Example("leaky_relu_backward", (x, dy, nan(*x.shape)), (2,), kwargs=slope, label="2x3x5x7"),
        Example("leaky_relu_backward", (x, in_place, in_place), (2,), kwargs=slope, label="dx aliases dy"),
    ]
    return [
        Example("relu6_forward", (x6, nan(*x6.shape)), (1,), launch={"block": 64}, label="ends, NaN, inf"),
        Example("relu6_backward", (x6, y6, r(*x6.shape), nan(*x6.shape)), (3,), label="ends, NaN, inf"),
        Example("relu6_backward", (x6, y6, dy6, dy6), (3,), label="dx aliases dy"),
        Example("relu_forward", (x3, nan(*x3.shape)), (1,), label="NaN and inf propagate"),
        Example("relu_backward", (x3, y3, r(*x3.shape), nan(*x3.shape)), (3,), label="NaN passes dy"),
        Example("relu_forward", (x, nan(*x.shape)), (1,), label="2x3x5x7 with zeros"),
        Example("relu_forward", (r(301), nan(301)), (1,), launch={"block": 64}, label="1-D 301"),
        Example("relu_backward", (x, y, dy, nan(*x.shape)), (3,), label="2x3x5x7"),
        Example("relu_backward", (x2, y2, dy2, dy2), (3,), launch={"block": 64},
                label="dx aliases dy"),
    ] + leaky


if __name__ == "__main__":
    main(__import__(__name__))
