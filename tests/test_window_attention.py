"""Fused shifted-window attention (kernels.window_attention): each kernel on the simulator against its
reference, bit for bit the same on a second run; the references against an independent float64 formula
(pixel by pixel, torchvision's mask labels built with its slices), against central differences, and
against torchvision's own shifted_window_attention and its autograd; a NaN stays in its window; and the
launchers refuse a wrong shape or geometry by name. (Every example of ``python -m
kernels.window_attention`` runs in tests/test_kernels.py.)"""
import importlib.util

import numpy as np
import pytest
from numba import cuda

from gradcheck import check_backward, rand64
from kernels import attention as A
from kernels import window_attention as WA

TOL = {"rtol": 1e-4, "atol": 1e-5}
GRAD_TOL = {"rtol": 1e-4, "atol": 1e-4}


def _r(rng, *shape, loc=0.0):
    return (rng.standard_normal(shape) + loc).astype(np.float32)


def _table_shape(window, heads):
    return (2 * window[0] - 1) * (2 * window[1] - 1), heads


def _args(rng, n, c, heads, hw, window, loc=0.0):
    """qkv (N, 3C, H, W), table and dy (N, C, H, W)."""
    return _r(rng, n, 3 * c, *hw, loc=loc), _r(rng, *_table_shape(window, heads)), _r(rng, n, c, *hw)


def _device(*arrays):
    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def _run(qkv, table, dy, heads, window, shift, block=WA.BLOCK):
    """Both launchers on the simulator: (y, lse, dqkv, dtable) as NumPy arrays."""
    n, c, h, w = qkv.shape
    geo = {"heads": heads, "window": window, "shift": shift}
    y, lse, dqkv, dtable = _device(np.full_like(dy, np.nan), np.full((n, heads, h, w), np.nan, np.float32),
                                   np.full_like(qkv, np.nan), np.full_like(table, np.nan))
    qkv_, table_, dy_ = _device(qkv, table, dy)
    WA.window_attention_forward(qkv_, table_, y, lse, **geo, block=block)
    WA.window_attention_backward(qkv_, table_, y, dy_, lse, dqkv, dtable, **geo, block=block)
    return [a.copy_to_host() for a in (y, lse, dqkv, dtable)]


def _ref(qkv, table, dy, heads, window, shift):
    n, c, h, w = qkv.shape
    geo = {"heads": heads, "window": window, "shift": shift}
    y, lse, dqkv, dtable = (np.empty_like(dy), np.empty((n, heads, h, w), qkv.dtype), np.empty_like(qkv),
                            np.empty_like(table))
    WA.window_attention_forward_ref(qkv, table, y, lse, **geo)
    WA.window_attention_backward_ref(qkv, table, y, dy, lse, dqkv, dtable, **geo)
    return y, lse, dqkv, dtable


def _labels(hw, window, shift):
    """torchvision's attn_mask labels of the rolled map, built with its h_slices and w_slices."""
    (h, w), (wh, ww), (sh, sw) = hw, window, shift
    label, count = np.zeros((h, w)), 0
    for hs in ((0, -wh), (-wh, -sh), (-sh, None)):
        for ws in ((0, -ww), (-ww, -sw), (-sw, None)):
            label[hs[0]:hs[1], ws[0]:ws[1]] = count
            count += 1
    return label


