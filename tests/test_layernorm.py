"""Layer normalization over channels and the layer scale (kernels.layernorm), ConvNeXt's: each kernel on
the simulator against its reference, bit for bit the same on a second run; the references against an
independent float64 formula (normalize over the last axis of the NHWC permutation), against central
differences, and against PyTorch; and the launchers refuse a wrong shape by name. (Every example of
``python -m kernels.layernorm`` runs in tests/test_kernels.py.)"""
import numpy as np
import pytest
from numba import cuda

from gradcheck import check_backward, rand64
from kernels import layernorm as L

EPS = 1e-5
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _r(rng, *shape, loc=0.0):
    return (rng.standard_normal(shape) + loc).astype(np.float32)


def _ln_forward64(x, w, b, eps):
    """y, mean (N, H, W) and rstd of layer norm, in float64, computed on the NHWC permutation."""
    p = x.astype(np.float64).transpose(0, 2, 3, 1)  # (N, H, W, C)
    mean = p.mean(axis=-1, keepdims=True)
    var = ((p - mean) ** 2).mean(axis=-1, keepdims=True)  # biased
    rstd = 1.0 / np.sqrt(var + eps)
    y = (p - mean) * rstd * w.astype(np.float64) + b.astype(np.float64)
    return y.transpose(0, 3, 1, 2), mean[..., 0], rstd[..., 0]


