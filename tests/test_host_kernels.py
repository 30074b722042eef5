"""The host device's fast kernels (kernels/host/) against the references, on random shapes.

Convolution sums in BLAS's order, so it agrees with the reference within the conv tolerance of
tests/test_conv.py (rtol 1e-4, atol 1e-5); max pooling and ReLU must give the reference's bits
exactly, ties, -0.0, infinities and NaN included. The host device must run the fast versions.
"""
import numpy as np
import pytest

from kernels import all_ops, conv
from kernels import host as H
from kernels.host import conv as host_conv
from kernels import pooling as P
from snlite.device import HostDevice

OPS = all_ops()


def _conv_cases(seed=0, count=14):
    """Random conv geometries: odd sizes, strides 1-3 and padding 0-2 per axis, 1xK and Kx1 kernels."""
    rng = np.random.default_rng(seed)
    cases = [((2, 3, 7, 5), (4, 3, 3, 3), 1, 1), ((3, 2, 9, 8), (5, 2, 1, 3), (2, 1), (0, 1)),
             ((2, 2, 6, 5), (2, 2, 2, 3), (2, 1), (3, 1)),  # rows of y entirely in the padding
             ((1, 4, 5, 5), (3, 4, 5, 5), 1, 0), ((2, 3, 8, 8), (4, 3, 1, 1), 2, 0),
             # stride 1, kernels up to 3x3: backward-data by the transposed conv
             ((2, 2, 6, 7), (3, 2, 2, 3), 1, (1, 2)), ((3, 2, 5, 6), (2, 2, 3, 1), 1, 0),
             ((2, 3, 4, 4), (2, 3, 1, 1), 1, 0)]
    while len(cases) < count:
        kh, kw = (int(v) for v in rng.integers(1, 5, 2))
        ph, pw = (int(v) for v in rng.integers(0, 3, 2))
        h, w = int(rng.integers(max(kh - 2 * ph, 1), 12)), int(rng.integers(max(kw - 2 * pw, 1), 12))
        stride = tuple(int(v) for v in rng.integers(1, 4, 2))
        n, c, co = (int(v) for v in rng.integers(1, 5, 3))
        cases.append(((n, c, h, w), (co, c, kh, kw), stride, (ph, pw)))
    return cases


def _run(fn, args, out, **kwargs):
    args = [a.copy() for a in args]
    fn(*args, **kwargs)
    return args[out]


@pytest.mark.parametrize("xs,ws,stride,padding", _conv_cases())
def test_conv_matches_the_reference(rng, xs, ws, stride, padding):
    ys = conv.output_shape(xs, ws, stride, padding)

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def nan(*shape):
        return np.full(shape, np.nan, np.float32)

    args = {"forward": ((r(*xs), r(*ws), nan(*ys)), 2), "backward_data": ((r(*ys), r(*ws), nan(*xs)), 2),
            "backward_filter": ((r(*xs), r(*ys), nan(*ws)), 2)}
    for op, (a, out) in args.items():
        name = f"conv2d_{op}"
        hyper = {"stride": stride, "padding": padding, "algo": "im2col", "chunk": 2, "workspace": None}
        want = _run(OPS[name].reference, a, out, **hyper)
        got = _run(H.FAST[name], a, out, **hyper)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name} {xs} {ws} s{stride} p{padding}")


@pytest.mark.parametrize("xs,ws,stride,padding,groups", [
    ((2, 4, 7, 5), (6, 2, 3, 3), 1, 1, 2), ((3, 6, 8, 7), (6, 1, 3, 3), 2, 1, 6),  # two groups; depthwise
    ((2, 3, 5, 6), (6, 1, 3, 2), 1, (1, 0), 3),  # depthwise, 2 outputs a channel, stride 1
])
def test_grouped_conv_matches_the_reference(rng, xs, ws, stride, padding, groups):
    ys = conv.output_shape(xs, ws, stride, padding, groups)
    args = {"forward": (xs, ws, ys), "backward_data": (ys, ws, xs), "backward_filter": (xs, ys, ws)}
    for op, shapes in args.items():
        out = 2
        a = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        a[out][...] = np.nan
        name = f"conv2d_{op}"
        hyper = {"stride": stride, "padding": padding, "groups": groups}
        want = _run(OPS[name].reference, a, out, **hyper)
        np.testing.assert_allclose(_run(H.FAST[name], a, out, **hyper), want, rtol=1e-4, atol=1e-5,
                                   err_msg=f"{name} {xs} {ws} groups {groups}")


