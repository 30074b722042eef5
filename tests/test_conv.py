"""Convolution: gradient checks of the references, bit-identity of the algorithms, workspace sizes.

The generic tests (tests/test_kernels.py) compare every example with the NumPy reference; this
file checks what is specific to convolution: the algorithm (direct or im2col), the im2col chunk
and the gemm version must never change a single bit of the result, and ``workspace_bytes`` is
exactly what the launcher asks for.
"""
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from kernels import conv, gemm
from kernels._check import no_device_allocation
from kernels.im2col import col2im_ref, im2col_ref
from gradcheck import check_backward, rand64

OPS = ("forward", "backward_data", "backward_filter")

# (x shape, w shape, stride, padding): stride 2, asymmetric kernels and padding, Inception's 1x7
GRAD_CASES = [
    ((2, 3, 5, 6), (4, 3, 3, 3), 1, 1),
    ((2, 2, 7, 6), (3, 2, 3, 2), 2, (1, 0)),
    ((1, 2, 4, 9), (3, 2, 1, 7), 1, (0, 3)),
    ((2, 2, 6, 5), (2, 2, 2, 3), (2, 1), (3, 1)),  # rows of y entirely in the padding
]
# tiny, for the simulator: every algorithm, chunk and gemm version runs on each
BIT_CASES = [
    ((2, 2, 5, 4), (3, 2, 3, 2), 2, (1, 0)),
    ((2, 3, 4, 7), (2, 3, 1, 3), (1, 2), (0, 1)),
]


def _ref_forward(x, w, stride, padding):
    y = np.empty(conv.output_shape(x.shape, w.shape, stride, padding), x.dtype)
    conv.conv2d_forward_ref(x, w, y, stride=stride, padding=padding)
    return y


# ---------------------------------------------------------------- references
@pytest.mark.parametrize("xs,ws,stride,padding", GRAD_CASES)
def test_backward_references_match_central_differences(rng, xs, ws, stride, padding):
    x, w = rand64(rng, *xs), rand64(rng, *ws)
    dy = rand64(rng, *conv.output_shape(xs, ws, stride, padding))
    dx, dw = np.empty_like(x), np.empty_like(w)
    conv.conv2d_backward_data_ref(dy, w, dx, stride=stride, padding=padding)
    conv.conv2d_backward_filter_ref(x, dy, dw, stride=stride, padding=padding)
    check_backward("conv2d", lambda: _ref_forward(x, w, stride, padding), {"x": dx, "w": dw},
                   {"x": x, "w": w}, dy)


