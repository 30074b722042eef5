"""Channel concat and split: gradient of the reference, exact round trips, gradient sums at a
fork, and argument checks; the channel shuffle: undone by the shuffle in C / groups, torchvision's."""
import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from kernels import concat as cc
from gradcheck import check_backward, rand64


@pytest.mark.parametrize("offset", [0, 2, 4])
def test_backward_reference_matches_central_differences(rng, offset):
    x = rand64(rng, 2, 3, 2, 2)

    def forward():
        y = np.zeros((2, 7, 2, 2))
        cc.concat_forward_ref(x, y, offset=offset)
        return y

    dy = rand64(rng, 2, 7, 2, 2)
    dx = np.empty_like(x)
    cc.concat_backward_ref(dy, dx, offset=offset)
    check_backward("concat", forward, {"x": dx}, {"x": x}, dy)


@settings(max_examples=10, deadline=None)
@given(channels=st.lists(st.integers(1, 3), min_size=1, max_size=4), n=st.integers(1, 2),
       hw=st.sampled_from([(), (1, 1), (2, 3)]), seed=st.integers(0, 99))
def test_concat_then_split_round_trips_exactly(channels, n, hw, seed):
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((n, c) + hw).astype(np.float32) for c in channels]
    offsets = np.cumsum([0] + channels[:-1])
    y = cuda.to_device(np.full((n, sum(channels)) + hw, np.nan, np.float32))
    for part, off in zip(parts, offsets):
        cc.concat_forward(cuda.to_device(part), y, offset=int(off))
    np.testing.assert_array_equal(y.copy_to_host(), np.concatenate(parts, axis=1))
    for part, off in zip(parts, offsets):
        dx = cuda.to_device(np.full_like(part, np.nan))
        cc.concat_backward(y, dx, offset=int(off))
        np.testing.assert_array_equal(dx.copy_to_host(), part)


def test_accumulate_sums_the_gradients_of_every_reader(rng):
    """A tensor read by two joins at different offsets gets the sum of both slices."""
    dy1 = rng.standard_normal((2, 5, 3, 3)).astype(np.float32)
    dy2 = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    dx = cuda.to_device(np.full((2, 2, 3, 3), np.nan, np.float32))
    cc.concat_backward(cuda.to_device(dy1), dx, offset=3)
    cc.concat_backward(cuda.to_device(dy2), dx, offset=0, accumulate=True)
    np.testing.assert_array_equal(dx.copy_to_host(), dy1[:, 3:5] + dy2[:, 0:2])


def test_forward_leaves_other_channels_alone(rng):
    y0 = rng.standard_normal((2, 6, 2, 2)).astype(np.float32)
    y = cuda.to_device(y0)
    cc.concat_forward(cuda.to_device(np.zeros((2, 2, 2, 2), np.float32)), y, offset=3)
    got = y.copy_to_host()
    np.testing.assert_array_equal(got[:, [0, 1, 2, 5]], y0[:, [0, 1, 2, 5]])
    assert not got[:, 3:5].any()


def _dev(*shape, dtype=np.float32):
    return cuda.to_device(np.zeros(shape, dtype))


@pytest.mark.parametrize("x,y,offset,match", [
    ((2, 3, 4, 4), (2, 7, 4, 4), -1, r"concat_forward offset: channels \[-1, 2\) of x do not fit in the 7"),
    ((2, 3, 4, 4), (2, 7, 4, 4), 5, r"concat_forward offset: channels \[5, 8\) of x do not fit in the 7"),
    ((2, 3, 4, 4), (2, 7, 4, 4), 1.0, r"concat_forward offset: expected an int, got 1.0"),
    ((2, 3, 4, 4), (3, 7, 4, 4), 0, r"concat_forward y: expected shape \(2, C, 4, 4\) to match x"),
    ((2, 3, 4, 4), (2, 7, 4, 5), 0, r"concat_forward y: expected shape \(2, C, 4, 4\)"),
    ((6,), (2, 7), 0, r"concat_forward x: expected \(N, C, \.\.\.\) with at least 2 dimensions"),
], ids=["negative", "past the end", "float offset", "batch", "width", "1-D"])
def test_forward_bad_arguments_raise_clear_errors(x, y, offset, match):
    with pytest.raises(ValueError, match=match):
        cc.concat_forward(_dev(*x), _dev(*y), offset=offset)
    with pytest.raises(ValueError, match=match):
        cc.concat_forward_ref(np.zeros(x), np.zeros(y), offset=offset)


def test_backward_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match=r"concat_backward offset: channels \[6, 9\) of dx do not fit"):
        cc.concat_backward(_dev(2, 7, 4, 4), _dev(2, 3, 4, 4), offset=6)
    with pytest.raises(ValueError, match=r"concat_backward dx: expected dtype float32, got float64"):
        cc.concat_backward(_dev(2, 7, 4, 4), _dev(2, 3, 4, 4, dtype=np.float64), offset=0)


# ---------------------------------------------------------------- channel shuffle
@pytest.mark.parametrize("c, groups", [(6, 2), (12, 3), (12, 4), (7, 7), (5, 1)])
def test_the_shuffle_by_c_over_groups_undoes_the_shuffle(rng, c, groups):
    x = rng.standard_normal((2, c, 3, 2)).astype(np.float32)
    y, back = np.empty_like(x), np.empty_like(x)
    cc.channel_shuffle_ref(x, y, groups=groups)
    cc.channel_shuffle_ref(y, back, groups=c // groups)
    assert np.array_equal(back, x)
    # channel i * groups + g of y is channel g * (c / groups) + i of x
    assert all(np.array_equal(y[:, i * groups + g], x[:, g * (c // groups) + i])
               for g in range(groups) for i in range(c // groups))


def test_the_shuffle_is_torchvisions(rng):
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    from snlite.torch_import import import_torchvision

    shufflenet = import_torchvision().models.shufflenetv2
    x = rng.standard_normal((2, 12, 3, 3)).astype(np.float32)
    y = np.empty_like(x)
    cc.channel_shuffle_ref(x, y, groups=3)
    assert np.array_equal(y, shufflenet.channel_shuffle(torch.from_numpy(x), 3).numpy())


def test_the_shuffle_refuses_groups_that_do_not_divide_the_channels():
    x = cuda.to_device(np.zeros((2, 6, 2, 2), np.float32))
    for groups in (4, 0, 2.0, True):
        with pytest.raises(ValueError, match="channel_shuffle groups: expected a divisor of the 6 channels"):
            cc.channel_shuffle(x, cuda.to_device(np.zeros((2, 6, 2, 2), np.float32)), groups=groups)
