"""Dropout: the device mask equals the host mask bit for bit (forward, backward and mask-only
kernels all draw the same one, so nothing is stored), its statistics, recomputation, the gradient
of the reference, the in-place backward, argument errors."""
import numba
import numpy as np
import pytest
from numba import cuda

from kernels import dropout as D
from gradcheck import check_backward, rand64

SEEDS = [0, 12345, 2**32 - 1]


def _host_mask(shape, p, seed):
    mask = np.empty(shape, np.uint8)
    D.dropout_mask_ref(mask, p=p, seed=seed)
    return mask


def _device_forward(x, p, seed, block=128):
    d_y = cuda.to_device(np.full_like(x, np.nan))
    D.dropout_forward(cuda.to_device(x), d_y, p=p, seed=seed, block=block)
    return d_y.copy_to_host()


def _device_backward(dy, p, seed, block=128):
    d_dx = cuda.to_device(np.full_like(dy, np.nan))
    D.dropout_backward(cuda.to_device(dy), d_dx, p=p, seed=seed, block=block)
    return d_dx.copy_to_host()


def _device_masks(shape, p, seed):
    """The mask each device kernel draws: dropout_mask's, and the forward's and the backward's
    (read off their outputs for an input of ones: kept elements are scaled, dropped ones are 0)."""
    ones = np.ones(shape, np.float32)
    d_mask = cuda.to_device(np.full(shape, 7, np.uint8))
    D.dropout_mask(d_mask, p=p, seed=seed)
    return d_mask.copy_to_host(), (_device_forward(ones, p, seed) != 0), \
        (_device_backward(ones, p, seed) != 0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape,p", [((1000,), 0.5), ((3, 7, 5, 5), 0.1), ((1, 1, 33, 17), 0.8)])
def test_device_mask_equals_host_mask_exactly(seed, shape, p):
    """The required proof that the simulator's kernels and the NumPy reference agree bit for bit,
    and that the backward draws the forward's mask again (nothing is stored between them)."""
    want = _host_mask(shape, p, seed)
    mask, forward, backward = _device_masks(shape, p, seed)
    assert np.array_equal(mask, want)
    assert np.array_equal(forward, want == 1) and np.array_equal(backward, want == 1)


def test_mix32_compiled_int64_equals_numpy_uint64_and_plain_uint32():
    """The hash compiled by Numba (int64 arithmetic, as on the GPU) equals the NumPy uint64 reference,
    and both equal lowbias32 written the obvious way with wrapping uint32 multiplies."""
    mix = numba.njit(D._mix32)

    @numba.njit
    def compiled(a):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = mix(a[i])
        return out

    vals = np.concatenate([np.arange(4096), np.random.default_rng(1).integers(0, 2**32, 4096),
                           [2**31 - 1, 2**31, 2**32 - 1]]).astype(np.uint64)

    def lowbias32_u32(v):
        v = v.astype(np.uint32)
        v ^= v >> np.uint32(16)
        v *= np.uint32(0x7FEB352D)
        v ^= v >> np.uint32(15)
        v *= np.uint32(0x846CA68B)
        v ^= v >> np.uint32(16)
        return v.astype(np.uint64)

    ref = D._mix32(vals)
    assert ref.dtype == np.uint64
    assert np.array_equal(ref, lowbias32_u32(vals))
    got = compiled(vals.astype(np.int64))
    assert got.dtype == np.int64 and np.array_equal(got.astype(np.uint64), ref)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    n = 1 << 20
    kept = _host_mask((n,), p, seed=2024).mean()
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(kept - (1 - p)) < 6 * sigma


def test_different_seeds_give_independent_masks():
    n, p = 1 << 18, 0.5
    masks = [_host_mask((n,), p, s) for s in (0, 1, 2, 2**32 - 1)]
    for i in range(len(masks)):
        for j in range(i + 1, len(masks)):
            agree = (masks[i] == masks[j]).mean()  # independent masks agree on p^2 + (1-p)^2 = 1/2
            assert abs(agree - 0.5) < 6 * np.sqrt(0.25 / n), (i, j, agree)


def test_mask_depends_only_on_flat_index():
    assert np.array_equal(_host_mask((6, 7), 0.3, 9).ravel(), _host_mask((100,), 0.3, 9)[:42])


def test_recompute_gives_identical_mask(rng):
    """A dropped output recomputed later (another launch shape) is the same bit for bit, and the
    backward scales exactly the elements the forward kept."""
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    y1, y2 = _device_forward(x, 0.4, 77), _device_forward(x, 0.4, 77, block=32)
    assert np.array_equal(y1, y2)
    dx = _device_backward(x, 0.4, 77, block=64)  # dy = x: the backward must give the forward's y
    assert np.array_equal(dx, y1)
    assert not np.array_equal(_device_forward(x, 0.4, 78), y1)  # the seed matters


def test_forward_is_inverted_dropout(rng):
    x = rng.standard_normal((5, 37)).astype(np.float32)
    y, mask = _device_forward(x, 0.25, 3), _host_mask(x.shape, 0.25, 3)
    assert set(np.unique(mask)) == {0, 1}
    assert np.array_equal(y, np.where(mask == 1, x * np.float32(1 / 0.75), np.float32(0)))
    assert np.array_equal(_device_forward(x, 0.0, 3), x) and np.all(_host_mask(x.shape, 0.0, 3) == 1)


def test_backward_ref_gradcheck(rng):
    x, dy = rand64(rng, 2, 3, 4, 5), rand64(rng, 2, 3, 4, 5)
    y = np.empty_like(x)

    def forward():
        D.dropout_forward_ref(x, y, p=0.3, seed=5)
        return y.copy()

    forward()
    dx = np.empty_like(x)
    D.dropout_backward_ref(dy, dx, p=0.3, seed=5)
    check_backward("dropout", forward, {"x": dx}, {"x": x}, dy)


def test_in_place_backward_equals_out_of_place(rng):
    dy = rng.standard_normal((4, 61)).astype(np.float32)
    separate = cuda.to_device(np.full_like(dy, np.nan))
    D.dropout_backward(cuda.to_device(dy), separate, p=0.5, seed=11)
    shared = cuda.to_device(dy)
    D.dropout_backward(shared, shared, p=0.5, seed=11)
    assert np.array_equal(shared.copy_to_host(), separate.copy_to_host())


@pytest.mark.parametrize("kwargs,match", [
    ({"p": 1.0, "seed": 0}, r"p must be a number in \[0, 1\), got 1.0"),
    ({"p": -0.1, "seed": 0}, "p must be a number"),
    ({"p": float("nan"), "seed": 0}, "p must be a number"),
    ({"p": 0.5, "seed": -1}, r"seed must be an int in \[0, 2\*\*32\)"),
    ({"p": 0.5, "seed": 2**32}, "seed must be an int"),
    ({"p": 0.5, "seed": 1.5}, "seed must be an int"),
])
def test_bad_p_or_seed(kwargs, match):
    x = cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="dropout_forward: " + match):
        D.dropout_forward(x, x, **kwargs)
    with pytest.raises(ValueError, match="dropout_backward: " + match):
        D.dropout_backward(x, x, **kwargs)
    with pytest.raises(ValueError, match="dropout_mask: " + match):
        D.dropout_mask_ref(np.zeros(4, np.uint8), **kwargs)