def test_forward_reference_matches_the_definition(rng):
    x, w = rand64(rng, 2, 3, 6, 5), rand64(rng, 4, 3, 3, 2)
    stride, padding = (2, 1), (1, 2)
    y = _ref_forward(x, w, stride, padding)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)))
    for oh in range(y.shape[2]):
        for ow in range(y.shape[3]):
            window = xp[:, :, 2 * oh:2 * oh + 3, ow:ow + 2]
            np.testing.assert_allclose(y[:, :, oh, ow], np.einsum("nchw,ochw->no", window, w), rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 7), w=st.integers(1, 7),
       kh=st.integers(1, 4), kw=st.integers(1, 4), sh=st.integers(1, 3), sw=st.integers(1, 3),
       ph=st.integers(0, 3), pw=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_col2im_is_the_adjoint_of_im2col(n, c, h, w, kh, kw, sh, sw, ph, pw, seed):
    if kh > h + 2 * ph or kw > w + 2 * pw:
        return
    rng = np.random.default_rng(seed)
    hyper = {"kernel_size": (kh, kw), "stride": (sh, sw), "padding": (ph, pw)}
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    x, c_in = rand64(rng, n, c, h, w), rand64(rng, n, c * kh * kw, oh * ow)
    col, dx = np.empty_like(c_in), np.empty_like(x)
    im2col_ref(x, col, **hyper)
    col2im_ref(c_in, dx, **hyper)
    assert np.isclose(np.vdot(col, c_in), np.vdot(x, dx), rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- algorithms agree bit for bit
def _inputs(rng, op, xs, ws, stride, padding):
    ys = conv.output_shape(xs, ws, stride, padding)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    x = np.maximum(r(*xs), 0)  # exact zeros, as after a ReLU
    nan = lambda s: np.full(s, np.nan, np.float32)  # noqa: E731
    return {"forward": (x, r(*ws), nan(ys)), "backward_data": (r(*ys), r(*ws), nan(xs)),
            "backward_filter": (x, r(*ys), nan(ws))}[op]


# where x and w (or dx, dw) are
_X_W = {"forward": (0, 1), "backward_data": (2, 1), "backward_filter": (0, 2)}


def _run(op, args, stride, padding, algo, version, chunk=1, block=None, extra_floats=0):
    """Run ``conv2d_<op>`` on device copies (with a NaN workspace of exactly the size it needs
    plus ``extra_floats``); return the output on the host."""
    xs, ws = (args[i].shape for i in _X_W[op])
    need = conv.workspace_bytes(op, algo, xs, ws, stride, padding, chunk) // 4
    dev = [cuda.to_device(a) for a in args]
    work = cuda.to_device(np.full(need + extra_floats, np.nan, np.float32)) if algo == "im2col" else None
    launch = getattr(conv, f"conv2d_{op}")
    with no_device_allocation():
        launch(*dev, stride=stride, padding=padding, algo=algo, workspace=work, chunk=chunk, version=version,
               block=block)
    cuda.synchronize()
    return dev[2].copy_to_host()


def _all_runs(op, n, gemm_block=None):
    """(label, algo, version, chunk): every direct version; im2col with every gemm version (chunk 1)
    and with every chunk (first gemm version), a chunk larger than the batch included."""
    runs = [(f"direct {v}", "direct", v, 1) for v in conv.DIRECT_VERSIONS[op]]
    runs += [(f"im2col gemm {v}", "im2col", v, 1) for v in gemm.VERSIONS]
    runs += [(f"im2col chunk {c}", "im2col", gemm.VERSIONS[0], c) for c in range(2, n + 2)]
    return runs


def _assert_bit_identical(op, args, stride, padding, runs, block=None):
    want = getattr(conv, f"conv2d_{op}_ref")
    ref = args[2].copy()
    want(*[a.copy() for a in args[:2]], ref, stride=stride, padding=padding)
    first_label, first = None, None
    for label, algo, version, chunk in runs:
        got = _run(op, args, stride, padding, algo, version, chunk, block, extra_floats=chunk)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=f"{op} {label} vs reference")
        if first is None:
            first_label, first = label, got
            continue
        same = got.view(np.uint32) == first.view(np.uint32)
        assert same.all(), (f"conv2d_{op}: {label} differs from {first_label} in {int((~same).sum())} of "
                            f"{same.size} elements, first at {tuple(int(i) for i in np.argwhere(~same)[0])}")


@pytest.mark.parametrize("case", range(len(BIT_CASES)))
@pytest.mark.parametrize("op", OPS)
def test_algorithms_chunks_and_gemm_versions_are_bit_identical(rng, op, case):
    xs, ws, stride, padding = BIT_CASES[case]
    runs = _all_runs(op, xs[0])
    if case > 0:  # the gemm versions once per op are enough for the slow simulator
        runs = [r for r in runs if r[1] == "direct" or r[2] == gemm.VERSIONS[0]]
    _assert_bit_identical(op, _inputs(rng, op, xs, ws, stride, padding), stride, padding, runs, block=(8, 8))


@pytest.mark.parametrize("xs,ws,stride,padding", [((4, 2, 5, 4), (3, 2, 3, 2), 2, (1, 0)),
                                                  ((3, 3, 4, 7), (2, 3, 1, 3), (1, 2), (0, 1))])
def test_split_backward_filter_is_bit_identical_at_every_chunk(rng, xs, ws, stride, padding):
    """direct v3 (each image of a chunk in its own blocks, then the fold in order) at every chunk size,
    from one image per launch to more than the batch, equals v2 and im2col bit for bit."""
    _assert_split_bit_identical(rng, xs, ws, stride, padding, (4, 4, 2, 2))


@pytest.mark.gpu
def test_split_backward_filter_is_bit_identical_on_a_real_gpu(rng):
    _assert_split_bit_identical(rng, (6, 16, 15, 15), (24, 16, 3, 3), 2, 1, None)


