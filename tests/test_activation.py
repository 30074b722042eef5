"""ReLU, ReLU6 and LeakyReLU: gradient of the reference, the in-place backward (dx aliasing dy),
PyTorch's x == 0 rule."""
import importlib.util

import numpy as np
import pytest
from numba import cuda

from kernels import activation as A
from gradcheck import check_backward, rand64


def test_relu_backward_ref_gradcheck(rng):
    x = rand64(rng, 2, 3, 4, 5)
    x[np.abs(x) < 1e-3] = 0.5  # keep central differences away from the kink
    dy = rand64(rng, *x.shape)
    y = np.empty_like(x)

    def forward():
        A.relu_forward_ref(x, y)
        return y.copy()

    forward()
    dx = np.empty_like(x)
    A.relu_backward_ref(x, y, dy, dx)
    check_backward("relu", forward, {"x": dx}, {"x": x}, dy)


def test_gradient_at_zero_is_zero_as_pytorch():
    x = np.array([-1.0, 0.0, -0.0, 2.0], np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    A.relu_forward_ref(x, y)
    A.relu_backward_ref(x, y, np.ones_like(x), dx)
    assert np.array_equal(dx, (x > 0).astype(np.float32))


def test_in_place_backward_equals_out_of_place(rng):
    """The same device array passed as dy and dx: the result equals the separate-buffer run, bit for bit."""
    x = rng.standard_normal((3, 7, 11)).astype(np.float32)
    y = np.empty_like(x)
    A.relu_forward_ref(x, y)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)
    separate = cuda.to_device(np.full_like(x, np.nan))
    A.relu_backward(d_x, d_y, cuda.to_device(dy), separate, block=64)
    shared = cuda.to_device(dy)
    A.relu_backward(d_x, d_y, shared, shared, block=64)
    assert np.array_equal(shared.copy_to_host(), separate.copy_to_host())


def test_forward_leaves_x_alone(rng):
    x = rng.standard_normal(257).astype(np.float32)
    d_x, d_y = cuda.to_device(x), cuda.to_device(np.full_like(x, np.nan))
    A.relu_forward(d_x, d_y, block=64)
    assert np.array_equal(d_x.copy_to_host(), x)
    assert np.array_equal(d_y.copy_to_host(), np.maximum(x, 0))


def test_errors_name_op_and_argument():
    x = cuda.to_device(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"relu_forward y: expected shape \(2, 3\), got \(3, 2\)"):
        A.relu_forward(x, cuda.to_device(np.zeros((3, 2), np.float32)))
    with pytest.raises(ValueError, match="relu_backward dy: expected dtype float32, got float64"):
        A.relu_backward(x, x, cuda.to_device(np.zeros((2, 3))), x)


# ---------------------------------------------------------------- ReLU6
def test_relu6_backward_ref_gradcheck(rng):
    x = rand64(rng, 2, 3, 4, 5) * 5 + 3  # values on both sides of 0 and of 6
    x[(np.abs(x) < 1e-3) | (np.abs(x - 6) < 1e-3)] = 2.5  # central differences away from the kinks
    dy = rand64(rng, *x.shape)
    y = np.empty_like(x)

    def forward():
        A.relu6_forward_ref(x, y)
        return y.copy()

    forward()
    assert (x < 0).any() and (x > 6).any() and ((x > 0) & (x < 6)).any()
    dx = np.empty_like(x)
    A.relu6_backward_ref(x, y, dy, dx)
    check_backward("relu6", forward, {"x": dx}, {"x": x}, dy)


# x, then y and dx (dy = 1) as PyTorch's relu6 (hardtanh(0, 6)) gives them: the gradient is 0 at
# both ends and passes at NaN; -0.0 stays -0.0 (checked here against torch 2.13). At a NaN x, PyTorch's
# own CPU kernels disagree: the scalar loop passes the gradient (as its CUDA kernel does, and snlite),
# the vectorized one gives 0; so the comparison with PyTorch below leaves NaN out.
RELU6_POINTS = np.array([-1.0, 0.0, -0.0, 3.0, 6.0, 7.0, np.nan, np.inf, -np.inf], np.float32)
RELU6_Y = np.array([0.0, 0.0, -0.0, 3.0, 6.0, 6.0, np.nan, 6.0, 0.0], np.float32)
RELU6_DX = np.array([0, 0, 0, 1, 0, 0, 1, 0, 0], np.float32)


@pytest.mark.parametrize("impl", ["reference", "kernel"])
def test_relu6_follows_pytorch_at_the_ends_nan_and_signed_zero(impl):
    x = RELU6_POINTS
    y, dx = np.full_like(x, 9.0), np.full_like(x, 9.0)
    if impl == "reference":
        A.relu6_forward_ref(x, y)
        A.relu6_backward_ref(x, y, np.ones_like(x), dx)
    else:
        d = [cuda.to_device(a) for a in (x, y, np.ones_like(x), dx)]
        A.relu6_forward(d[0], d[1])
        A.relu6_backward(d[0], d[1], d[2], d[3])
        y, dx = d[1].copy_to_host(), d[3].copy_to_host()
    number = ~np.isnan(RELU6_Y)
    assert np.isnan(y[~number]).all()
    assert np.array_equal(y[number].view(np.uint32), RELU6_Y[number].view(np.uint32))
    assert np.array_equal(dx, RELU6_DX)


def test_relu6_matches_pytorch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    points = RELU6_POINTS[~np.isnan(RELU6_POINTS)]
    x = np.concatenate([points, (rng.standard_normal(200) * 5 + 3).astype(np.float32)])
    t = torch.tensor(x, requires_grad=True)
    yt = torch.nn.ReLU6()(t)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    yt.backward(torch.tensor(dy))
    y, dx = np.empty_like(x), np.empty_like(x)
    A.relu6_forward_ref(x, y)
    A.relu6_backward_ref(x, y, dy, dx)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    assert np.array_equal(np.signbit(y), np.signbit(yt.detach().numpy()))
    np.testing.assert_array_equal(dx, t.grad.numpy())


# ---------------------------------------------------------------- LeakyReLU
@pytest.mark.parametrize("slope", [0.01, 0.2, -0.5])
def test_leaky_relu_backward_ref_gradcheck(rng, slope):
    x = rand64(rng, 2, 3, 4, 5)
    x[np.abs(x) < 1e-3] = 0.5  # central differences away from the kink
    dy = rand64(rng, *x.shape)
    y = np.empty_like(x)

    def forward():
        A.leaky_relu_forward_ref(x, y, negative_slope=slope)
        return y.copy()

    forward()
    dx = np.empty_like(x)
    A.leaky_relu_backward_ref(x, dy, dx, negative_slope=slope)
    check_backward("leaky_relu", forward, {"x": dx}, {"x": x}, dy)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_leaky_relu_is_pytorchs_at_zero_nan_and_infinity():
    import torch

    x = np.array([0.0, -0.0, 1e-45, -1e-45, 2.5, -2.5, np.inf, -np.inf, np.nan], np.float32)
    dy = np.linspace(1, 2, x.size).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    A.leaky_relu_forward_ref(x, y, negative_slope=0.2)
    A.leaky_relu_backward_ref(x, dy, dx, negative_slope=0.2)
    t = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.leaky_relu(t, 0.2)
    ty.backward(torch.from_numpy(dy))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(dx, t.grad.numpy())
