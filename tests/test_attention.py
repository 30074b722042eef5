"""Fused multi-head softmax attention (kernels.attention): each kernel on the simulator against its
reference, bit for bit the same on a second run; the references against an independent float64 formula
(softmax(Q K^T / sqrt(dh)) V, head by head), against central differences, and against PyTorch's
scaled_dot_product_attention and its autograd; and the launchers refuse a wrong shape by name. (Every
example of ``python -m kernels.attention`` runs in tests/test_kernels.py.)"""
import numpy as np
import pytest
from numba import cuda

from gradcheck import check_backward, rand64
from kernels import attention as A

TOL = {"rtol": 1e-4, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _r(rng, *shape, loc=0.0):
    return (rng.standard_normal(shape) + loc).astype(np.float32)


def _args(rng, n, d, hw, loc=0.0):
    """qkv (N, 3D, H, W) and dy (N, D, H, W)."""
    return _r(rng, n, 3 * d, *hw, loc=loc), _r(rng, n, d, *hw)


def _device(*arrays):
    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def _run(qkv, dy, heads, block=A.BLOCK):
    """Both launchers on the simulator: (y, lse, dqkv) as NumPy arrays."""
    n, c, h, w = qkv.shape
    y, lse, dqkv = _device(np.full_like(dy, np.nan), np.full((n, heads, h * w), np.nan, np.float32),
                           np.full_like(qkv, np.nan))
    qkv_, dy_ = _device(qkv, dy)
    A.attention_forward(qkv_, y, lse, heads=heads, block=block)
    A.attention_backward(qkv_, y, dy_, lse, dqkv, heads=heads, block=block)
    return [a.copy_to_host() for a in (y, lse, dqkv)]


def _ref(qkv, dy, heads):
    n, c, h, w = qkv.shape
    y, lse, dqkv = np.empty_like(dy), np.empty((n, heads, h * w), qkv.dtype), np.empty_like(qkv)
    A.attention_forward_ref(qkv, y, lse, heads=heads)
    A.attention_backward_ref(qkv, y, dy, lse, dqkv, heads=heads)
    return y, lse, dqkv


def _forward64(qkv, heads):
    """y (N, D, H, W) and lse (N, heads, T) in float64, one head of one image at a time, from the textbook
    formula softmax(Q K^T / sqrt(dh)) V with Q, K, V as (T, dh) matrices."""
    n, c, h, w = qkv.shape
    d, t = c // 3, h * w
    dh = d // heads
    x = qkv.astype(np.float64).reshape(n, c, t)
    y, lse = np.empty((n, d, t)), np.empty((n, heads, t))
    for b in range(n):
        for hd in range(heads):
            q, k, v = (x[b, o + hd * dh:o + (hd + 1) * dh].T for o in (0, d, 2 * d))
            s = q @ k.T / np.sqrt(dh)
            top = s.max(axis=1, keepdims=True)
            lse[b, hd] = top[:, 0] + np.log(np.exp(s - top).sum(axis=1))
            y[b, hd * dh:(hd + 1) * dh] = (np.exp(s - lse[b, hd][:, None]) @ v).T
    return y.reshape(n, d, h, w), lse


CASES = [(2, 4, 2, (5, 1), 0.0), (2, 6, 3, (3, 2), 0.0), (1, 3, 1, (4, 1), 0.0), (2, 3, 3, (2, 2), 0.0),
         (2, 4, 2, (1, 1), 0.0), (1, 4, 2, (2, 2), 30.0)]


@pytest.mark.parametrize("n,d,heads,hw,loc", CASES)
def test_kernels_match_the_reference(rng, n, d, heads, hw, loc):
    qkv, dy = _args(rng, n, d, hw, loc)
    for name, want, got in zip(("y", "lse", "dqkv"), _ref(qkv, dy, heads), _run(qkv, dy, heads, block=4)):
        np.testing.assert_allclose(got, want, **TOL, err_msg=f"{(n, d, heads, hw)}: {name}")


def test_kernels_are_bit_reproducible(rng):
    qkv, dy = _args(rng, 2, 4, (3, 1), loc=1.0)
    for first, second in zip(_run(qkv, dy, 2, block=8), _run(qkv, dy, 2, block=8)):
        assert first.tobytes() == second.tobytes()


@pytest.mark.parametrize("n,d,heads,hw,loc", CASES)
def test_references_compute_the_float64_formula(rng, n, d, heads, hw, loc):
    """The float32 references against softmax(Q K^T / sqrt(dh)) V in float64; with logits near 1,000
    (loc 30) the exp without its max would overflow, and lse keeps float32's error of 1,000 (6e-5)."""
    qkv, dy = _args(rng, n, d, hw, loc)
    y, lse, _ = _ref(qkv, dy, heads)
    y64, lse64 = _forward64(qkv, heads)
    assert np.isfinite(y).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(y, y64, rtol=1e-4, atol=1e-4 * max(1.0, loc))
    np.testing.assert_allclose(lse, lse64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,d,heads,hw", [(2, 4, 2, (3, 1)), (1, 3, 1, (2, 2)), (1, 2, 2, (1, 1))])
def test_backward_reference_is_the_gradient_of_forward(rng, n, d, heads, hw):
    qkv, dy = rand64(rng, n, 3 * d, *hw), rand64(rng, n, d, *hw)
    lse = np.empty((n, heads, hw[0] * hw[1]))

    def forward():
        y = np.empty_like(dy)
        A.attention_forward_ref(qkv, y, lse, heads=heads)
        return y

    y = forward()
    dqkv = np.empty_like(qkv)
    A.attention_backward_ref(qkv, y, dy, lse, dqkv, heads=heads)
    check_backward("attention", forward, {"qkv": dqkv}, {"qkv": qkv}, dy)


@pytest.mark.parametrize("n,d,heads,hw", [(2, 4, 2, (5, 1)), (1, 6, 3, (3, 2)), (2, 2, 1, (1, 1))])
def test_attention_computes_what_pytorch_computes(rng, n, d, heads, hw):
    """F.scaled_dot_product_attention in float64 on q, k, v viewed as (N, heads, T, dh) from qkv's packing
    (nn.MultiheadAttention's in_proj output split in three, each split into heads), and autograd's
    gradient w.r.t. qkv."""
    torch = pytest.importorskip("torch")
    qkv, dy = _args(rng, n, d, hw)
    t = hw[0] * hw[1]
    tqkv = torch.tensor(qkv.astype(np.float64), requires_grad=True)
    q, k, v = tqkv.reshape(n, 3, heads, d // heads, t).transpose(3, 4).unbind(1)
    ty = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(n, d, *hw)
    ty.backward(torch.from_numpy(dy.astype(np.float64)))
    want = (ty.detach().numpy(), tqkv.grad.numpy())
    for source, (y, _, dqkv) in (("reference", _ref(qkv, dy, heads)), ("kernel", _run(qkv, dy, heads))):
        np.testing.assert_allclose(y, want[0], **TOL, err_msg=f"{source} y")
        np.testing.assert_allclose(dqkv, want[1], **GRAD_TOL, err_msg=f"{source} dqkv")


def test_a_nan_query_stays_in_its_row_of_its_head(rng):
    qkv, dy = _args(rng, 2, 4, (3, 1))
    qkv[1, 2, 1, 0] = np.nan  # image 1, q channel 2: head 1 (channels 2, 3), token 1
    y, lse, _ = _run(qkv, dy, 2)
    assert np.isnan(y[1, 2:, 1, 0]).all() and np.isnan(y).sum() == 2
    assert np.isnan(lse[1, 1, 1]) and np.isnan(lse).sum() == 1


def _refused(pattern):
    return pytest.raises(ValueError, match=pattern)


def test_launchers_name_what_is_wrong():
    def d(*shape):
        return cuda.to_device(np.zeros(shape, np.float32))

    qkv, y, lse = d(2, 12, 3, 1), d(2, 4, 3, 1), d(2, 2, 3)
    with _refused(r"attention_forward y: expected shape \(2, 4, 3, 1\), got \(2, 4, 1, 3\)"):
        A.attention_forward(qkv, d(2, 4, 1, 3), lse, heads=2)
    with _refused(r"attention_forward qkv: expected 3\*D channels \(q, k and v, D >= 1\), "
                  r"got 10"):
        A.attention_forward(d(2, 10, 3, 1), y, lse, heads=2)
    with _refused(r"attention_forward: heads=3 does not divide D=4 \(qkv has 12 channels\)"):
        A.attention_forward(qkv, y, d(2, 3, 3), heads=3)
    with _refused(r"attention_forward: heads must be a positive int, got 0"):
        A.attention_forward(qkv, y, lse, heads=0)
    with _refused(r"attention_forward lse: expected 12 elements \(N\*heads\*T, laid out as "
                  r"\(N, heads, T\) = \(2, 2, 3\)\), got shape \(2, 3\)"):
        A.attention_forward(qkv, y, d(2, 3), heads=2)
    with _refused(r"attention_forward qkv: expected an \(N, C, H, W\) array, got shape "
                  r"\(2, 12, 3\)"):
        A.attention_forward(d(2, 12, 3), y, lse, heads=2)
    with _refused(r"attention_backward dqkv: expected shape \(2, 12, 3, 1\), got "
                  r"\(2, 4, 3, 1\)"):
        A.attention_backward(qkv, y, y, lse, d(2, 4, 3, 1), heads=2)
    with _refused(r"attention_backward dy: expected dtype float32, got float64"):
        A.attention_backward(qkv, y, cuda.to_device(np.zeros((2, 4, 3, 1))), lse, d(2, 12, 3, 1), heads=2)
    with _refused(r"attention_backward lse: expected 12 elements"):
        A.attention_backward(qkv, y, y, d(13), d(2, 12, 3, 1), heads=2)
    with _refused(r"attention_backward y: expected a C-contiguous array"):
        A.attention_backward(qkv, d(2, 4, 3, 2)[:, :, :, :1], y, lse, d(2, 12, 3, 1), heads=2)
    with _refused(r"unknown kernel version 'v2'"):
        A.attention_forward(qkv, y, lse, heads=2, version="v2")


@pytest.mark.gpu
def test_real_gpu_attention_at_vit_b_16s_shape():
    """On a real GPU (compiled PTX, its exp and log): ViT-B/16's attention, 12 heads of 64 over 197
    tokens, two images: the kernels agree with the reference and give the same bits twice."""
    rng = np.random.default_rng(0)
    qkv, dy = _args(rng, 2, 768, (197, 1))
    first, second = _run(qkv, dy, 12), _run(qkv, dy, 12)
    for got, want, again, name in zip(first, _ref(qkv, dy, 12), second, ("y", "lse", "dqkv")):
        np.testing.assert_allclose(got, want, **GRAD_TOL, err_msg=name)
        assert np.array_equal(got, again), f"{name}: not the same bits on a second run"