def _assert_split_bit_identical(rng, xs, ws, stride, padding, gemm_block):
    n = xs[0]
    runs = [("direct v2", "direct", "v2", 1)]
    runs += [(f"direct v3 chunk {c}", "direct", "v3", c) for c in sorted({1, 2, n - 1, n + 1})]  # n-1: a tail
    runs += [(f"im2col chunk {c}", "im2col", "v3", c) for c in (2, n)]
    args = _inputs(rng, "backward_filter", xs, ws, stride, padding)
    want = conv.conv2d_backward_filter_ref
    ref = args[2].copy()
    want(*[a.copy() for a in args[:2]], ref, stride=stride, padding=padding)
    first = None
    for label, algo, version, chunk in runs:
        need = conv.workspace_bytes("backward_filter", algo, xs, ws, stride, padding, chunk, version) // 4
        dev = [cuda.to_device(a) for a in args]
        work = cuda.to_device(np.full(need + 1, np.nan, np.float32))
        with no_device_allocation():
            conv.conv2d_backward_filter(*dev, stride=stride, padding=padding, algo=algo,
                                        workspace=work, chunk=chunk,
                                        version=version, block=gemm_block if algo == "im2col" else None)
        got = dev[2].copy_to_host()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5, err_msg=label)
        first = got if first is None else first
        assert np.array_equal(got.view(np.uint32), first.view(np.uint32)), f"{label} differs from direct v2"


@pytest.mark.parametrize("op", OPS)
def test_a_batch_over_grid_z_is_launched_in_parts_with_the_same_bits(rng, monkeypatch, op):
    """A launch whose grid z holds images (direct forward v2, backward_filter v3, im2col's batched
    gemm) takes at most MAX_GRID_Z of them (made 2 here): more go in parts, in order, the output
    bit for bit that of one launch, and launches / launch_counts count every part."""
    xs, ws, stride, padding = (3, 2, 5, 4), (3, 2, 3, 2), 2, (1, 0)  # 3 images: parts of 2 and 1
    args = _inputs(rng, op, xs, ws, stride, padding)
    runs = [("direct", "v2" if op != "backward_data" else "v1", 1), ("im2col", "v1", 3)]
    if op == "backward_filter":
        runs += [("direct", "v3", 3)]

    def go():
        outs = []
        for algo, version, chunk in runs:
            need = conv.workspace_bytes(op, algo, xs, ws, stride, padding, chunk, version) // 4
            dev = [cuda.to_device(a) for a in args]
            work = cuda.to_device(np.full(need + 1, np.nan, np.float32))
            getattr(conv, f"conv2d_{op}")(*dev, stride=stride, padding=padding, algo=algo, workspace=work,
                                          chunk=chunk, version=version,
                                          block=(4, 4) if algo == "im2col" else None)
            outs.append(dev[2].copy_to_host())
        return outs

    whole = go()
    monkeypatch.setattr(conv, "MAX_GRID_Z", 2)
    monkeypatch.setattr(gemm, "MAX_GRID_Z", 2)
    for (algo, version, chunk), got, want in zip(runs, go(), whole):
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{algo} {version} chunk {chunk}"
        shapes = (args[_X_W[op][0]].shape, args[_X_W[op][1]].shape)
        launched = conv.launches(op, algo, *shapes, stride, padding, chunk, version, (4, 4))
        assert max(launch.grid[2] for launch in launched) <= 2
        counted = conv.launch_counts(op, algo, *shapes, stride, padding, chunk, version, (4, 4))
        assert Counter(launched) == Counter(dict(counted))
    ref = args[2].copy()
    getattr(conv, f"conv2d_{op}_ref")(*[a.copy() for a in args[:2]], ref, stride=stride, padding=padding)
    np.testing.assert_allclose(whole[0], ref, rtol=1e-4, atol=1e-5)


def test_a_batch_over_grid_z_is_counted_in_parts():
    """launch_counts (the planner's cost estimate) counts every part of a chunk wider than grid z."""
    for op, algo, chunk, version in (("forward", "im2col", 70_000, None), ("forward", "direct", 1, None),
                                     ("backward_data", "im2col", 200_000, None),
                                     ("backward_filter", "direct", 70_000, "v3")):
        launched = conv.launches(op, algo, (270_000, 1, 28, 28), (20, 1, 5, 5), 1, 0, chunk, version)
        assert max(launch.grid[2] for launch in launched) == gemm.MAX_GRID_Z
        assert Counter(launched) == Counter(dict(conv.launch_counts(op, algo, (270_000, 1, 28, 28),
                                                                    (20, 1, 5, 5), 1, 0, chunk, version)))