POOL_CASES = [  # (x shape, hyper-parameters)
    ((2, 3, 9, 11), {"kernel": 3, "stride": 2, "padding": 1}),
    ((2, 3, 8, 7), {"kernel": 2}),
    ((1, 2, 7, 9), {"kernel": (3, 2), "stride": (1, 2), "padding": (1, 0)}),
    ((2, 2, 5, 6), {"kernel": 3, "stride": 1}),
    ((1, 2, 9, 9), {"kernel": 2, "stride": 3}),  # stride > kernel: rows and columns no window reads
    ((3, 1, 4, 4), {"kernel": 4, "padding": 2}),
    # ceil mode: the last windows run off the end (past the padding too)
    ((2, 2, 8, 7), {"kernel": 3, "stride": 2, "ceil_mode": True}),
    ((1, 2, 8, 7), {"kernel": (3, 2), "stride": (2, 3), "padding": (1, 0), "ceil_mode": True}),
]


def _pool_shape(shape, hp):
    return P.pool_output_shape(shape, hp["kernel"], hp.get("stride"), hp.get("padding", 0),
                               ceil_mode=hp.get("ceil_mode", False))


def _pool_inputs(rng, shape, kind):
    if kind == "ties":  # small integers: many windows hold their maximum twice
        return rng.integers(-1, 2, shape).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "special":  # -inf everywhere in some windows, +inf, -0.0 against 0.0
        x.flat[::3] = -np.inf
        x.flat[1::11] = np.inf
        x.flat[2::5] = -0.0
        x.flat[4::5] = 0.0
    if kind == "nan":
        x.flat[::7] = np.nan
    return x


def _bits_equal(got, want, what):
    assert got.shape == want.shape
    bad = got.view(np.uint32) != want.view(np.uint32)
    assert not bad.any(), f"{what}: {bad.sum()} elements differ in their bits, first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("kind", ["normal", "ties", "special", "nan"])
@pytest.mark.parametrize("shape,hp", POOL_CASES)
def test_maxpool_matches_the_reference_bit_for_bit(rng, shape, hp, kind):
    x = _pool_inputs(rng, shape, kind)
    oshape = _pool_shape(shape, hp)
    want_y = _run(P.maxpool2d_forward_ref, (x, np.full(oshape, 7.0, np.float32)), 1, **hp)
    got_y = _run(H.maxpool2d_forward, (x, np.full(oshape, 7.0, np.float32)), 1, **hp)
    # NaN: the same places; its payload bits are NumPy's business
    np.testing.assert_array_equal(np.isnan(got_y), np.isnan(want_y))
    _bits_equal(np.nan_to_num(got_y), np.nan_to_num(want_y), f"maxpool forward {kind}")
    dy = rng.standard_normal(oshape).astype(np.float32)
    dy.flat[::4] = -0.0
    for y in (want_y, want_y + 1.0):  # a y from this x; one that is not (every gradient dropped)
        args = (x, y, dy, np.full(shape, 7.0, np.float32))
        want = _run(P.maxpool2d_backward_ref, args, 3, **hp)
        _bits_equal(_run(H.maxpool2d_backward, args, 3, **hp), want, f"maxpool backward {kind}")


def test_relu_matches_the_reference_bit_for_bit_and_may_work_in_place(rng):
    x = rng.standard_normal((3, 4, 5, 7)).astype(np.float32)
    x.flat[::9], x.flat[1::9], x.flat[2::9], x.flat[3::9] = -0.0, np.nan, np.inf, -np.inf
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dy.flat[::5], dy.flat[1::7] = np.inf, np.nan
    y_want = _run(OPS["relu_forward"].reference, (x, np.empty_like(x)), 1)
    y_got = _run(H.relu_forward, (x, np.empty_like(x)), 1)
    _bits_equal(np.nan_to_num(y_got), np.nan_to_num(y_want), "relu forward")
    np.testing.assert_array_equal(np.isnan(y_got), np.isnan(y_want))
    dx_want = _run(OPS["relu_backward"].reference, (x, y_want, dy, np.empty_like(x)), 3)
    _bits_equal(_run(H.relu_backward, (x, y_want, dy, np.empty_like(x)), 3), dx_want, "relu backward")
    in_place = dy.copy()
    H.relu_backward(x, y_want, in_place, in_place)  # dx aliases dy, as the runtime may arrange
    _bits_equal(in_place, dx_want, "relu backward in place")
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)  # not the compiled loop's: the mask, 64 bits wide
    want64 = _run(OPS["relu_backward"].reference, (x64, x64, dy64, np.empty_like(x64)), 3)
    got64 = _run(H.relu_backward, (x64, x64, dy64, np.empty_like(x64)), 3)
    assert np.array_equal(got64.view(np.uint64), want64.view(np.uint64)), "relu backward, float64"


