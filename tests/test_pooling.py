"""Pooling: gradients of the references, the first-maximum rule, v1 == v2 bit for bit, errors."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from kernels import pooling as P
from gradcheck import check_backward, rand64

GEOMETRIES = [  # (x shape, hyper-parameters)
    ((2, 2, 7, 8), {"kernel": 3, "stride": 2, "padding": 1}),
    ((1, 2, 6, 5), {"kernel": 2}),
    ((1, 1, 7, 6), {"kernel": (3, 2), "stride": (1, 2), "padding": (1, 1)}),
    ((1, 2, 5, 5), {"kernel": 3, "stride": 1}),
]


def _maxpool_backward_loops(x, y, dy, *, kernel, stride=None, padding=0):
    """A second, loop-by-loop maxpool backward: the first real x == y in (kh, kw) order wins."""
    kh, kw, sh, sw, ph, pw = P._params(kernel, stride, padding)
    dx = np.zeros_like(x)
    n_, c_, oh_, ow_ = y.shape
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_):
                for ow in range(ow_):
                    cells = [(a, b) for a in range(oh * sh - ph, oh * sh - ph + kh)
                             for b in range(ow * sw - pw, ow * sw - pw + kw)
                             if 0 <= a < x.shape[2] and 0 <= b < x.shape[3]]
                    a, b = next(ab for ab in cells if x[n, c, ab[0], ab[1]] == y[n, c, oh, ow])
                    dx[n, c, a, b] += dy[n, c, oh, ow]
    return dx


def _device(fn, *arrays, out, **kwargs):
    """Run a launcher on device copies of ``arrays``; return the host copy of positional ``out``."""
    dev = [cuda.to_device(a) for a in arrays]
    fn(*dev, **kwargs)
    return dev[out].copy_to_host()


@pytest.mark.parametrize("shape,hp", GEOMETRIES)
def test_maxpool_backward_ref_gradcheck(rng, shape, hp):
    x = rand64(rng, *shape)  # continuous values: no ties, max is differentiable
    y = np.empty(P.pool_output_shape(shape, **hp))
    dy = rand64(rng, *y.shape)

    def forward():
        P.maxpool2d_forward_ref(x, y, **hp)
        return y.copy()

    forward()
    dx = np.empty_like(x)
    P.maxpool2d_backward_ref(x, y, dy, dx, **hp)
    check_backward("maxpool2d", forward, {"x": dx}, {"x": x}, dy)


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("shape,hp", GEOMETRIES)
def test_avgpool_backward_ref_gradcheck(rng, shape, hp, include):
    x = rand64(rng, *shape)
    y = np.empty(P.pool_output_shape(shape, **hp))
    dy = rand64(rng, *y.shape)

    def forward():
        P.avgpool2d_forward_ref(x, y, **hp, count_include_pad=include)
        return y.copy()

    dx = np.empty_like(x)
    P.avgpool2d_backward_ref(dy, dx, **hp, count_include_pad=include)
    check_backward("avgpool2d", forward, {"x": dx}, {"x": x}, dy)


@pytest.mark.parametrize("shape,hp", GEOMETRIES)
def test_maxpool_backward_ties_go_to_first_maximum(rng, shape, hp):
    """Heavy ties (values in {0, 1} and all-equal): reference, loops, v1 and v2 all agree exactly."""
    for x in (rng.integers(0, 2, shape).astype(np.float32), np.zeros(shape, np.float32)):
        y = np.empty(P.pool_output_shape(shape, **hp), np.float32)
        P.maxpool2d_forward_ref(x, y, **hp)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        want = np.empty_like(x)
        P.maxpool2d_backward_ref(x, y, dy, want, **hp)
        np.testing.assert_allclose(want, _maxpool_backward_loops(x, y, dy, **hp), rtol=1e-6)
        for version in ("v1", "v2"):
            got = _device(P.maxpool2d_backward, x, y, dy, np.full_like(x, np.nan), out=3, **hp,
                          version=version)
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=version)


@pytest.mark.parametrize("shape,hp", GEOMETRIES)
def test_backward_v1_and_v2_bit_identical(rng, shape, hp):
    x = rng.standard_normal(shape).astype(np.float32)
    oshape = P.pool_output_shape(shape, **hp)
    y = np.empty(oshape, np.float32)
    P.maxpool2d_forward_ref(x, y, **hp)
    dy = rng.standard_normal(oshape).astype(np.float32)
    dx = np.full_like(x, np.nan)
    mx = [_device(P.maxpool2d_backward, x, y, dy, dx, out=3, **hp, version=v) for v in ("v1", "v2")]
    av = [_device(P.avgpool2d_backward, dy, dx, out=1, **hp, count_include_pad=False, version=v)
          for v in ("v1", "v2")]
    assert np.array_equal(mx[0], mx[1]) and np.array_equal(av[0], av[1])


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("shape,hp", GEOMETRIES)
def test_backward_gives_the_references_bits_and_so_the_host_devices(rng, shape, hp, include):
    """Overlapping windows sum in one order on every device: avgpool's GPU gather went window by
    window ascending while its reference (and the host device, bit for bit) met them last first, so
    CUDA and host differed in the last bit (33 of 72 elements of a 3x3/1 pool)."""
    x = rng.standard_normal(shape).astype(np.float32)
    oshape = P.pool_output_shape(shape, **hp)
    dy = rng.standard_normal(oshape).astype(np.float32)
    want = np.empty_like(x)
    P.avgpool2d_backward_ref(dy, want, **hp, count_include_pad=include)
    for version in ("v1", "v2"):
        got = _device(P.avgpool2d_backward, dy, np.full_like(x, np.nan), out=1, **hp,
                      count_include_pad=include, version=version)
        assert np.array_equal(got, want), version
    y = np.empty(oshape, np.float32)
    P.maxpool2d_forward_ref(x, y, **hp)
    P.maxpool2d_backward_ref(x, y, dy, want, **hp)
    for version in ("v1", "v2"):
        got = _device(P.maxpool2d_backward, x, y, dy, np.full_like(x, np.nan), out=3, **hp, version=version)
        assert np.array_equal(got, want), version


@settings(max_examples=15, deadline=None)
@given(h=st.integers(1, 7), w=st.integers(1, 7), k=st.integers(1, 4), s=st.integers(1, 3),
       p=st.integers(0, 2), include=st.booleans(), ceil=st.booleans(), seed=st.integers(0, 2**16))
def test_random_geometries_match_reference(h, w, k, s, p, include, ceil, seed):
    if 2 * p > k or h + 2 * p < k or w + 2 * p < k:
        with pytest.raises(ValueError, match="pool"):
            P.pool_output_shape((1, 1, h, w), k, s, p)
        return
    rng = np.random.default_rng(seed)
    hp = {"kernel": k, "stride": s, "padding": p, "ceil_mode": ceil}
    x = rng.standard_normal((1, 2, h, w)).astype(np.float32)
    oshape = P.pool_output_shape(x.shape, **hp)
    want = np.empty(oshape, np.float32)
    P.avgpool2d_forward_ref(x, want, **hp, count_include_pad=include)
    got = _device(P.avgpool2d_forward, x, np.empty(oshape, np.float32), out=1, **hp,
                  count_include_pad=include)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    dy = rng.standard_normal(oshape).astype(np.float32)
    P.maxpool2d_forward_ref(x, want, **hp)
    ref = np.empty_like(x)
    P.maxpool2d_backward_ref(x, want, dy, ref, **hp)
    for version in ("v1", "v2"):
        got = _device(P.maxpool2d_backward, x, want, dy, np.empty_like(x), out=3, **hp, version=version)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_maxpool_forward_propagates_nan(rng):
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    want = np.empty((1, 2, 3, 3), np.float32)
    P.maxpool2d_forward_ref(x, want, kernel=2)
    got = _device(P.maxpool2d_forward, x, np.zeros_like(want), out=1, kernel=2)
    assert np.isnan(got[0, 1, 1, 1]) and np.isnan(got).sum() == 1
    np.testing.assert_array_equal(got, want)


def test_avgpool_divisors_follow_pytorch():
    """All-ones input: count_include_pad=False averages to exactly 1; True divides by kh*kw in floor mode."""
    x = np.ones((1, 1, 5, 6))
    hp = {"kernel": 3, "stride": 2, "padding": 1}
    y = np.empty(P.pool_output_shape(x.shape, **hp))
    P.avgpool2d_forward_ref(x, y, **hp, count_include_pad=False)
    assert np.all(y == 1.0)
    P.avgpool2d_forward_ref(x, y, **hp, count_include_pad=True)
    windows = P._windows(x, 3, 3, 2, 2, 1, 1, 0, *y.shape[2:]).sum(axis=(4, 5))
    np.testing.assert_allclose(y, windows / 9)


def test_stride_defaults_to_kernel():
    assert P.pool_output_shape((2, 3, 8, 9), 2) == (2, 3, 4, 4)
    assert P.pool_output_shape((2, 3, 8, 9), (2, 3), None, (1, 0)) == (2, 3, 5, 3)


@pytest.mark.parametrize("args,match", [
    (((1, 1, 5, 5), 3, 1, 2), r"padding must be in \[0, kernel // 2\]"),
    (((1, 1, 2, 2), 3, 1, 0), "does not fit input 2x2"),
    (((1, 5, 5), 3, 1, 0), r"expected x of shape \(N, C, H, W\)"),
    (((1, 1, 5, 5), 3, 0, 0), "stride must be positive"),
    (((1, 1, 5, 5), 0, 1, 0), "kernel must be positive"),
    (((1, 1, 5, 5), (1, 2, 3), 1, 0), "pool kernel: expected an int or a pair"),
])
def test_pool_output_shape_errors(args, match):
    with pytest.raises(ValueError, match=match):
        P.pool_output_shape(*args)


def test_launchers_name_op_and_shape():
    x = cuda.to_device(np.zeros((1, 2, 6, 6), np.float32))
    bad_y = cuda.to_device(np.zeros((1, 2, 2, 2), np.float32))
    with pytest.raises(ValueError,
                       match=r"maxpool2d_forward y: expected shape \(1, 2, 3, 3\), got \(1, 2, 2, 2\)"):
        P.maxpool2d_forward(x, bad_y, kernel=2)
    with pytest.raises(ValueError, match=r"avgpool2d_backward dy: expected shape"):
        P.avgpool2d_backward(bad_y, x, kernel=2)
    with pytest.raises(ValueError, match="unknown kernel version"):
        P.avgpool2d_forward(x, bad_y, kernel=3, version="v2")
    with pytest.raises(ValueError, match="maxpool2d_forward x: expected dtype float32"):
        P.maxpool2d_forward(cuda.to_device(np.zeros((1, 2, 6, 6))), bad_y, kernel=3)


# ---------------------------------------------------------------- ceil mode
# (input size, kernel, stride, padding) -> windows in floor and ceil mode, as PyTorch 2.13 gives them:
# SqueezeNet's and GoogLeNet's 3x3 stride 2 pools (112 -> 56, 56 -> 28, 28 -> 14), GoogLeNet's 2x2
# stride 2 (14 -> 7), and windows that would start in the right padding, dropped (5: k2 s2 p1; 7: k2 s3 p1)
CEIL_SIZES = [((111, 3, 2, 0), 55, 55), ((112, 3, 2, 0), 55, 56), ((56, 3, 2, 0), 27, 28),
              ((28, 3, 2, 0), 13, 14), ((14, 2, 2, 0), 7, 7), ((13, 3, 2, 0), 6, 6), ((5, 2, 2, 1), 3, 3),
              ((6, 3, 3, 1), 2, 3), ((7, 2, 3, 1), 3, 3)]


@pytest.mark.parametrize("size,floor,ceil", CEIL_SIZES)
def test_ceil_mode_output_size_follows_pytorch(size, floor, ceil):
    h, k, s, p = size
    assert P.pool_output_shape((1, 1, h, 4), (k, 1), (s, 1), (p, 0))[2] == floor
    assert P.pool_output_shape((1, 1, h, 4), (k, 1), (s, 1), (p, 0), ceil_mode=True)[2] == ceil


CEIL_GEOMETRIES = [  # (x shape, hyper-parameters), ceil mode: windows off the end of rows and columns
    ((2, 2, 8, 7), {"kernel": 3, "stride": 2}),
    ((1, 2, 8, 7), {"kernel": (3, 2), "stride": (2, 3), "padding": (1, 0)}),
]


@pytest.mark.parametrize("shape,hp", CEIL_GEOMETRIES)
def test_ceil_mode_backward_refs_gradcheck(rng, shape, hp):
    hp = dict(hp, ceil_mode=True)
    oshape = P.pool_output_shape(shape, **hp)
    assert oshape != P.pool_output_shape(shape, hp["kernel"], hp["stride"], hp.get("padding", 0))
    x, dy = rand64(rng, *shape), rand64(rng, *oshape)
    y, dx = np.empty(oshape), np.empty_like(x)

    def maxpool():
        P.maxpool2d_forward_ref(x, y, **hp)
        return y.copy()

    maxpool()
    P.maxpool2d_backward_ref(x, y, dy, dx, **hp)
    check_backward("maxpool ceil", maxpool, {"x": dx}, {"x": x}, dy)
    for include in (True, False):
        def avgpool():
            P.avgpool2d_forward_ref(x, y, **hp, count_include_pad=include)
            return y.copy()

        P.avgpool2d_backward_ref(dy, dx, **hp, count_include_pad=include)
        check_backward("avgpool ceil", avgpool, {"x": dx}, {"x": x}, dy)


def test_ceil_mode_divisor_counts_only_the_padded_input():
    """An all-ones 5x5 input, 2x2 windows, stride 2: the last window of each row holds one column
    (it runs off the end, where nothing is counted), so its average is 1 with or without padding."""
    x = np.ones((1, 1, 5, 5))
    y = np.empty(P.pool_output_shape(x.shape, 2, 2, 0, ceil_mode=True))
    assert y.shape == (1, 1, 3, 3)
    P.avgpool2d_forward_ref(x, y, kernel=2, stride=2, ceil_mode=True)
    assert np.all(y == 1.0)


@pytest.mark.parametrize("shape,hp", CEIL_GEOMETRIES + [((2, 3, 6, 9), {"kernel": 3, "stride": 2,
                                                                        "padding": 1})])
def test_ceil_mode_matches_pytorch(rng, shape, hp):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.standard_normal(shape).astype(np.float32)
    oshape = P.pool_output_shape(shape, **hp, ceil_mode=True)
    dy = rng.standard_normal(oshape).astype(np.float32)
    args = (hp["kernel"], hp["stride"], hp.get("padding", 0))
    for include in (True, False):
        pools = {"max": lambda t: F.max_pool2d(t, *args, ceil_mode=True),
                 "avg": lambda t: F.avg_pool2d(t, *args, ceil_mode=True, count_include_pad=include)}
        for kind, pool in pools.items():
            t = torch.tensor(x, requires_grad=True)
            yt = pool(t)
            yt.backward(torch.tensor(dy))
            y, dx = np.empty(oshape, np.float32), np.empty_like(x)
            if kind == "max":
                P.maxpool2d_forward_ref(x, y, **hp, ceil_mode=True)
                P.maxpool2d_backward_ref(x, y, dy, dx, **hp, ceil_mode=True)
            else:
                P.avgpool2d_forward_ref(x, y, **hp, ceil_mode=True, count_include_pad=include)
                P.avgpool2d_backward_ref(dy, dx, **hp, ceil_mode=True, count_include_pad=include)
            np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-6, atol=1e-6, err_msg=kind)
            np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-6, atol=1e-6, err_msg=kind)