def _ln_backward64(x, dy, w, eps):
    """dx, dweight, dbias of layer norm in float64, on the NHWC permutation, from the textbook formula."""
    p, g = x.astype(np.float64).transpose(0, 2, 3, 1), dy.astype(np.float64).transpose(0, 2, 3, 1)
    c = p.shape[-1]
    mean = p.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((p - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (p - mean) * rstd
    gw = g * w.astype(np.float64)
    dx = rstd / c * (c * gw - gw.sum(-1, keepdims=True) - xhat * (gw * xhat).sum(-1, keepdims=True))
    return dx.transpose(0, 3, 1, 2), (g * xhat).sum(axis=(0, 1, 2)), g.sum(axis=(0, 1, 2))


def _ln_args(rng, shape, loc=0.0):
    n, c, h, w = shape
    return _r(rng, *shape, loc=loc), _r(rng, c), _r(rng, c), _r(rng, *shape)


def _device(*arrays):
    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def _run_ln(x, w, b, dy, eps=EPS, block=L.BLOCK):
    """The launchers on the simulator: (y, mean, rstd, dx, dweight, dbias) as NumPy arrays."""
    n, c, h, wd = x.shape
    y, mean, rstd, dx, dw, db = _device(np.full_like(x, np.nan), np.full((n, h, wd), np.nan, np.float32),
                                        np.full((n, h, wd), np.nan, np.float32), np.full_like(x, np.nan),
                                        np.full(c, np.nan, np.float32), np.full(c, np.nan, np.float32))
    x_, w_, b_, dy_ = _device(x, w, b, dy)
    L.layer_norm_forward(x_, w_, b_, y, mean, rstd, eps=eps, block=block)
    L.layer_norm_backward(x_, dy_, w_, mean, rstd, dx, dw, db, block=block)
    return [a.copy_to_host() for a in (y, mean, rstd, dx, dw, db)]


def _run_ls(x, gamma, dy, block=L.BLOCK):
    """layer_scale forward and backward on the simulator: (y, dx, dgamma)."""
    x_, g_, dy_ = _device(x, gamma, dy)
    y, dx, dg = _device(np.full_like(x, np.nan), np.full_like(x, np.nan), np.full_like(gamma, np.nan))
    L.layer_scale_forward(x_, g_, y, block=block)
    L.layer_scale_backward(x_, g_, dy_, dx, dg, block=block)
    return [a.copy_to_host() for a in (y, dx, dg)]


def _ref_ln(x, w, b, dy, eps=EPS):
    n, c, h, wd = x.shape
    y, mean, rstd = np.empty_like(x), np.empty((n, h, wd), x.dtype), np.empty((n, h, wd), x.dtype)
    dx, dw, db = np.empty_like(x), np.empty(c, x.dtype), np.empty(c, x.dtype)
    L.layer_norm_forward_ref(x, w, b, y, mean, rstd, eps=eps)
    L.layer_norm_backward_ref(x, dy, w, mean, rstd, dx, dw, db)
    return y, mean, rstd, dx, dw, db


@pytest.mark.parametrize("shape,loc", [((2, 3, 2, 3), 0.0), ((2, 5, 3, 2), 3.0), ((2, 4, 2, 2), 0.0),
                                       ((2, 1, 3, 2), 0.0)])
def test_layer_norm_kernels_match_the_reference(rng, shape, loc):
    x, w, b, dy = _ln_args(rng, shape, loc)
    names = ("y", "save_mean", "save_rstd", "dx", "dweight", "dbias")
    for name, want, got in zip(names, _ref_ln(x, w, b, dy), _run_ln(x, w, b, dy, block=4)):
        np.testing.assert_allclose(got, want, **TOL, err_msg=f"{shape}: {name}")


def test_layer_scale_kernels_match_the_reference(rng):
    x, dy = _r(rng, 2, 3, 2, 3), _r(rng, 2, 3, 2, 3)
    gamma = _r(rng, 3, 1, 1)
    y, dx, dg = np.empty_like(x), np.empty_like(x), np.empty_like(gamma)
    L.layer_scale_forward_ref(x, gamma, y)
    L.layer_scale_backward_ref(x, gamma, dy, dx, dg)
    for name, want, got in zip(("y", "dx", "dgamma"), (y, dx, dg), _run_ls(x, gamma, dy, block=4)):
        np.testing.assert_allclose(got, want, **TOL, err_msg=name)


def test_kernels_are_bit_reproducible(rng):
    x, w, b, dy = _ln_args(rng, (2, 4, 3, 2), loc=2.0)
    for first, second in zip(_run_ln(x, w, b, dy), _run_ln(x, w, b, dy)):
        assert first.tobytes() == second.tobytes()
    gamma = _r(rng, 4, 1, 1)
    for first, second in zip(_run_ls(x, gamma, dy), _run_ls(x, gamma, dy)):
        assert first.tobytes() == second.tobytes()


@pytest.mark.parametrize("shape,loc,eps", [((2, 4, 3, 2), 0.0, 1e-5), ((3, 5, 2, 3), 100.0, 1e-6),
                                           ((2, 1, 2, 2), 0.0, 1e-5), ((1, 7, 1, 1), -2.0, 1e-3)])
def test_references_compute_the_float64_formula(rng, shape, loc, eps):
    x, w, b, dy = _ln_args(rng, shape, loc)
    y, mean, rstd, dx, dw, db = _ref_ln(x, w, b, dy, eps)
    y64, mean64, rstd64 = _ln_forward64(x, w, b, eps)
    dx64, dw64, db64 = _ln_backward64(x, dy, w, eps)
    # the mean of x near 100 keeps float32's error of 100 (8e-6): relative to the spread, not to 1
    atol = 1e-5 * max(1.0, abs(loc))
    np.testing.assert_allclose(mean, mean64, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(rstd, rstd64, rtol=1e-4)
    np.testing.assert_allclose(y, y64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, dx64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, dw64, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, db64, rtol=1e-5, atol=1e-5)
    gamma = _r(rng, shape[1], 1, 1)
    ys, dxs, dg = np.empty_like(x), np.empty_like(x), np.empty_like(gamma)
    L.layer_scale_forward_ref(x, gamma, ys)
    L.layer_scale_backward_ref(x, gamma, dy, dxs, dg)
    x64, dy64, g64 = x.astype(np.float64), dy.astype(np.float64), gamma.astype(np.float64)
    np.testing.assert_allclose(ys, x64 * g64, rtol=1e-6)
    np.testing.assert_allclose(dxs, dy64 * g64, rtol=1e-6)
    np.testing.assert_allclose(dg, (dy64 * x64).sum(axis=(0, 2, 3)).reshape(dg.shape), rtol=1e-5, atol=1e-4)


def test_layer_norm_backward_reference_is_the_gradient_of_forward(rng):
    x, w, b, dy = rand64(rng, 2, 3, 2, 2), rand64(rng, 3), rand64(rng, 3), rand64(rng, 2, 3, 2, 2)
    stats = (np.empty((2, 2, 2)), np.empty((2, 2, 2)))

    def forward():
        y = np.empty_like(x)
        L.layer_norm_forward_ref(x, w, b, y, *stats, eps=1e-3)
        return y

    forward()
    dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(b)
    L.layer_norm_backward_ref(x, dy, w, *stats, dx, dw, db)
    check_backward("layer_norm", forward, {"x": dx, "weight": dw, "bias": db},
                   {"x": x, "weight": w, "bias": b}, dy)


def test_layer_scale_backward_reference_is_the_gradient_of_forward(rng):
    x, gamma, dy = rand64(rng, 2, 3, 2, 2), rand64(rng, 3, 1, 1), rand64(rng, 2, 3, 2, 2)

    def forward():
        y = np.empty_like(x)
        L.layer_scale_forward_ref(x, gamma, y)
        return y

    dx, dg = np.empty_like(x), np.empty_like(gamma)
    L.layer_scale_backward_ref(x, gamma, dy, dx, dg)
    check_backward("layer_scale", forward, {"x": dx, "gamma": dg}, {"x": x, "gamma": gamma}, dy)


@pytest.mark.parametrize("c,eps,atol", [(5, 1e-6, 1e-5), (1, 1e-5, 2e-4)])
def test_layer_norm_computes_what_pytorch_computes(rng, c, eps, atol):
    """ConvNeXt's LayerNorm2d: F.layer_norm on the NHWC permutation, and autograd's gradients. With one
    channel dx is 0 exactly; PyTorch's arrangement of the formula leaves rounding times rstd = 316 there."""
    torch = pytest.importorskip("torch")
    x, w, b, dy = _ln_args(rng, (2, c, 3, 2), loc=1.0)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.layer_norm(tx.permute(0, 2, 3, 1), (c,), tw, tb, eps).permute(0, 3, 1, 2)
    ty.backward(torch.from_numpy(dy))
    want = (ty.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy())
    for source, (y, _, _, dx, dw, db) in (("reference", _ref_ln(x, w, b, dy, eps)),
                                         ("kernel", _run_ln(x, w, b, dy, eps))):
        for name, got, ref in zip(("y", "dx", "dweight", "dbias"), (y, dx, dw, db), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=atol, err_msg=f"{source} {name}, C={c}")


def test_layer_scale_computes_what_pytorch_computes(rng):
    """torchvision's CNBlock: ``layer_scale * x`` with a parameter of shape (C, 1, 1)."""
    torch = pytest.importorskip("torch")
    x, dy, gamma = _r(rng, 2, 3, 2, 3), _r(rng, 2, 3, 2, 3), _r(rng, 3, 1, 1)
    tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(gamma, requires_grad=True)
    ty = tg * tx
    ty.backward(torch.from_numpy(dy))
    want = (ty.detach().numpy(), tx.grad.numpy(), tg.grad.numpy())
    y, dx, dg = np.empty_like(x), np.empty_like(x), np.empty_like(gamma)
    L.layer_scale_forward_ref(x, gamma, y)
    L.layer_scale_backward_ref(x, gamma, dy, dx, dg)
    for source, got in (("reference", (y, dx, dg)), ("kernel", _run_ls(x, gamma, dy))):
        for name, a, ref in zip(("y", "dx", "dgamma"), got, want):
            np.testing.assert_allclose(a, ref, **TOL, err_msg=f"{source} {name}")


def test_a_nan_stays_in_its_pixel_and_c1_gives_the_bias(rng):
    x, w, b, dy = _ln_args(rng, (2, 3, 2, 2))
    x[1, 2, 0, 1] = np.nan
    y, mean, rstd, dx, dw, db = _run_ln(x, w, b, dy)
    bad = np.isnan(y)
    assert bad[1, :, 0, 1].all() and bad.sum() == 3 and np.isnan(mean[1, 0, 1]) and np.isnan(dx).sum() == 3
    assert np.isnan(dw).all() and not np.isnan(db).any()
    x, w, b, dy = _ln_args(rng, (2, 1, 2, 2))  # one channel: variance 0, y = bias, no gradient to x
    y, mean, rstd, dx, dw, db = _run_ln(x, w, b, dy)
    np.testing.assert_array_equal(y, np.broadcast_to(b.reshape(1, 1, 1, 1), y.shape))
    np.testing.assert_allclose(rstd, 1 / np.sqrt(np.float32(EPS)), rtol=1e-6)
    assert not dx.any() and not dw.any()


def test_launchers_name_what_is_wrong():
    def d(*shape):
        return cuda.to_device(np.zeros(shape, np.float32))

    x, c3, stats = d(2, 3, 4, 5), d(3), d(2, 4, 5)
    with pytest.raises(ValueError, match=r"layer_norm_forward save_mean: expected 40 elements \(N\*H\*W, "
                                         r"laid out as \(N, H, W\) = \(2, 4, 5\)\), got shape \(2, 4, 4\)"):
        L.layer_norm_forward(x, c3, c3, x, d(2, 4, 4), stats, eps=EPS)
    with pytest.raises(ValueError, match=r"layer_norm_forward weight: expected shape \(3,\), got \(4,\)"):
        L.layer_norm_forward(x, d(4), c3, x, stats, stats, eps=EPS)
    with pytest.raises(ValueError, match=r"layer_norm_forward x: expected an \(N, C, H, W\) array, got shape "
                                         r"\(6, 20\)"):
        L.layer_norm_forward(d(6, 20), c3, c3, d(6, 20), stats, stats, eps=EPS)
    with pytest.raises(ValueError, match=r"layer_norm_forward: expected at least 1 channel"):
        L.layer_norm_forward(d(2, 0, 4, 5), d(0), d(0), d(2, 0, 4, 5), stats, stats, eps=EPS)
    with pytest.raises(ValueError, match=r"layer_norm_backward save_rstd: expected 40 elements"):
        L.layer_norm_backward(x, x, c3, stats, d(41), d(2, 3, 4, 5), c3, c3)
    with pytest.raises(ValueError, match=r"layer_norm_backward dbias: expected shape \(3,\), "
                                         r"got \(3, 1, 1\)"):
        L.layer_norm_backward(x, x, c3, stats, stats, d(2, 3, 4, 5), c3, d(3, 1, 1))
    with pytest.raises(ValueError, match=r"layer_norm_backward dx: expected shape \(2, 3, 4, 5\), "
                                         r"got \(2, 3, 4, 4\)"):
        L.layer_norm_backward(x, x, c3, stats, stats, d(2, 3, 4, 4), c3, c3)
    with pytest.raises(ValueError, match=r"layer_norm_forward y: expected a C-contiguous array"):
        L.layer_norm_forward(x, c3, c3, d(2, 3, 4, 6)[:, :, :, :5], stats, stats, eps=EPS)
    with pytest.raises(ValueError, match=r"layer_norm_forward x: expected dtype float32, got float64"):
        L.layer_norm_forward(cuda.to_device(np.zeros((2, 3, 4, 5))), c3, c3, x, stats, stats, eps=EPS)
    with pytest.raises(ValueError, match=r"layer_scale_forward gamma: expected 3 elements \(C, one per "
                                         r"channel\), got shape \(4, 1, 1\)"):
        L.layer_scale_forward(x, d(4, 1, 1), x)
    with pytest.raises(ValueError, match=r"layer_scale_backward dgamma: expected 3 elements"):
        L.layer_scale_backward(x, c3, x, d(2, 3, 4, 5), d(2))
    with pytest.raises(ValueError, match=r"unknown kernel version 'v2'"):
        L.layer_scale_forward(x, c3, x, version="v2")
