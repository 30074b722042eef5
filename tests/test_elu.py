"""ELU (SELU, CELU), Softplus and Mish (kernels.elu): each kernel on the simulator against its reference
at the extremes (0, softplus's threshold, where exp overflows, +-1e4, NaN and inf), the in-place backward
bit for bit, each reference's backward the gradient of its forward (central differences in float64), the
references what PyTorch computes, and the launchers' refusals by name. (Every example of the family on
the simulator: tests/test_kernels.py and tests/test_nonfinite.py.)"""
import importlib.util

import numpy as np
import pytest
from numba import cuda

from gradcheck import check_backward, rand64
from kernels import elu as E

# name -> (activation, hyper-parameters, the PyTorch call, given torch.nn.functional and torch)
CASES = {
    "elu": ("elu", E.ELU_CASES["elu"], lambda F, torch, t: F.elu(t)),
    "elu_0.3": ("elu", {"alpha": 0.3, "scale": 1.0, "input_scale": 1.0}, lambda F, torch, t: F.elu(t, 0.3)),
    # alpha < 0 < input_scale: ELU of +0 is -0.0 (PyTorch's x <= 0 branch: expm1(0) * alpha), not +0.0
    "elu_-1": ("elu", {"alpha": -1.0, "scale": 1.0, "input_scale": 1.0}, lambda F, torch, t: F.elu(t, -1.0)),
    "selu": ("elu", E.ELU_CASES["selu"], lambda F, torch, t: F.selu(t)),
    "celu": ("elu", E.ELU_CASES["celu"], lambda F, torch, t: F.celu(t, 2.0)),
    # input_scale < 0: x * input_scale grows with -x, and exp overflows on the x <= 0 side
    "celu_-2": ("elu", {"alpha": -2.0, "scale": 1.0, "input_scale": -0.5},
                lambda F, torch, t: F.celu(t, -2.0)),
    "aten_elu": ("elu", {"alpha": 0.7, "scale": 1.3, "input_scale": 0.6},
                 lambda F, torch, t: torch.ops.aten.elu(t, 0.7, 1.3, 0.6)),
    "softplus": ("softplus", E.SOFTPLUS_CASES["default"], lambda F, torch, t: F.softplus(t)),
    "softplus_beta2": ("softplus", E.SOFTPLUS_CASES["beta2"], lambda F, torch, t: F.softplus(t, 2.0, 10.0)),
    # a threshold past exp's range: inf and NaN below it, as PyTorch's
    "softplus_thr1000": ("softplus", {"beta": 1.0, "threshold": 1000.0},
                         lambda F, torch, t: F.softplus(t, 1.0, 1000.0)),
    "softplus_beta-0.5": ("softplus", {"beta": -0.5, "threshold": 20.0},
                          lambda F, torch, t: F.softplus(t, -0.5, 20.0)),
    "mish": ("mish", {}, lambda F, torch, t: F.mish(t)),
}
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _boundary(hp):
    """Softplus's x where x * beta is its threshold, or 0 (ELU's kink; mish has none)."""
    return hp["threshold"] / hp["beta"] if "beta" in hp else 0.0


def _points(hp):
    """The extremes, NaN and +-inf, and this case's boundary exactly and a float32 step either side."""
    f = np.float32
    b = f(_boundary(hp))
    return np.concatenate([E.extremes(), np.array([np.nan, np.inf, -np.inf, b, np.nextafter(b, f(-np.inf)),
                                                   np.nextafter(b, f(np.inf)), 1e-30, -1e-30], np.float32)])


def _refs(act):
    return getattr(E, f"{act}_forward_ref"), getattr(E, f"{act}_backward_ref")


def _same_values(got, want, what):
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN in other places"
    assert np.array_equal(np.isposinf(got), np.isposinf(want)) and \
        np.array_equal(np.isneginf(got), np.isneginf(want)), f"{what}: inf in other places"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=what)
    zero = (got == 0) & (want == 0)  # and the sign of a zero (ELU of +-0: the side taken at 0)
    assert np.array_equal(np.signbit(got[zero]), np.signbit(want[zero])), f"{what}: a zero of the other sign"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's float32 inf * 0 and inf / inf
