"""ReLU: gradient of the reference, the in-place backward (dx aliasing dy), PyTorch's x == 0 rule."""
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
