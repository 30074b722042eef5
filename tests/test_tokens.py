"""A vision transformer's token plumbing (kernels.tokens): the class token, the position embedding and
the token the head reads. Each kernel on the simulator against its reference, bit for bit the same on a
second run; the references against float64 formulas written on PyTorch's (N, T, D) layout, against
central differences, and against PyTorch (torch.cat of the expanded token, +, indexing, and autograd);
and the launchers refuse a wrong shape or index by name. (Every example of ``python -m kernels.tokens``
runs in tests/test_kernels.py.)"""
import numpy as np
import pytest
from numba import cuda

from gradcheck import check_backward, rand64
from kernels import tokens as K

SHAPES = [(2, 3, 5, 1), (2, 4, 3, 2), (1, 2, 1, 1)]


def _r(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _device(*arrays):
    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def _nan(*shape):
    return np.full(shape, np.nan, np.float32)


def _ntd(a):
    """(N, D, H, W) as PyTorch's (N, T, D), T = H*W."""
    n, d = a.shape[:2]
    return a.reshape(n, d, -1).transpose(0, 2, 1)


def _inputs(rng, shape):
    """x, the class token (1, 1, D), pos (1, T, D) and the upstream gradients of the three ops."""
    n, d, h, w = shape
    t = h * w
    return {"x": _r(rng, *shape), "token": _r(rng, 1, 1, d), "pos": _r(rng, 1, t, d),
            "dy_cls": _r(rng, n, d, t + 1, 1), "dy_pos": _r(rng, *shape), "dy_sel": _r(rng, n, d)}


def _run(a, index, block=K.BLOCK):
    """Every launcher on the simulator: (y_cls, dx_cls, dtoken, y_pos, dpos, y_sel, dx_sel)."""
    n, d, h, w = a["x"].shape
    names = ("x", "token", "pos", "dy_cls", "dy_pos", "dy_sel")
    x, token, pos, dyc, dyp, dys = _device(*(a[k] for k in names))
    out = _device(_nan(n, d, h * w + 1, 1), _nan(n, d, h, w), _nan(1, 1, d), _nan(n, d, h, w),
                  _nan(1, h * w, d), _nan(n, d), _nan(n, d, h, w))
    K.class_token_forward(x, token, out[0], block=block)
    K.class_token_backward(dyc, out[1], out[2], block=block)
    K.position_embedding_forward(x, pos, out[3], block=block)
    K.position_embedding_backward(dyp, out[4], block=block)
    K.token_select_forward(x, out[5], index=index, block=block)
    K.token_select_backward(dys, out[6], index=index, block=block)
    return [o.copy_to_host() for o in out]


def _ref(a, index):
    n, d, h, w = a["x"].shape
    x = a["x"]
    out = [np.empty((n, d, h * w + 1, 1), x.dtype), np.empty_like(x), np.empty_like(a["token"]),
           np.empty_like(x), np.empty_like(a["pos"]), np.empty((n, d), x.dtype), np.empty_like(x)]
    K.class_token_forward_ref(a["x"], a["token"], out[0])
    K.class_token_backward_ref(a["dy_cls"], out[1], out[2])
    K.position_embedding_forward_ref(a["x"], a["pos"], out[3])
    K.position_embedding_backward_ref(a["dy_pos"], out[4])
    K.token_select_forward_ref(a["x"], out[5], index=index)
    K.token_select_backward_ref(a["dy_sel"], out[6], index=index)
    return out


NAMES = ("class y", "class dx", "dtoken", "pos y", "dpos", "select y", "select dx")


@pytest.mark.parametrize("shape,index", [(SHAPES[0], 0), (SHAPES[1], -1), (SHAPES[1], 3), (SHAPES[2], 0)])
def test_kernels_match_the_reference(rng, shape, index):
    a = _inputs(rng, shape)
    for name, want, got in zip(NAMES, _ref(a, index), _run(a, index, block=4)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{shape}: {name}")


def test_kernels_are_bit_reproducible(rng):
    a = _inputs(rng, (2, 3, 2, 2))
    for first, second in zip(_run(a, 1), _run(a, 1)):
        assert first.tobytes() == second.tobytes()


@pytest.mark.parametrize("shape,index", [(SHAPES[0], 0), (SHAPES[1], -2), (SHAPES[2], -1)])
def test_references_compute_the_float64_formulas(rng, shape, index):
    """Each op written on the (N, T, D) layout in float64: concatenate, add, take a token."""
    a = _inputs(rng, shape)
    x, dyc, dyp = (_ntd(a[k].astype(np.float64)) for k in ("x", "dy_cls", "dy_pos"))
    n, t, d = x.shape
    i = index % t
    sel_dx = np.zeros((n, t, d))
    sel_dx[:, i] = a["dy_sel"]
    want = [np.concatenate([np.broadcast_to(a["token"].astype(np.float64), (n, 1, d)), x], axis=1),
            dyc[:, 1:], dyc[:, :1].sum(axis=0, keepdims=True), x + a["pos"].astype(np.float64),
            dyp.sum(axis=0, keepdims=True), x[:, i], sel_dx]
    got = _ref(a, index)
    for name, g, w in zip(NAMES, got, want):
        g = g.reshape(w.shape) if name in ("dtoken", "dpos", "select y") else _ntd(g)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{shape}: {name}")


def test_backward_references_are_the_gradients_of_forward(rng):
    n, d, h, w = 2, 3, 2, 2
    x, token, pos = rand64(rng, n, d, h, w), rand64(rng, 1, 1, d), rand64(rng, 1, h * w, d)
    dyc, dyp, dys = rand64(rng, n, d, h * w + 1, 1), rand64(rng, n, d, h, w), rand64(rng, n, d)

    def run(fn, shape, *args, **kwargs):
        def forward():
            y = np.empty(shape)
            fn(*args, y, **kwargs)
            return y
        return forward

    dx, dtoken = np.empty_like(x), np.empty_like(token)
    K.class_token_backward_ref(dyc, dx, dtoken)
    check_backward("class_token", run(K.class_token_forward_ref, dyc.shape, x, token),
                   {"x": dx, "token": dtoken}, {"x": x, "token": token}, dyc)
    dpos = np.empty_like(pos)
    K.position_embedding_backward_ref(dyp, dpos)
    check_backward("position_embedding", run(K.position_embedding_forward_ref, x.shape, x, pos),
                   {"x": dyp, "pos": dpos}, {"x": x, "pos": pos}, dyp)
    dx = np.empty_like(x)
    K.token_select_backward_ref(dys, dx, index=-3)
    check_backward("token_select", run(K.token_select_forward_ref, dys.shape, x, index=-3), {"x": dx},
                   {"x": x}, dys)


@pytest.mark.parametrize("shape,index", [(SHAPES[0], 0), (SHAPES[1], -1)])
def test_tokens_compute_what_pytorch_computes(rng, shape, index):
    """torchvision's VisionTransformer: ``torch.cat([class_token.expand(n, -1, -1), x], dim=1)``,
    ``x + pos_embedding`` and ``x[:, index]`` on (N, T, D), and autograd's gradients."""
    torch = pytest.importorskip("torch")
    a = _inputs(rng, shape)
    n = shape[0]
    tx, ttok, tpos = (torch.tensor(a[k], requires_grad=True) for k in ("x", "token", "pos"))
    seq = tx.flatten(2).transpose(1, 2)  # (N, T, D)
    cls = torch.cat([ttok.expand(n, -1, -1), seq], dim=1)
    cls.backward(torch.from_numpy(_ntd(a["dy_cls"])))
    want = [cls.detach().numpy(), tx.grad.numpy().copy(), ttok.grad.numpy()]
    tx.grad = None
    pe = seq + tpos
    pe.backward(torch.from_numpy(_ntd(a["dy_pos"])))
    want += [pe.detach().numpy(), tpos.grad.numpy()]
    np.testing.assert_array_equal(tx.grad.numpy(), a["dy_pos"])  # dx = dy: no kernel
    tx.grad = None
    sel = seq[:, index]
    sel.backward(torch.from_numpy(a["dy_sel"]))
    want += [sel.detach().numpy(), tx.grad.numpy()]
    for source, got in (("reference", _ref(a, index)), ("kernel", _run(a, index))):
        for name, g, w in zip(NAMES, got, want):
            g = _ntd(g) if name in ("class y", "pos y") else g.reshape(w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{source} {name}")


def test_position_embedding_runs_in_place(rng):
    x, pos = _r(rng, 2, 3, 2, 2), _r(rng, 1, 4, 3)
    want = np.empty_like(x)
    K.position_embedding_forward_ref(x, pos, want)
    x_, pos_ = _device(x, pos)
    K.position_embedding_forward(x_, pos_, x_)
    np.testing.assert_array_equal(x_.copy_to_host(), want)


def _refused(pattern):
    return pytest.raises(ValueError, match=pattern)


def test_launchers_name_what_is_wrong():
    def d(*shape):
        return cuda.to_device(np.zeros(shape, np.float32))

    x = d(2, 3, 2, 2)
    with _refused(r"class_token_forward y: expected shape \(2, 3, 5, 1\), got \(2, 3, 4, 1\)"):
        K.class_token_forward(x, d(3), d(2, 3, 4, 1))
    with _refused(r"class_token_forward token: expected 3 elements \(D, one per channel\), "
                  r"got shape \(1, 1, 4\)"):
        K.class_token_forward(x, d(1, 1, 4), d(2, 3, 5, 1))
    with _refused(r"class_token_backward dy: expected shape \(2, 3, 5, 1\), got \(2, 3, 4, 1\)"):
        K.class_token_backward(d(2, 3, 4, 1), x, d(3))
    with _refused(r"class_token_backward dtoken: expected 3 elements"):
        K.class_token_backward(d(2, 3, 5, 1), x, d(2))
    with _refused(r"position_embedding_forward pos: expected 12 elements \(T\*D, laid out as "
                  r"\(1, T, D\) = \(1, 4, 3\)\), got shape \(1, 5, 3\)"):
        K.position_embedding_forward(x, d(1, 5, 3), x)
    with _refused(r"position_embedding_forward y: expected shape \(2, 3, 2, 2\)"):
        K.position_embedding_forward(x, d(12), d(2, 3, 4, 1))
    with _refused(r"position_embedding_backward dpos: expected 12 elements"):
        K.position_embedding_backward(x, d(13))
    with _refused(r"position_embedding_backward dy: expected an \(N, C, H, W\) array"):
        K.position_embedding_backward(d(2, 3, 4), d(12))
    with _refused(r"token_select_forward y: expected shape \(2, 3\), got \(6,\)"):
        K.token_select_forward(x, d(6), index=0)
    with _refused(r"token_select_forward: index 4 is out of range for T=4 tokens \(H\*W of "
                  r"\(2, 3, 2, 2\)\)"):
        K.token_select_forward(x, d(2, 3), index=4)
    with _refused(r"token_select_backward: index -5 is out of range for T=4"):
        K.token_select_backward(d(2, 3), x, index=-5)
    with _refused(r"token_select_backward: index must be an int, got 1.0"):
        K.token_select_backward(d(2, 3), x, index=1.0)
    with _refused(r"token_select_backward dy: expected shape \(2, 3\), got \(2, 3, 1\)"):
        K.token_select_backward(d(2, 3, 1), x, index=0)
    with _refused(r"token_select_forward x: expected dtype float32, got float64"):
        K.token_select_forward(cuda.to_device(np.zeros((2, 3, 2, 2))), d(2, 3), index=0)
    with _refused(r"unknown kernel version 'v2'"):
        K.class_token_forward(x, d(3), d(2, 3, 5, 1), version="v2")