@pytest.mark.parametrize("case", CASES)
def test_kernels_match_their_references_at_the_extremes(case, rng):
    act, hp, _ = CASES[case]
    x = (rng.standard_normal((2, 3, 5, 7)) * 4).astype(np.float32)
    points = _points(hp)
    x.flat[:points.size] = points
    dy = rng.standard_normal(x.shape).astype(np.float32)
    forward_ref, backward_ref = _refs(act)
    y_want, dx_want = np.empty_like(x), np.empty_like(x)
    forward_ref(x, y_want, **hp)
    backward_ref(x, dy, dx_want, **hp)
    d_x, d_y, d_dy, d_dx = (cuda.to_device(a) for a in (x, np.full_like(x, 7), dy, np.full_like(x, 7)))
    getattr(E, f"{act}_forward")(d_x, d_y, **hp, block=64)
    getattr(E, f"{act}_backward")(d_x, d_dy, d_dx, **hp, block=64)
    _same_values(d_y.copy_to_host(), y_want, f"{case} forward")
    _same_values(d_dx.copy_to_host(), dx_want, f"{case} backward")
    finite = np.isfinite(x)  # no NaN from the branch not taken (the threshold past exp's range: PyTorch's)
    assert not np.isnan(y_want[finite]).any(), f"{case} forward: NaN from a finite x"
    assert case == "softplus_thr1000" or not np.isnan(dx_want[finite]).any(), f"{case} backward: NaN"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("case", CASES)
def test_backward_in_place_gives_the_same_bits(case, rng):
    act, hp, _ = CASES[case]
    x = (rng.standard_normal(150) * 4).astype(np.float32)
    points = _points(hp)
    x[:points.size] = points
    dy = rng.standard_normal(x.shape).astype(np.float32)
    backward = getattr(E, f"{act}_backward")
    d_x, d_dx, d_dy = cuda.to_device(x), cuda.to_device(np.full_like(x, 7)), cuda.to_device(dy)
    backward(d_x, d_dy, d_dx, **hp)
    in_place = cuda.to_device(dy)
    backward(d_x, in_place, in_place, **hp)
    want, got = d_dx.copy_to_host(), in_place.copy_to_host()
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), f"{case}: in place differs"


def test_large_and_threshold_values_take_the_right_branch():
    """What PyTorch gives, written out: x itself far above (never inf or NaN from the other branch),
    softplus's log1p branch at x * beta == threshold exactly, SELU's negative side at 0, ELU's expm1."""
    x = np.array([1e4, 88.0, 89.0, 5.0, np.nextafter(np.float32(5), np.float32(6)), 0.0, -1e-30], np.float32)
    dy = np.ones_like(x)
    for act, hp in (("softplus", E.SOFTPLUS_CASES["beta2"]), ("mish", {}), ("elu", E.ELU_CASES["selu"])):
        y, dx = cuda.to_device(np.empty_like(x)), cuda.to_device(np.empty_like(x))
        getattr(E, f"{act}_forward")(cuda.to_device(x), y, **hp)
        getattr(E, f"{act}_backward")(cuda.to_device(x), cuda.to_device(dy), dx, **hp)
        y, dx = y.copy_to_host(), dx.copy_to_host()
        scale = np.float32(hp.get("scale", 1.0))
        assert y[:3].tolist() == (x[:3] * scale).tolist() and dx[:3].tolist() == [scale] * 3, act
        if act == "softplus":
            # at x * beta = 10 exactly: log1p(exp(10)) / 2 = 5.0000227, slope 0.9999546; a step above: x, 1
            assert y[3] == np.float32(np.log1p(np.exp(10.0)) / 2) and y[4] == x[4], y[3:5]
            assert dx[3] == np.float32(np.exp(10.0) / (np.exp(10.0) + 1)) and dx[4] == 1.0, dx[3:5]
        if act == "elu":  # SELU's gradient at 0 is alpha * scale (PyTorch's x > 0 test)
            neg = np.float32(E.SELU_ALPHA) * np.float32(E.SELU_SCALE)
            assert y[5] == 0.0 and dx[5] == neg, dx[5]
            assert y[6] == np.float32(-1e-30) * neg, y[6]  # expm1, not exp - 1 (which gives 0)