def test_split_backward_filter_defaults_and_workspace(rng):
    """version=None: v3 when the chunk is more than one image (it needs the workspace), else v2; v3 refuses
    a workspace too small for its partial sums."""
    xs, ws = (4, 2, 4, 4), (3, 2, 2, 2)
    assert [l.kernel.rsplit(".", 1)[1]
            for l in conv.launches("backward_filter", "direct", xs, ws, chunk=1)] == \
        ["_backward_filter_v2"]
    assert [l.kernel.rsplit(".", 1)[1]
            for l in conv.launches("backward_filter", "direct", xs, ws, chunk=3)] == \
        ["_backward_filter_v3", "_fold_v1", "_backward_filter_v3"]  # chunks of 3 and 1 images
    args = [cuda.to_device(a) for a in _inputs(rng, "backward_filter", xs, ws, 1, 0)]
    need = conv.workspace_bytes("backward_filter", "direct", xs, ws, chunk=3)
    assert need == 4 * 2 * 3 * 8
    with pytest.raises(ValueError,
                       match=f"workspace too small for algo 'direct' with chunk=3: needs {need} bytes"):
        conv.conv2d_backward_filter(*args, algo="direct", chunk=3,
                                    workspace=cuda.to_device(np.zeros(4, np.float32)))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("xs,ws,stride,padding", [
    ((4, 16, 15, 15), (24, 16, 3, 3), 2, 1),
    ((3, 8, 17, 17), (12, 8, 1, 7), 1, (0, 3)),
    ((2, 16, 9, 11), (32, 16, 5, 5), 1, 2),
])
def test_bit_identical_on_a_real_gpu(rng, op, xs, ws, stride, padding):
    """Real shapes on real hardware, where FMA contraction and the gemm's default blocks matter."""
    runs = _all_runs(op, xs[0])
    _assert_bit_identical(op, _inputs(rng, op, xs, ws, stride, padding), stride, padding, runs)


# ---------------------------------------------------------------- workspace
@pytest.mark.parametrize("op", OPS)
def test_workspace_bytes(op):
    xs, ws, stride, padding = (3, 2, 6, 5), (4, 2, 3, 2), (2, 1), (1, 0)
    assert conv.workspace_bytes(op, "direct", xs, ws, stride, padding, chunk=1) == 0
    # direct needs none, but for backward_filter's split version (v3, its default when chunk > 1): the
    # partial sums of a chunk's images but the first, (chunk - 1) x Cout x C*KH*KW floats
    split = 4 * (2 - 1) * 4 * (2 * 3 * 2) if op == "backward_filter" else 0
    assert conv.workspace_bytes(op, "direct", xs, ws, stride, padding, chunk=2) == split
    assert conv.workspace_bytes(op, "direct", xs, ws, stride, padding, chunk=9) == 2 * split  # capped at N
    for version in conv.DIRECT_VERSIONS[op][:2]:
        assert conv.workspace_bytes(op, "direct", xs, ws, stride, padding, chunk=2, version=version) == 0
    one = conv.workspace_bytes(op, "im2col", xs, ws, stride, padding)
    _, _, oh, ow = conv.output_shape(xs, ws, stride, padding)
    assert one == 4 * (2 * 3 * 2) * (oh * ow)  # one float32 column buffer: C*KH*KW x OH*OW
    for chunk in (1, 2, 3):
        assert conv.workspace_bytes(op, "im2col", xs, ws, stride, padding, chunk=chunk) == chunk * one
    assert conv.workspace_bytes(op, "im2col", xs, ws, stride, padding, chunk=7) == 3 * one  # capped at N