def test_relu6_matches_the_reference_bit_for_bit_and_may_work_in_place(rng):
    x = (rng.standard_normal((3, 4, 5, 7)) * 5 + 3).astype(np.float32)
    x.flat[:8] = [0.0, -0.0, 6.0, np.nextafter(np.float32(6), np.float32(7)), np.nan, np.inf, -np.inf, -1e-45]
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y_want = _run(OPS["relu6_forward"].reference, (x, np.empty_like(x)), 1)
    y_got = _run(H.relu6_forward, (x, np.empty_like(x)), 1)
    assert np.array_equal(y_got.view(np.uint32), y_want.view(np.uint32)), "relu6 forward"  # NaN, -0.0 too
    dx_want = _run(OPS["relu6_backward"].reference, (x, y_want, dy, np.empty_like(x)), 3)
    _bits_equal(_run(H.relu6_backward, (x, y_want, dy, np.empty_like(x)), 3), dx_want, "relu6 backward")
    in_place = dy.copy()
    H.relu6_backward(x, y_want, in_place, in_place)
    _bits_equal(in_place, dx_want, "relu6 backward in place")


def test_every_fast_kernel_is_a_known_op_and_the_host_device_runs_it(rng):
    assert set(H.FAST) <= set(OPS), f"fast kernels for unknown ops: {sorted(set(H.FAST) - set(OPS))}"
    for name, fn in H.FAST.items():
        assert H.host_kernel(OPS[name]) is fn
    assert H.host_kernel(OPS["softmax_xent_forward"]) is OPS["softmax_xent_forward"].reference
    # the host device's conv is the fast one: its bits, not necessarily the reference's
    dev = HostDevice()
    x = rng.standard_normal((4, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((8, 6, 3, 3)).astype(np.float32)
    y = np.empty(conv.output_shape(x.shape, w.shape, 1, 1), np.float32)
    dev.run("conv2d_forward", x, w, y, stride=1, padding=1, algo="im2col", chunk=2, stream=None, version="v1")
    _bits_equal(y, _run(H.conv2d_forward, (x, w, np.empty_like(y)), 2, stride=1, padding=1),
                "host device conv")


@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (2, 5, 1, 1), (3, 2, 9, 4)])
def test_batchnorm_matches_the_reference(rng, shape):
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    gamma, beta = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    stats = (rng.standard_normal(c).astype(np.float32),
             np.abs(rng.standard_normal(c)).astype(np.float32) + 0.5)
    for update in (True, False):
        args = (x, gamma, beta, np.empty_like(x), *stats, np.empty(c, np.float32), np.empty(c, np.float32))
        hyper = {"momentum": 0.1, "eps": 1e-5, "update_running": update}
        want = [a.copy() for a in args]
        OPS["batchnorm_forward_train"].reference(*want, **hyper)
        got = [a.copy() for a in args]
        H.batchnorm_forward_train(*got, **hyper)
        for i in (3, 4, 5, 6, 7):  # y, running mean and var, saved mean and invstd
            np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-5,
                                       err_msg=f"output {i}, update={update}")
    dy = rng.standard_normal(shape).astype(np.float32)
    for alias in (False, True):  # dx may be dy itself
        def run(fn):
            d = dy.copy()
            out = [x, d, gamma, want[6], want[7], d if alias else np.empty_like(x), np.empty(c, np.float32),
                   np.empty(c, np.float32)]
            fn(*out)
            return out[5:]
        for g, w, what in zip(run(H.batchnorm_backward), run(OPS["batchnorm_backward"].reference),
                              ("dx", "dgamma", "dbeta")):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{what}, alias={alias}")


