"""LRN: PyTorch's formulation, gradients of the reference, the in-place backward, errors."""
import numpy as np
import pytest
from numba import cuda

from kernels import lrn as L
from gradcheck import check_backward, rand64

CASES = [  # (shape, hyper-parameters): odd, even, 1, larger than C, 3-D; large alpha so every term counts
    ((2, 7, 2, 3), {"size": 5, "alpha": 0.5, "beta": 0.75, "k": 2.0}),
    ((1, 6, 3, 2), {"size": 4, "alpha": 0.3, "beta": 0.6, "k": 1.0}),
    ((2, 3, 2, 2), {"size": 1, "alpha": 0.4, "beta": 0.75, "k": 1.0}),
    ((1, 4, 2, 3), {"size": 7, "alpha": 0.2, "beta": 1.1, "k": 0.5}),
    ((2, 5, 4), {"size": 2, "alpha": 0.6, "beta": 0.5, "k": 1.5}),
    ((1, 5, 2, 2), {"size": 3}),  # PyTorch's defaults for alpha, beta, k
]


def _pytorch_formulation(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """torch.nn.functional.local_response_norm, step for step in NumPy: pad size//2 zero channels
    before and (size-1)//2 after, average x^2 over a window of `size` channels, scale, divide."""
    sq = x * x
    pad = [(0, 0), (size // 2, (size - 1) // 2)] + [(0, 0)] * (x.ndim - 2)
    padded = np.pad(sq, pad)
    avg = sum(padded[:, i:i + x.shape[1]] for i in range(size)) / size
    return x / (avg * alpha + k) ** beta


@pytest.mark.parametrize("shape,hp", CASES)
def test_forward_ref_is_pytorchs_formula(rng, shape, hp):
    x = rand64(rng, *shape)
    y = np.empty_like(x)
    L.lrn_forward_ref(x, y, **hp)
    np.testing.assert_allclose(y, _pytorch_formulation(x, **hp), rtol=1e-12)


@pytest.mark.parametrize("shape,hp", CASES)
def test_backward_ref_gradcheck(rng, shape, hp):
    x = rand64(rng, *shape)
    dy = rand64(rng, *shape)
    y = np.empty_like(x)

    def forward():
        L.lrn_forward_ref(x, y, **hp)
        return y.copy()

    forward()
    dx = np.empty_like(x)
    L.lrn_backward_ref(x, y, dy, dx, **hp)
    check_backward("lrn", forward, {"x": dx}, {"x": x}, dy)


@pytest.mark.parametrize("shape,hp", CASES)
def test_in_place_backward_equals_out_of_place(rng, shape, hp):
    """dx written into dy's own buffer gives the same bits as a separate dx (the ring buffers work)."""
    x = rng.standard_normal(shape).astype(np.float32)
    y = np.empty_like(x)
    L.lrn_forward_ref(x, y, **hp)
    dy = rng.standard_normal(shape).astype(np.float32)
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)
    separate = cuda.to_device(np.full_like(x, np.nan))
    L.lrn_backward(d_x, d_y, cuda.to_device(dy), separate, **hp, block=32)
    shared = cuda.to_device(dy)
    L.lrn_backward(d_x, d_y, shared, shared, **hp, block=32)
    got = shared.copy_to_host()
    assert np.array_equal(got, separate.copy_to_host())
    want = np.empty_like(x)
    L.lrn_backward_ref(x, y, dy, want, **hp)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_reference_in_place_too(rng):
    x, dy = rand64(rng, 1, 6, 2, 2), rand64(rng, 1, 6, 2, 2)
    y, separate = np.empty_like(x), np.empty_like(x)
    L.lrn_forward_ref(x, y, size=3, alpha=0.5)
    L.lrn_backward_ref(x, y, dy, separate, size=3, alpha=0.5)
    L.lrn_backward_ref(x, y, dy, dy, size=3, alpha=0.5)
    assert np.array_equal(dy, separate)


def test_errors():
    x = cuda.to_device(np.zeros((1, 4, 2, 2), np.float32))
    with pytest.raises(ValueError, match=rf"lrn_forward: size must be an int in \[1, {L.MAX_SIZE}\]"):
        L.lrn_forward(x, x, size=L.MAX_SIZE + 1)
    with pytest.raises(ValueError, match="lrn_backward: size must be an int"):
        L.lrn_backward(x, x, x, x, size=0)
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        L.lrn_forward(cuda.to_device(np.zeros((2, 4), np.float32)),
                      cuda.to_device(np.zeros((2, 4), np.float32)), size=3)
    with pytest.raises(ValueError, match=r"lrn_backward dx: expected shape \(1, 4, 2, 2\)"):
        L.lrn_backward(x, x, x, cuda.to_device(np.zeros((1, 4, 2), np.float32)), size=3)
    with pytest.raises(ValueError, match="size must be an int"):
        L.lrn_forward_ref(np.zeros((1, 2, 2, 2)), np.zeros((1, 2, 2, 2)), size=2.5)