@pytest.mark.parametrize("chunk", [1, 2, 5])
@pytest.mark.parametrize("op", OPS)
def test_launcher_needs_exactly_workspace_bytes(rng, op, chunk):
    xs, ws, stride, padding = (2, 2, 4, 3), (3, 2, 2, 2), 1, (1, 0)
    args = _inputs(rng, op, xs, ws, stride, padding)
    need = conv.workspace_bytes(op, "im2col", xs, ws, stride, padding, chunk)
    _run(op, args, stride, padding, "im2col", "v1", chunk)  # exactly the bytes asked for: fine
    with pytest.raises(ValueError, match=f"conv2d_{op}: workspace too small .*chunk={chunk}: needs {need} "
                                         f"bytes, got {need - 4} bytes"):
        _run(op, args, stride, padding, "im2col", "v1", chunk, extra_floats=-1)
    dev = [cuda.to_device(a) for a in args]
    launch = getattr(conv, f"conv2d_{op}")
    with pytest.raises(ValueError, match=f"needs a workspace of {need} bytes, got none"):
        launch(*dev, stride=stride, padding=padding, algo="im2col", chunk=chunk)
    with pytest.raises(ValueError, match="workspace: expected dtype float32"):
        launch(*dev, stride=stride, padding=padding, algo="im2col", chunk=chunk,
               workspace=cuda.to_device(np.zeros(need, np.float64)))
    launch(*dev, stride=stride, padding=padding, algo="direct")  # direct needs none


def test_empty_batch_gives_a_zero_filter_gradient():
    x, dy = np.zeros((0, 2, 4, 4), np.float32), np.zeros((0, 3, 2, 2), np.float32)
    dw = cuda.to_device(np.full((3, 2, 3, 3), np.nan, np.float32))
    conv.conv2d_backward_filter(cuda.to_device(x), cuda.to_device(dy), dw, algo="im2col", workspace=None)
    assert np.array_equal(dw.copy_to_host(), np.zeros((3, 2, 3, 3), np.float32))


# ---------------------------------------------------------------- shapes, flops, errors
def test_output_shape_and_flops():
    assert conv.output_shape((1, 8, 17, 17), (4, 8, 1, 7), 1, (0, 3)) == (1, 4, 17, 17)  # "same" padding
    assert conv.output_shape((2, 3, 227, 227), (96, 3, 11, 11), 4, 0) == (2, 96, 55, 55)  # AlexNet conv1
    xs, ws = (3, 5, 9, 8), (7, 5, 3, 2)
    n, co, oh, ow = conv.output_shape(xs, ws, 2, (1, 0))
    # one gemm per image
    assert conv.conv_flops(xs, ws, 2, (1, 0)) == n * gemm.gemm_flops(co, oh * ow, 5 * 3 * 2)