def test_bad_arrays():
    x = cuda.to_device(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="dropout_forward y: expected dtype float32, got uint8"):
        D.dropout_forward(x, cuda.to_device(np.zeros((2, 3), np.uint8)), p=0.5, seed=0)
    with pytest.raises(ValueError, match=r"dropout_backward dx: expected shape \(2, 3\)"):
        D.dropout_backward(x, cuda.to_device(np.zeros(6, np.float32)), p=0.5, seed=0)
    with pytest.raises(ValueError, match="dropout_mask mask: expected dtype uint8, got float32"):
        D.dropout_mask(x, p=0.5, seed=0)


@pytest.mark.gpu
def test_real_gpu_mask_equals_host_mask():
    """On a real GPU (int64 arithmetic in PTX): millions of elements, several seeds, bit for bit."""
    n = 1 << 24
    for seed in (0, 99, 2**32 - 1):
        want = _host_mask((n,), 0.37, seed)
        mask, forward, backward = _device_masks((n,), 0.37, seed)
        assert np.array_equal(mask, want), seed
        assert np.array_equal(forward, want == 1) and np.array_equal(backward, want == 1), seed


def test_a_group_draws_one_decision_for_each_channel(rng):
    """group = H * W (Dropout2d): every element of an image's channel is kept or dropped together, the
    decision of that channel's index n * C + c, which is element-wise dropout's decision for element
    n * C + c; the device kernels draw the reference's mask, and the backward drops the same channels."""
    x = rng.standard_normal((3, 5, 2, 4)).astype(np.float32)
    mask = np.empty(x.shape, np.uint8)
    D.dropout_mask_ref(mask, p=0.5, seed=11, group=8)
    per_channel = mask.reshape(15, 8)
    assert np.all(per_channel == per_channel[:, :1]) and 0 < per_channel[:, 0].sum() < 15
    assert np.array_equal(per_channel[:, 0], _host_mask((15,), 0.5, 11))
    d_y, d_dx = cuda.to_device(np.full_like(x, np.nan)), cuda.to_device(np.full_like(x, np.nan))
    D.dropout_forward(cuda.to_device(x), d_y, p=0.5, seed=11, group=8, block=32)
    D.dropout_backward(cuda.to_device(x), d_dx, p=0.5, seed=11, group=8, block=64)
    want = np.where(mask == 1, x * np.float32(2), np.float32(0))
    assert np.array_equal(d_y.copy_to_host(), want) and np.array_equal(d_dx.copy_to_host(), want)


@pytest.mark.parametrize("group", [0, 7, 2.0, True])
def test_a_group_that_does_not_divide_the_tensor_is_refused(group):
    x = cuda.to_device(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match=r"dropout_forward: group must be a positive int dividing the 24 "
                                         r"elements \(one decision per group"):
        D.dropout_forward(x, x, p=0.5, seed=1, group=group)
