"""The smooth activations custom networks use: ELU (and SELU and CELU, which are ELU with other
constants), Softplus and Mish. Forward and backward, each as PyTorch's CPU kernels compute it
(aten/src/ATen/native/cpu/Activation.cpp).

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.elu

- elu (PyTorch's ``torch.ops.aten.elu(x, alpha, scale, input_scale)``): y = x * scale where x > 0,
  else expm1(x * input_scale) * (alpha * scale) (PyTorch's ``expm1``, not ``exp(.) - 1``: exact
  near 0; ``alpha * scale`` is a float32 product, as PyTorch's ``negcoef``); backward (PyTorch's
  ``elu_backward`` with ``is_result=False``, from x): dx = dy * scale where x > 0, else
  dy * input_scale * (alpha * scale) * exp(x * input_scale). At x = 0 (and -0.0 and NaN) both
  take the second branch, as PyTorch's ``x > 0`` test does: SELU's gradient at 0 is
  alpha * scale, not scale.
  ELU(alpha) is (alpha, 1, 1); SELU is (SELU_ALPHA, SELU_SCALE, 1); CELU(alpha) is
  (alpha, 1, 1 / alpha).
- softplus (PyTorch's ``Softplus(beta, threshold)``, defaults 1 and 20): y = x where
  x * beta > threshold, else log1p(exp(x * beta)) / beta; backward dx = dy where
  x * beta > threshold, else dy * z / (z + 1) with z = exp(x * beta). At x * beta == threshold,
  the log1p branch. As in PyTorch, a threshold above float32's exp range (about 88.72) lets
  exp overflow below it: y = inf and dx = NaN (inf / inf) there, PyTorch's values.
- mish (PyTorch's ``Mish``): y = x * tanh(log1p(exp(x))); backward
  dx = dy * (tanh_sp + x * s * (1 - tanh_sp * tanh_sp)), tanh_sp = tanh(log1p(exp(x))),
  s = 1 / (1 + exp(-x)). PyTorch's CPU kernel takes no softplus threshold here (exp overflows
  to inf, log1p(inf) = inf, tanh(inf) = 1: y = x for large x; a threshold of 20 would change no
  float32 value, tanh of anything above 9.1 being 1.0); mish(-inf) is NaN (-inf * 0), as PyTorch's.

exp in float32 overflows to inf above 88.72; the kernels' ``exp32``/``_expm1_32`` return inf
there without calling ``math.exp`` (the simulator's, Python's, raises OverflowError instead), and
only the branch taken is computed: softplus above its threshold is x, ELU of a large x is
x * scale, never inf or NaN from the other branch. NaN propagates through every op.

Hyper-parameters are Python floats passed to the kernels as float32; the launchers refuse one
that is not a finite float32 (and beta = 0, which softplus divides by) with a ValueError naming it.
Each backward reads x (not y) and may write dx into dy's buffer: each thread reads x[i] and dy[i]
before it writes dx[i] and touches no other element. One version (v1): these are memory-bound.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import EXP_OVERFLOW, Op, check, check_version, cuda_kernel, exp32, flat, launch_1d

BLOCK = 256  # threads per block
VERSIONS = ("v1",)
SELU_ALPHA = 1.6732632423543772848170429916717  # PyTorch's (Klambauer et al., 2017)
SELU_SCALE = 1.0507009873554804934193349852946
FLOAT32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------- NumPy references
def _exp(v):
    with np.errstate(over="ignore"):  # exp overflows to inf above about 88.72 (float32)
        return np.exp(v)


def elu_forward_ref(x, y, *, alpha, scale, input_scale):
    t = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):  # the branch not taken may overflow
        neg = np.expm1(x * t(input_scale)) * (t(alpha) * t(scale))
        y[...] = np.where(x > 0, x * t(scale), neg)


def elu_backward_ref(x, dy, dx, *, alpha, scale, input_scale):
    """dx = dy * scale where x > 0, else dy * input_scale * (alpha * scale) * exp(x * input_scale);
    dx may alias dy (both branches are taken first)."""
    t = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):
        neg = dy * t(input_scale) * (t(alpha) * t(scale)) * np.exp(x * t(input_scale))
        dx[...] = np.where(x > 0, dy * t(scale), neg)


def softplus_forward_ref(x, y, *, beta, threshold):
    t = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):
        xb = x * t(beta)
        y[...] = np.where(xb > t(threshold), x, np.log1p(np.exp(xb)) / t(beta))


def softplus_backward_ref(x, dy, dx, *, beta, threshold):
    """dx = dy where x * beta > threshold, else dy * z / (z + 1), z = exp(x * beta); dx may alias dy."""
    t = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):
        xb = x * t(beta)
        z = np.exp(xb)
        dx[...] = np.where(xb > t(threshold), dy, dy * z / (z + t(1)))


def _tanh_softplus(x):
    return np.tanh(np.log1p(_exp(x)))  # PyTorch's mish: no threshold


def mish_forward_ref(x, y):
    with np.errstate(invalid="ignore"):  # -inf * 0: NaN, as PyTorch's
        y[...] = x * _tanh_softplus(x)


def mish_backward_ref(x, dy, dx):
    """dx = dy * (tanh_sp + x * s * (1 - tanh_sp^2)); dx may alias dy."""
    one = x.dtype.type(1)
    s = one / (one + _exp(-x))
    tsp = _tanh_softplus(x)
    with np.errstate(invalid="ignore"):
        dx[...] = dy * (tsp + x * s * (one - tsp * tsp))


# ---------------------------------------------------------------- kernels
@cuda.jit(device=True, inline=True)
def _expm1_32(t):
    """expm1(t) in float32, inf from EXP_OVERFLOW up, as exp32."""
    if t >= float32(EXP_OVERFLOW):
        return float32(math.inf)
    return float32(math.expm1(t))


@cuda_kernel("void(float32[::1], float32[::1], float32, float32, float32)")
def _elu_forward_v1(x, y, alpha, scale, input_scale):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        if v > float32(0.0):
            y[i] = v * scale
        else:  # x <= 0 or NaN
            y[i] = _expm1_32(v * input_scale) * (alpha * scale)


@cuda_kernel("void(float32[::1], float32[::1], float32[::1], float32, float32, float32)")
def _elu_backward_v1(x, dy, dx, alpha, scale, input_scale):
    # dx may be dy: read x[i] and dy[i], then write dx[i]; no other element is touched.
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        g = dy[i]
        if v > float32(0.0):
            dx[i] = g * scale
        else:
            dx[i] = g * input_scale * (alpha * scale) * exp32(v * input_scale)


@cuda_kernel("void(float32[::1], float32[::1], float32, float32)")
def _softplus_forward_v1(x, y, beta, threshold):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        t = v * beta
        if t > threshold:
            y[i] = v
        else:
            y[i] = float32(math.log1p(exp32(t))) / beta


@cuda_kernel("void(float32[::1], float32[::1], float32[::1], float32, float32)")
def _softplus_backward_v1(x, dy, dx, beta, threshold):
    # dx may be dy: read x[i] and dy[i], then write dx[i]; no other element is touched.
    i = cuda.grid(1)
    if i < dx.size:
        t = x[i] * beta
        g = dy[i]
        if t > threshold:
            dx[i] = g
        else:
            z = exp32(t)
            dx[i] = g * z / (z + float32(1.0))


@cuda_kernel("void(float32[::1], float32[::1])")
def _mish_forward_v1(x, y):
    i = cuda.grid(1)
    if i < y.size:
        v = x[i]
        y[i] = v * float32(math.tanh(math.log1p(exp32(v))))


@cuda_kernel("void(float32[::1], float32[::1], float32[::1])")
def _mish_backward_v1(x, dy, dx):
    # dx may be dy: read x[i] and dy[i], then write dx[i]; no other element is touched.
    i = cuda.grid(1)
    if i < dx.size:
        v = x[i]
        g = dy[i]
        s = float32(1.0) / (float32(1.0) + exp32(-v))
        tsp = float32(math.tanh(math.log1p(exp32(v))))
        dx[i] = g * (tsp + v * s * (float32(1.0) - tsp * tsp))


# ---------------------------------------------------------------- launchers
def _hyper(op, nonzero=(), **values):
    """Each hyper-parameter as a float32, after checking it is a finite number (nonzero where the op
    divides by it): a ValueError naming it otherwise."""
    out = []
    for name, v in values.items():
        ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        f = float(v) if ok else math.nan
        if not (ok and math.isfinite(f) and abs(f) <= FLOAT32_MAX):
            raise ValueError(f"{op}: {name} must be a finite float32 number, got {v!r}")
        if name in nonzero and np.float32(f) == 0:
            raise ValueError(f"{op}: {name} must be nonzero in float32 (the op divides by it), got {v!r}")
        out.append(np.float32(f))
    return out


def _launch(name, kernel, arrays, hyper, stream, version, block):
    """Check ``arrays`` ((name, array) pairs, the first's shape the others') and launch one thread per
    element of the last (the output)."""
    check_version(version, VERSIONS)
    (first, a), *rest = arrays
    check(f"{name} {first}", a)
    for what, b in rest:
        check(f"{name} {what}", b, shape=a.shape)
    launch_1d(kernel, a.size, block, stream, *(flat(b) for _, b in arrays), *hyper)


def elu_forward(x, y, *, alpha, scale, input_scale, stream=0, version="v1", block=BLOCK):
    """ELU(alpha) is (alpha, 1, 1), SELU (SELU_ALPHA, SELU_SCALE, 1), CELU(alpha) (alpha, 1, 1 / alpha)."""
    hyper = _hyper("elu_forward", alpha=alpha, scale=scale, input_scale=input_scale)
    _launch("elu_forward", _elu_forward_v1, (("x", x), ("y", y)), hyper, stream, version, block)


def elu_backward(x, dy, dx, *, alpha, scale, input_scale, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    hyper = _hyper("elu_backward", alpha=alpha, scale=scale, input_scale=input_scale)
    _launch("elu_backward", _elu_backward_v1, (("x", x), ("dy", dy), ("dx", dx)), hyper, stream, version,
            block)


def softplus_forward(x, y, *, beta, threshold, stream=0, version="v1", block=BLOCK):
    hyper = _hyper("softplus_forward", nonzero=("beta",), beta=beta, threshold=threshold)
    _launch("softplus_forward", _softplus_forward_v1, (("x", x), ("y", y)), hyper, stream, version, block)


def softplus_backward(x, dy, dx, *, beta, threshold, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    hyper = _hyper("softplus_backward", nonzero=("beta",), beta=beta, threshold=threshold)
    _launch("softplus_backward", _softplus_backward_v1, (("x", x), ("dy", dy), ("dx", dx)), hyper, stream,
            version, block)


def mish_forward(x, y, *, stream=0, version="v1", block=BLOCK):
    _launch("mish_forward", _mish_forward_v1, (("x", x), ("y", y)), (), stream, version, block)


def mish_backward(x, dy, dx, *, stream=0, version="v1", block=BLOCK):
    """From the input x; ``dx`` may be the same array as ``dy``."""
    _launch("mish_backward", _mish_backward_v1, (("x", x), ("dy", dy), ("dx", dx)), (), stream, version,
            block)


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "elu_forward", "elu_backward", "softplus_forward", "softplus_backward", "mish_forward", "mish_backward")}

# the hyper-parameters the examples (and tests/test_elu.py) try: ELU(1), SELU, CELU(2); Softplus's
# defaults and beta 2, threshold 10 (its boundary at x = 5)
ELU_CASES = {"elu": {"alpha": 1.0, "scale": 1.0, "input_scale": 1.0},
             "selu": {"alpha": SELU_ALPHA, "scale": SELU_SCALE, "input_scale": 1.0},
             "celu": {"alpha": 2.0, "scale": 1.0, "input_scale": 1 / 2.0}}
SOFTPLUS_CASES = {"default": {"beta": 1.0, "threshold": 20.0}, "beta2": {"beta": 2.0, "threshold": 10.0}}


def extremes():
    """0 and -0, the smallest numbers either side, softplus's thresholds (x * beta = 20 and 10) exactly
    and a float32 step either side, where float32's exp overflows, and far out either side."""
    f = np.float32
    near = [np.nextafter(f(a), f(b)) for a, b in ((0, 1), (0, -1), (20, 0), (20, 30), (5, 0), (5, 6),
                                                   (EXP_OVERFLOW, 0))]
    return np.array([0.0, -0.0, 20.0, 5.0, EXP_OVERFLOW, -EXP_OVERFLOW, 88.0, -88.0, 89.0, -89.0, 1e4, -1e4,
                     -104.0, 1.0, -1.0] + near, np.float32)