def test_batchnorm_keeps_its_two_passes_far_from_zero(rng):
    """A mean 1000 standard deviations from zero: the variance of x - mean, not E[x^2] - mean^2
    (which cancels to noise in float32), against the statistics in float64."""
    x = (rng.standard_normal((4, 3, 6, 5)) + 1000.0).astype(np.float32)
    c = x.shape[1]
    mean, invstd = np.empty(c, np.float32), np.empty(c, np.float32)
    H.batchnorm_forward_train(x, np.ones(c, np.float32), np.zeros(c, np.float32), np.empty_like(x),
                              np.zeros(c, np.float32), np.ones(c, np.float32), mean, invstd)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(x64.var(axis=(0, 2, 3)) + 1e-5), rtol=1e-4)
    np.testing.assert_allclose(mean, x64.mean(axis=(0, 2, 3)), rtol=1e-6)


def test_batchnorm_leaves_what_its_loops_do_not_take_to_the_reference(rng):
    """Float64, or a view that is not contiguous: the reference's own bits."""
    x = rng.standard_normal((3, 2, 4, 8))
    for arr, what in ((x, "float64"), (x.astype(np.float32)[..., ::2], "a strided view")):
        c = arr.shape[1]
        args = (arr, np.ones(c, arr.dtype), np.zeros(c, arr.dtype), np.empty(arr.shape, arr.dtype),
                np.zeros(c, arr.dtype), np.ones(c, arr.dtype), np.empty(c, arr.dtype), np.empty(c, arr.dtype))
        want, got = ([arr] + [a.copy() for a in args[1:]] for _ in range(2))  # x itself: a copy is contiguous
        OPS["batchnorm_forward_train"].reference(*want)
        H.batchnorm_forward_train(*got)
        for g, w in zip(got[3:], want[3:]):
            assert np.array_equal(g, w), what


def test_conv_backward_data_reuses_the_filter_columns_only_for_the_same_dy(rng, monkeypatch):
    """Backward-filter leaves dy's columns for the backward-data that follows it (a layer's
    backward runs them in that order): the same bits as columns made afresh, made once, and never
    used for a dy that has changed in between, even in the same array."""
    x = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    w = rng.standard_normal((3, 4, 3, 3)).astype(np.float32)  # stride 1, 3x3, C >= Cout: the transposed conv
    dy = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    hp = {"stride": 1, "padding": 1}

    def data(d):
        dx = np.empty_like(x)
        H.conv2d_backward_data(d, w, dx, **hp)
        return dx

    fresh = data(dy)  # no backward-filter before it: columns made here
    made, original = [], host_conv._dy_columns
    monkeypatch.setattr(host_conv, "_dy_columns", lambda *a: made.append(1) or original(*a))
    H.conv2d_backward_filter(x, dy, np.empty_like(w), **hp)
    _bits_equal(data(dy), fresh, "dx from backward-filter's columns")
    assert len(made) == 1, "backward-data made the columns again"
    H.conv2d_backward_filter(x, dy, np.empty_like(w), **hp)
    dy[1, 2, 3, 4] += 1.0  # changed in place: the columns left behind are stale
    changed = data(dy)
    host_conv._DY.clear()
    _bits_equal(changed, data(dy), "dx after dy changed")
    assert not np.array_equal(changed, fresh)
    H.conv2d_backward_filter(x, dy, np.empty_like(w), **hp)
    H.conv2d_backward_data(dy, w, np.empty_like(x), **hp)
    made.clear()
    data(dy)  # the columns are used once: a second backward-data makes its own
    assert made == [1]


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape,hp", POOL_CASES + [((2, 3, 8, 8), {"kernel": 8})])  # ResNet's global pool too
def test_avgpool_matches_the_reference_bit_for_bit(rng, shape, hp, count_include_pad):
    x = _pool_inputs(rng, shape, "special")
    hp = dict(hp, count_include_pad=count_include_pad)
    oshape = _pool_shape(shape, hp)
    with np.errstate(invalid="ignore"):  # inf + -inf in a window: NaN, as the reference says
        want = _run(P.avgpool2d_forward_ref, (x, np.full(oshape, 7.0, np.float32)), 1, **hp)
    got = _run(H.avgpool2d_forward, (x, np.full(oshape, 7.0, np.float32)), 1, **hp)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    _bits_equal(np.nan_to_num(got), np.nan_to_num(want), "avgpool forward")
    dy = rng.standard_normal(oshape).astype(np.float32)
    dy.flat[::4] = -0.0
    args = (dy, np.full(shape, 7.0, np.float32))
    _bits_equal(_run(H.avgpool2d_backward, args, 1, **hp), _run(P.avgpool2d_backward_ref, args, 1, **hp),
                "avgpool backward")