@pytest.mark.parametrize("case", [c for c in CASES if c != "softplus_thr1000"])  # float64 exp overflows
def test_backward_ref_is_the_gradient_of_forward(case, rng):
    act, hp, _ = CASES[case]
    x = rand64(rng, 2, 3, 4, 5) * 3
    b = _boundary(hp)
    x.flat[:2] = b - 3, b + 3  # both sides of softplus's threshold (and of ELU's kink)
    if act != "mish":
        x[np.abs(x - b) < 1e-3] = b + 0.5  # central differences away from the kink or the (tiny) jump
    dy = rand64(rng, *x.shape)
    y = np.empty_like(x)
    forward_ref, backward_ref = _refs(act)

    def forward():
        forward_ref(x, y, **hp)
        return y.copy()

    dx = np.empty_like(x)
    backward_ref(x, dy, dx, **hp)
    check_backward(case, forward, {"x": dx}, {"x": x}, dy)


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")
@pytest.mark.parametrize("case", CASES)
def test_references_compute_what_pytorch_computes(case, rng):
    """At 0 and -0, softplus's threshold exactly and a float32 step either side, where exp overflows,
    at +-1e4, NaN and +-inf, and at random points; backward by PyTorch's autograd."""
    import torch
    import torch.nn.functional as F

    act, hp, call = CASES[case]
    x = np.concatenate([_points(hp), (rng.standard_normal(40) * 4).astype(np.float32)])
    dy = np.linspace(-2, 2, x.size).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    forward_ref, backward_ref = _refs(act)
    forward_ref(x, y, **hp)
    backward_ref(x, dy, dx, **hp)
    t = torch.tensor(x, requires_grad=True)
    ty = call(F, torch, t)
    ty.backward(torch.from_numpy(dy))
    # relative only (ELU's expm1 gives -1e-30 at -1e-30, exp - 1 gives 0), but mish's gradient cancels
    # near its minimum (x about -1.19: tanh_sp + x * s * (1 - tanh_sp^2) is 0 there)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6, atol=0, err_msg=f"{case} forward")
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-6, atol=1e-7 if act == "mish" else 0,
                               err_msg=f"{case} backward")


BAD = [
    ("elu_forward", {"alpha": float("nan"), "scale": 1.0, "input_scale": 1.0}, "alpha must be a finite"),
    ("elu_backward", {"alpha": 1.0, "scale": float("inf"), "input_scale": 1.0}, "scale must be a finite"),
    ("elu_forward", {"alpha": 1.0, "scale": 1.0, "input_scale": 1e39},
     "input_scale must be a finite float32"),
    ("elu_backward", {"alpha": "1", "scale": 1.0, "input_scale": 1.0}, "alpha must be a finite"),
    ("softplus_forward", {"beta": 0.0, "threshold": 20.0}, "beta must be nonzero"),
    ("softplus_backward", {"beta": 1e-50, "threshold": 20.0}, "beta must be nonzero in float32"),
    ("softplus_forward", {"beta": 1.0, "threshold": float("inf")}, "threshold must be a finite"),
    ("softplus_backward", {"beta": float("-inf"), "threshold": 20.0}, "beta must be a finite"),
]


@pytest.mark.parametrize("op,hp,message", BAD, ids=[f"{op}-{m.split()[0]}" for op, _, m in BAD])
def test_launchers_refuse_bad_hyper_parameters_by_name(op, hp, message):
    a = cuda.to_device(np.zeros(4, np.float32))
    arrays = (a, a) if op.endswith("forward") else (a, a, a)
    with pytest.raises(ValueError, match=f"^{op}: {message}"):
        getattr(E, op)(*arrays, **hp)


def test_launchers_name_a_wrong_shape_or_dtype():
    x = cuda.to_device(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"mish_backward dx: expected shape \(2, 3\), got \(6,\)"):
        E.mish_backward(x, x, cuda.to_device(np.zeros(6, np.float32)))
    with pytest.raises(ValueError, match=r"elu_forward y: expected dtype float32, got float64"):
        E.elu_forward(x, cuda.to_device(np.zeros((2, 3))), **E.ELU_CASES["elu"])
    with pytest.raises(ValueError, match=r"softplus_backward dy: expected shape \(2, 3\)"):
        E.softplus_backward(x, cuda.to_device(np.zeros(3, np.float32)), x, beta=1.0, threshold=20.0)