@pytest.mark.parametrize("call,match", [
    (lambda: conv.output_shape((2, 3, 5, 5), (4, 2, 3, 3)), r"x has 3 channels \(shape \(2, 3, 5, 5\)\) but "
                                                            r"w expects 2 \(shape \(4, 2, 3, 3\)\)"),
    (lambda: conv.output_shape((2, 3, 5, 5), (4, 3, 7, 3), 1, (0, 1)), r"kernel 7x3 is larger than the "
                                                                        r"padded input 5x7"),
    (lambda: conv.output_shape((2, 3, 5), (4, 3, 3, 3)), r"expected x \(N, C, H, W\)"),
    (lambda: conv.output_shape((2, 3, 5, 5), (4, 3, 3, 3), 0), "stride must be >= 1"),
    (lambda: conv.output_shape((2, 3, 5, 5), (4, 3, 3, 3), 1, (-1, 0)), "padding must be >= 0"),
    (lambda: conv.output_shape((2, 3, 5, 5), (4, 3, 3, 3), (1, 2, 3)), "stride: expected an int or a pair"),
    (lambda: conv.workspace_bytes("backward", "im2col", (2, 3, 5, 5), (4, 3, 3, 3)), "unknown op 'backward'"),
    (lambda: conv.workspace_bytes("forward", "fft", (2, 3, 5, 5), (4, 3, 3, 3)), "unknown algo 'fft'"),
    (lambda: conv.workspace_bytes("forward", "im2col", (2, 3, 5, 5), (4, 3, 3, 3), chunk=0), "chunk must be"),
])
def test_shape_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_launcher_errors(rng):
    x, w = cuda.to_device(rng.standard_normal((2, 3, 5, 5)).astype(np.float32)), cuda.to_device(
        rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    y = cuda.to_device(np.zeros((2, 4, 3, 3), np.float32))
    with pytest.raises(ValueError,
                       match=r"conv2d_forward y: expected shape \(2, 4, 5, 5\), got \(2, 4, 3, 3\)"):
        conv.conv2d_forward(x, w, y, padding=1, algo="direct")
    with pytest.raises(ValueError, match="conv2d_forward: unknown algo 'winograd'"):
        conv.conv2d_forward(x, w, y, algo="winograd")
    with pytest.raises(ValueError,
                       match=r"conv2d_backward_data: algo 'direct' has versions \('v1',\), got 'v2'"):
        conv.conv2d_backward_data(y, w, x, algo="direct", version="v2")
    with pytest.raises(ValueError, match="conv2d_forward: algo 'im2col' has versions .*, got 'v9'"):
        conv.conv2d_forward(x, w, y, algo="im2col", version="v9")
    with pytest.raises(ValueError, match="conv2d_backward_filter: chunk must be an int >= 1, got 0"):
        conv.conv2d_backward_filter(x, y, w, algo="im2col", chunk=0)
    with pytest.raises(ValueError, match="conv2d_backward_filter dy: expected dtype float32, got float64"):
        conv.conv2d_backward_filter(x, cuda.to_device(np.zeros((2, 4, 3, 3))), w, algo="direct")


# ---------------------------------------------------------------- groups (depthwise included)
# (x shape, w shape, stride, padding, groups): two groups; depthwise; depthwise with 2 outputs a channel
GROUP_CASES = [
    ((2, 4, 5, 4), (6, 2, 3, 2), 1, (1, 0), 2),
    ((2, 3, 6, 5), (3, 1, 3, 3), 2, 1, 3),
    ((1, 2, 5, 5), (4, 1, 3, 3), (1, 2), 1, 2),
]


@pytest.mark.parametrize("xs,ws,stride,padding,groups", GROUP_CASES)
def test_grouped_references_match_central_differences(rng, xs, ws, stride, padding, groups):
    x, w = rand64(rng, *xs), rand64(rng, *ws)
    ys = conv.output_shape(xs, ws, stride, padding, groups)
    dy = rand64(rng, *ys)
    dx, dw = np.empty_like(x), np.empty_like(w)
    conv.conv2d_backward_data_ref(dy, w, dx, stride=stride, padding=padding, groups=groups)
    conv.conv2d_backward_filter_ref(x, dy, dw, stride=stride, padding=padding, groups=groups)

    def forward():
        y = np.empty(ys, x.dtype)
        conv.conv2d_forward_ref(x, w, y, stride=stride, padding=padding, groups=groups)
        return y

    check_backward("grouped conv2d", forward, {"x": dx, "w": dw}, {"x": x, "w": w}, dy)


@pytest.mark.parametrize("xs,ws,stride,padding,groups", GROUP_CASES)
def test_grouped_forward_reference_is_one_convolution_per_group(rng, xs, ws, stride, padding, groups):
    """Group g's outputs are the plain convolution of its input channels alone with its filters."""
    x, w = rand64(rng, *xs), rand64(rng, *ws)
    y = np.empty(conv.output_shape(xs, ws, stride, padding, groups))
    conv.conv2d_forward_ref(x, w, y, stride=stride, padding=padding, groups=groups)
    cg, cog = xs[1] // groups, ws[0] // groups
    for g in range(groups):
        want = _ref_forward(x[:, g * cg:(g + 1) * cg].copy(), w[g * cog:(g + 1) * cog], stride, padding)
        assert np.array_equal(y[:, g * cog:(g + 1) * cog], want)


@pytest.mark.parametrize("op", OPS)
def test_grouped_direct_versions_and_chunks_are_bit_identical(rng, op):
    """Every direct version (and backward-filter's split v3 at every chunk) gives the same bits on a
    grouped conv whose groups span two TILE-row tiles each; im2col is refused, not run."""
    xs, ws, stride, padding, groups = (2, 4, 3, 2), (34, 2, 1, 2), 1, (1, 0), 2
    ys = conv.output_shape(xs, ws, stride, padding, groups)
    shapes = {"forward": (xs, ws, ys), "backward_data": (ys, ws, xs), "backward_filter": (xs, ys, ws)}[op]
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    runs = [(v, 1) for v in conv.DIRECT_VERSIONS[op]]
    if op == "backward_filter":
        runs += [("v3", 2)]  # the split: each image of the chunk in its own blocks, then the fold
    first = None
    for version, chunk in runs:
        need = conv.workspace_bytes(op, "direct", xs, ws, stride, padding, chunk, version, groups) // 4
        dev = [cuda.to_device(a) for a in args]
        conv.LAUNCHERS[op](*dev, stride=stride, padding=padding, groups=groups, algo="direct", chunk=chunk,
                           version=version, workspace=cuda.to_device(np.zeros(max(need, 1), np.float32)))
        got = dev[2].copy_to_host()
        if first is None:
            first = got
            want = args[2].copy()
            conv.OPS[f"conv2d_{op}"].reference(*args[:2], want, stride=stride, padding=padding, groups=groups)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert np.array_equal(got.view(np.uint32), first.view(np.uint32)), f"{op} {version} c{chunk}"
    with pytest.raises(ValueError, match="algo 'im2col' runs groups=1 only, got groups=2"):
        conv.LAUNCHERS[op](*[cuda.to_device(a) for a in args], stride=stride, padding=padding, groups=groups,
                           algo="im2col")


def test_grouped_shapes_flops_workspace_and_launches():
    xs, ws = (2, 8, 9, 9), (8, 1, 3, 3)  # depthwise
    assert conv.output_shape(xs, ws, 1, 1, groups=8) == (2, 8, 9, 9)
    assert conv.conv_flops(xs, ws, 1, 1, groups=8) == 2 * 2 * 8 * 81 * 9  # 9 multiply-adds an output
    # v3 keeps Cout x C/groups*KH*KW partial sums per image but the first
    assert conv.workspace_bytes("backward_filter", "direct", xs, ws, 1, 1, 2, groups=8) == 4 * 8 * 9
    (fwd,) = conv.launches("forward", "direct", xs, ws, 1, 1, groups=8)
    assert fwd.kernel == "kernels.conv._forward_v2_grouped" and fwd.grid[1] == 8  # a tile row per group
    assert conv.launches("forward", "direct", xs, (8, 8, 3, 3), 1, 1)[0].kernel == "kernels.conv._forward_v2"


@pytest.mark.parametrize("call,match", [
    (lambda: conv.output_shape((2, 6, 5, 5), (4, 3, 3, 3), groups=4),
     r"in_channels \(6\) must be divisible by groups \(4\)"),
    (lambda: conv.output_shape((2, 6, 5, 5), (4, 2, 3, 3), groups=3),
     r"out_channels \(4\) must be divisible"),
    (lambda: conv.output_shape((2, 6, 5, 5), (6, 3, 3, 3), groups=3),
     r"x has 6 channels .* / groups 3 but w expects 3"),
    (lambda: conv.output_shape((2, 6, 5, 5), (6, 3, 3, 3), groups=0), "groups must be an integer >= 1"),
    (lambda: conv.workspace_bytes("forward", "im2col", (2, 4, 5, 5), (4, 2, 3, 3), groups=2),
     "im2col' runs groups=1 only"),
])
def test_group_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("xs,ws,stride,padding,groups", GROUP_CASES)
def test_grouped_references_match_pytorch(rng, xs, ws, stride, padding, groups):
    torch = pytest.importorskip("torch")
    x, w = rand64(rng, *xs), rand64(rng, *ws)
    dy = rand64(rng, *conv.output_shape(xs, ws, stride, padding, groups))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, stride=stride, padding=padding, groups=groups)
    ty.backward(torch.tensor(dy))
    y, dx, dw = np.empty(dy.shape), np.empty_like(x), np.empty_like(w)
    conv.conv2d_forward_ref(x, w, y, stride=stride, padding=padding, groups=groups)
    conv.conv2d_backward_data_ref(dy, w, dx, stride=stride, padding=padding, groups=groups)
    conv.conv2d_backward_filter_ref(x, dy, dw, stride=stride, padding=padding, groups=groups)
    for name, got, want in (("y", y, ty), ("dx", dx, tx.grad), ("dw", dw, tw.grad)):
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