def _forward64(qkv, table, heads, window, shift):
    """y and lse in float64, one query pixel at a time: its rolled position, its window's keys in token
    order, q.k / sqrt(dh) plus the table's bias and, when shifted, -100 across torchvision's labels."""
    n, c3, h, w = qkv.shape
    (wh, ww), (sh, sw), c = window, shift, c3 // 3
    dh = c // heads
    x, label = qkv.astype(np.float64), _labels((h, w), window, shift)
    y, lse = np.empty((n, c, h, w)), np.empty((n, heads, h, w))
    for b in range(n):
        for hd in range(heads):
            qs, ks, vs = (slice(o + hd * dh, o + (hd + 1) * dh) for o in (0, c, 2 * c))
            for i, j in np.ndindex(h, w):
                r, cc = (i - sh) % h, (j - sw) % w
                keys = [(r // wh * wh + a, cc // ww * ww + bb) for a in range(wh) for bb in range(ww)]
                s, vals = [], []
                for rk, ck in keys:
                    pix = ((rk + sh) % h, (ck + sw) % w)
                    bias = table[(r - rk + wh - 1) * (2 * ww - 1) + cc - ck + ww - 1, hd]
                    mask = -100.0 if sum(shift) and label[r, cc] != label[rk, ck] else 0.0
                    s.append(x[b, qs, i, j] @ x[b, ks][:, pix[0], pix[1]] / np.sqrt(dh) + bias + mask)
                    vals.append(x[b, vs][:, pix[0], pix[1]])
                s = np.array(s)
                lse[b, hd, i, j] = s.max() + np.log(np.exp(s - s.max()).sum())
                y[b, qs, i, j] = np.exp(s - lse[b, hd, i, j]) @ np.array(vals)
    return y, lse


# (n, c, heads, (H, W), window, shift, loc)
CASES = [(1, 2, 1, (4, 4), (2, 2), (0, 0), 0.0), (2, 4, 2, (4, 4), (2, 2), (1, 1), 0.0),
         (1, 4, 2, (2, 4), (2, 2), (0, 1), 0.0), (1, 6, 3, (2, 3), (2, 3), (0, 0), 0.0),
         (1, 2, 1, (4, 6), (2, 3), (1, 2), 0.0), (1, 4, 2, (4, 4), (2, 2), (1, 1), 30.0)]


@pytest.mark.parametrize("n,c,heads,hw,window,shift,loc", CASES)
def test_kernels_match_the_reference(rng, n, c, heads, hw, window, shift, loc):
    qkv, table, dy = _args(rng, n, c, heads, hw, window, loc)
    got = _run(qkv, table, dy, heads, window, shift, block=16)
    for name, want, g in zip(("y", "lse", "dqkv", "dtable"), _ref(qkv, table, dy, heads, window, shift), got):
        np.testing.assert_allclose(g, want, **(TOL if name in ("y", "lse") else GRAD_TOL),
                                   err_msg=f"{(n, c, heads, hw, window, shift)}: {name}")


def test_kernels_are_bit_reproducible(rng):
    qkv, table, dy = _args(rng, 1, 4, 2, (4, 4), (2, 2), loc=1.0)
    first, second = (_run(qkv, table, dy, 2, (2, 2), (1, 1), block=8) for _ in range(2))
    for a, b in zip(first, second):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("n,c,heads,hw,window,shift,loc", CASES)
def test_references_compute_the_float64_formula(rng, n, c, heads, hw, window, shift, loc):
    """The float32 references against the pixel-by-pixel formula in float64; with logits near 1,000
    (loc 30) the exp without its max would overflow, and lse keeps float32's error of 1,000."""
    qkv, table, dy = _args(rng, n, c, heads, hw, window, loc)
    y, lse, _, _ = _ref(qkv, table, dy, heads, window, shift)
    y64, lse64 = _forward64(qkv, table, heads, window, shift)
    assert np.isfinite(y).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(y, y64, rtol=1e-4, atol=1e-4 * max(1.0, loc))
    np.testing.assert_allclose(lse, lse64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,c,heads,hw,window,shift", [(1, 4, 2, (4, 4), (2, 2), (1, 1)),
                                                       (2, 2, 1, (2, 4), (2, 2), (0, 1)),
                                                       (1, 3, 3, (2, 3), (2, 3), (0, 0))])
def test_backward_reference_is_the_gradient_of_forward(rng, n, c, heads, hw, window, shift):
    qkv, dy = rand64(rng, n, 3 * c, *hw), rand64(rng, n, c, *hw)
    table = rand64(rng, *_table_shape(window, heads))
    geo = {"heads": heads, "window": window, "shift": shift}
    lse = np.empty((n, heads, *hw))

    def forward():
        y = np.empty_like(dy)
        WA.window_attention_forward_ref(qkv, table, y, lse, **geo)
        return y

    y = forward()
    dqkv, dtable = np.empty_like(qkv), np.empty_like(table)
    WA.window_attention_backward_ref(qkv, table, y, dy, lse, dqkv, dtable, **geo)
    check_backward("window attention", forward, {"qkv": dqkv, "table": dtable}, {"qkv": qkv, "table": table},
                   dy)


def test_a_window_covering_the_map_is_plain_attention_plus_the_bias(rng):
    """With a zero table and the window the whole map, window attention is kernels.attention's."""
    qkv, _, dy = _args(rng, 2, 4, 2, (2, 3), (2, 3))
    table = np.zeros(_table_shape((2, 3), 2), np.float32)
    y, lse, dqkv, dtable = _ref(qkv, table, dy, 2, (2, 3), (0, 0))
    y2, lse2, dqkv2 = np.empty_like(y), np.empty_like(lse), np.empty_like(dqkv)
    A.attention_forward_ref(qkv, y2, lse2, heads=2)
    A.attention_backward_ref(qkv, y2, dy, lse2, dqkv2, heads=2)
    for got, want in ((y, y2), (lse, lse2), (dqkv, dqkv2)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _torchvision():
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed")
    from snlite.torch_import import import_torchvision

    import_torchvision()
    from torchvision.models import swin_transformer as sw
    return torch, sw


@pytest.mark.parametrize("n,c,heads,hw,window,shift,torch_shift", [
    (1, 4, 2, (4, 4), (2, 2), (1, 1), (1, 1)), (2, 2, 1, (4, 4), (2, 2), (0, 0), (0, 0)),
    (1, 4, 2, (2, 4), (2, 2), (0, 1), (1, 1)), (1, 6, 3, (2, 3), (2, 3), (0, 0), (1, 1)),
    (1, 2, 2, (4, 6), (2, 3), (1, 2), (1, 2)), (1, 2, 1, (4, 4), (2, 2), (0, 1), (0, 1))])
def test_window_attention_computes_what_torchvision_computes(rng, n, c, heads, hw, window, shift,
                                                             torch_shift):
    """torchvision's shifted_window_attention in float64 on x (N, H, W, C) with qkv_weight W, no biases and
    the identity as proj_weight, the bias from _get_relative_position_bias; torchvision zeroes the shift
    of a side the window covers (torch_shift), snlite's caller passes it zeroed (shift). Our y and, from
    our dqkv, dx = dqkv W and dW = dqkv^T x against autograd's, and dtable against the table's grad."""
    torch, sw = _torchvision()
    x, wq = rng.standard_normal((n, *hw, c)), rng.standard_normal((3 * c, c))
    table, dy = rng.standard_normal(_table_shape(window, heads)), rng.standard_normal((n, c, *hw))
    tx, tw, ttable = (torch.tensor(a, requires_grad=True) for a in (x, wq, table))
    index = sw.ShiftedWindowAttention(c, list(window), list(torch_shift), heads).relative_position_index
    bias = sw._get_relative_position_bias(ttable, index, list(window))
    out = sw.shifted_window_attention(tx, tw, torch.eye(c, dtype=torch.float64), bias, list(window), heads,
                                      list(torch_shift), training=False)
    out.backward(torch.from_numpy(dy.transpose(0, 2, 3, 1)))
    want = (out.detach().numpy().transpose(0, 3, 1, 2), tx.grad.numpy(), tw.grad.numpy(), ttable.grad.numpy())
    qkv = (x @ wq.T).transpose(0, 3, 1, 2)  # (N, 3C, H, W)
    for source, (y, _, dqkv, dtable) in (
            ("reference", _ref(qkv, table, dy, heads, window, shift)),
            ("kernel", _run(*(a.astype(np.float32) for a in (qkv, table, dy)), heads, window, shift))):
        g = dqkv.astype(np.float64).transpose(0, 2, 3, 1)  # (N, H, W, 3C)
        got = (y, g @ wq, np.einsum("nhwo,nhwc->oc", g, x), dtable)
        for name, a, b in zip(("y", "dx", "dW", "dtable"), got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"{source} {name}")


def test_a_nan_stays_in_its_window_and_head(rng):
    """A NaN query spoils its own row; a NaN key spoils every query of its shifted window (pixel (0, 0) of
    a 4x4 map rolled by 1 shares its 2x2 window with (0, 3), (3, 0) and (3, 3)), in its head only."""
    qkv, table, dy = _args(rng, 2, 4, 2, (4, 4), (2, 2))
    qkv[1, 2, 1, 2] = np.nan  # image 1, q channel 2: head 1, pixel (1, 2)
    y, lse, _, _ = _run(qkv, table, dy, 2, (2, 2), (1, 1))
    assert np.isnan(y[1, 2:, 1, 2]).all() and np.isnan(y).sum() == 2
    assert np.isnan(lse[1, 1, 1, 2]) and np.isnan(lse).sum() == 1
    qkv, table, dy = _args(rng, 1, 4, 2, (4, 4), (2, 2))
    qkv[0, 4, 0, 0] = np.nan  # k channel 0: head 0, pixel (0, 0)
    y, lse, _, _ = _run(qkv, table, dy, 2, (2, 2), (1, 1))
    spoiled = np.zeros((4, 4), bool)
    spoiled[np.ix_([0, 3], [0, 3])] = True
    assert np.array_equal(np.isnan(lse[0, 0]), spoiled) and not np.isnan(lse[0, 1]).any()
    assert np.array_equal(np.isnan(y[0, :2]), np.broadcast_to(spoiled, (2, 4, 4)))
    assert not np.isnan(y[0, 2:]).any()


def _refused(pattern):
    return pytest.raises(ValueError, match=pattern)


def test_launchers_name_what_is_wrong():
    def d(*shape):
        return cuda.to_device(np.zeros(shape, np.float32))

    fwd, bwd = WA.window_attention_forward, WA.window_attention_backward
    qkv, table, y, lse = d(2, 12, 4, 4), d(9, 2), d(2, 4, 4, 4), d(2, 2, 4, 4)
    geo = {"heads": 2, "window": (2, 2), "shift": (1, 1)}
    with _refused(r"window_attention_forward y: expected shape \(2, 4, 4, 4\), got \(2, 4, 4, 2\)"):
        fwd(qkv, table, d(2, 4, 4, 2), lse, **geo)
    with _refused(r"window_attention_forward: heads=3 does not divide D=4 \(qkv has 12 channels\)"):
        fwd(qkv, d(9, 3), y, d(2, 3, 4, 4), heads=3, window=(2, 2), shift=(1, 1))
    with _refused(r"window_attention_forward table: expected shape \(9, 2\), got \(9, 1\)"):
        fwd(qkv, d(9, 1), y, lse, **geo)
    with _refused(r"window_attention_forward window: \(3, 2\) must be positive and divide the map's "
                  r"\(H, W\) = \(4, 4\) \(torchvision pads"):
        fwd(qkv, d(15, 2), y, lse, heads=2, window=(3, 2), shift=(1, 1))
    with _refused(r"window_attention_forward window: expected a pair of ints \(h, w\), got 2"):
        fwd(qkv, table, y, lse, heads=2, window=2, shift=(1, 1))
    with _refused(r"window_attention_forward shift: expected a pair of ints \(h, w\), got \(1.0, 1\)"):
        fwd(qkv, table, y, lse, heads=2, window=(2, 2), shift=(1.0, 1))
    with _refused(r"window_attention_forward shift: expected 0 <= shift < window on each side, got shift "
                  r"\(2, 1\) for window \(2, 2\)"):
        fwd(qkv, table, y, lse, heads=2, window=(2, 2), shift=(2, 1))
    with _refused(r"window_attention_forward shift: \(1, 1\) shifts W, which the window covers whole \(4 of "
                  r"4\): torchvision sets that shift to 0"):
        fwd(qkv, d(21, 2), y, lse, heads=2, window=(2, 4), shift=(1, 1))
    with _refused(r"window_attention_forward lse: expected 64 elements \(N\*heads\*H\*W, laid out as "
                  r"\(N, heads, H, W\) = \(2, 2, 4, 4\)\), got shape \(2, 2, 4\)"):
        fwd(qkv, table, y, d(2, 2, 4), **geo)
    with _refused(r"window_attention_forward qkv: expected an \(N, C, H, W\) array"):
        fwd(d(2, 12, 16), table, y, lse, **geo)
    with _refused(r"window_attention_backward dqkv: expected shape \(2, 12, 4, 4\), got \(2, 4, 4, 4\)"):
        bwd(qkv, table, y, y, lse, d(2, 4, 4, 4), d(9, 2), **geo)
    with _refused(r"window_attention_backward dtable: expected shape \(9, 2\), got \(2, 9\)"):
        bwd(qkv, table, y, y, lse, d(2, 12, 4, 4), d(2, 9), **geo)
    with _refused(r"window_attention_backward dy: expected dtype float32, got float64"):
        bwd(qkv, table, y, cuda.to_device(np.zeros((2, 4, 4, 4))), lse, d(2, 12, 4, 4), d(9, 2), **geo)
    with _refused(r"window_attention_backward table: expected a C-contiguous array"):
        bwd(qkv, d(9, 4)[:, :2], y, y, lse, d(2, 12, 4, 4), d(9, 2), **geo)
    with _refused(r"unknown kernel version 'v2'"):
        fwd(qkv, table, y, lse, **geo, version="v2")


@pytest.mark.gpu
def test_real_gpu_window_attention_at_swin_t_stage_1():
    """On a real GPU (compiled PTX, its exp and log): Swin-T's first stage, 3 heads of 32 over a 56x56
    map in 7x7 windows shifted by 3, two images: the kernels agree with the reference (dtable, sums of up
    to 6,272 terms, within 1e-3) and give the same bits twice."""
    rng = np.random.default_rng(0)
    qkv, table, dy = _args(rng, 2, 96, 3, (56, 56), (7, 7))
    first, second = (_run(qkv, table, dy, 3, (7, 7), (3, 3)) for _ in range(2))
    for got, want, again, name in zip(first, _ref(qkv, table, dy, 3, (7, 7), (3, 3)), second,
                                      ("y", "lse", "dqkv", "dtable")):
        tol = {"rtol": 1e-3, "atol": 1e-3} if name == "dtable" else GRAD_TOL
        np.testing.assert_allclose(got, want, **tol, err_msg=name)
        assert np.array_equal(got, again), f"{name}: not the same bits on a second run"