def examples(rng):
    r, nan = example_arrays(rng)
    x = (r(4, 3, 5, 7) * 4).astype(np.float32)
    ends = extremes()
    x.flat[:ends.size] = ends
    dy = r(*x.shape)
    cases = [("elu", f"{k} ", hp) for k, hp in ELU_CASES.items()]
    cases += [("softplus", f"{k} ", hp) for k, hp in SOFTPLUS_CASES.items()] + [("mish", "", {})]
    out = []
    for act, label, hp in cases:
        in_place = dy.copy()
        out += [Example(f"{act}_forward", (x, nan(*x.shape)), (1,), kwargs=hp, label=f"{label}4x3x5x7, ends"),
                Example(f"{act}_backward", (x, dy, nan(*x.shape)), (2,), kwargs=hp, label=f"{label}4x3x5x7"),
                Example(f"{act}_backward", (x, in_place, in_place), (2,), kwargs=hp,
                        label=f"{label}dx aliases dy")]
    for act, hp in (("elu", ELU_CASES["selu"]), ("softplus", SOFTPLUS_CASES["default"]), ("mish", {})):
        out.append(Example(f"{act}_forward", (r(301) * 4, nan(301)), (1,), kwargs=hp, launch={"block": 64},
                           label="1-D 301"))
    return out


if __name__ == "__main__":
    main(__import__(__name__))
