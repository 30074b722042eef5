"""A vision transformer's token plumbing, as torchvision's VisionTransformer has it: the class token
put in front of the patch tokens, the learned position embedding added to them, and the token the
classifier head reads. Forward and backward.

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.tokens

Layout: snlite keeps a token sequence, PyTorch's (N, T, D), as an NCHW array (N, D, T, 1); any
(N, D, H, W) is accepted as input and its H*W positions are the T tokens (a conv's patch grid is
read as it is, row by row, as ``x.flatten(2).transpose(1, 2)`` reads it in PyTorch).

- class_token_forward(x, token, y): y (N, D, T+1, 1), y[n, d, 0] = token[d] and
  y[n, d, 1 + t] = x[n, d, t]; token has D elements, any shape (PyTorch's parameter is (1, 1, D)).
  PyTorch: ``torch.cat([class_token.expand(n, -1, -1), x], dim=1)`` on (N, T, D).
  Backward: dx[n, d, t] = dy[n, d, 1 + t] and dtoken[d] = sum_n dy[n, d, 0].
- position_embedding_forward(x, pos, y): y[n, d, t] = x[n, d, t] + pos[t * D + d], pos having T*D
  elements laid out as PyTorch's (1, T, D) (any shape of that size is accepted); y may alias x.
  Backward: dpos[t * D + d] = sum_n dy[n, d, t] (dx = dy: the layer passes its gradient through, no
  kernel).
- token_select_forward(x, y, *, index): y (N, D), y[n, d] = x[n, d, index]: PyTorch's ``x[:, index]``
  on (N, T, D) (ViT's head reads ``x[:, 0]``, the class token). A negative index counts from the end,
  as in Python; one outside [-T, T) is a ValueError. Backward: dx[n, d, t] = dy[n, d] where
  t == index, else 0.

Canonical orders, float32 from 0.0, no atomics (every result is bit-reproducible): the copies and
the addition are one thread per output element; dtoken is one thread per channel d and dpos one per
(t, d), each adding over n ascending.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check, check_apart, check_version, contiguous, cuda_kernel, launch_1d
from kernels.layernorm import _elements, _nchw

BLOCK = 256  # threads per block
VERSIONS = ("v1",)


# ---------------------------------------------------------------- NumPy references
def _seq(a):
    """(N, D, H, W) as (N, D, T)."""
    n, d, h, w = a.shape
    return a.reshape(n, d, h * w)


def class_token_forward_ref(x, token, y):
    y3 = y.reshape(x.shape[0], x.shape[1], -1)
    y3[:, :, 0] = token.reshape(1, -1)
    y3[:, :, 1:] = _seq(x)


def class_token_backward_ref(dy, dx, dtoken):
    dy3 = dy.reshape(dx.shape[0], dx.shape[1], -1)
    dtoken[...] = np.sum(dy3[:, :, 0], axis=0, dtype=dy.dtype).reshape(dtoken.shape)
    dx[...] = dy3[:, :, 1:].reshape(dx.shape)


def position_embedding_forward_ref(x, pos, y):
    """y may alias x."""
    n, d, h, w = x.shape
    y[...] = x + pos.reshape(h * w, d).T.reshape(1, d, h, w)


def position_embedding_backward_ref(dy, dpos):
    dpos[...] = np.sum(_seq(dy), axis=0, dtype=dy.dtype).T.reshape(dpos.shape)


def token_select_forward_ref(x, y, *, index):
    y[...] = _seq(x)[:, :, token_index("token_select_forward", index, x)]


def token_select_backward_ref(dy, dx, *, index):
    i = token_index("token_select_backward", index, dx)
    dx[...] = 0
    _seq(dx)[:, :, i] = dy


# ---------------------------------------------------------------- kernels
_F3 = "float32[:, :, ::1]"  # an (N, D, H, W) array as (N, D, T)
_F2 = "float32[:, ::1]"
_F1 = "float32[::1]"


@cuda_kernel(f"void({_F3}, {_F1}, {_F3})")
def _class_token_forward_v1(x, token, y):
    # One thread per element of y (N, D, T+1): the token at t = 0, x shifted by one after it.
    i = cuda.grid(1)
    n_, d_, s_ = y.shape
    if i < n_ * d_ * s_:
        b, d, s = i // (d_ * s_), (i // s_) % d_, i % s_
        if s == 0:
            y[b, d, s] = token[d]
        else:
            y[b, d, s] = x[b, d, s - 1]


@cuda_kernel(f"void({_F3}, {_F3})")
def _class_token_backward_dx_v1(dy, dx):
    # One thread per element of dx (N, D, T): the gradient of the patch tokens, dy shifted back by one.
    i = cuda.grid(1)
    n_, d_, t_ = dx.shape
    if i < n_ * d_ * t_:
        b, d, t = i // (d_ * t_), (i // t_) % d_, i % t_
        dx[b, d, t] = dy[b, d, t + 1]


@cuda_kernel(f"void({_F3}, {_F1})")
def _class_token_backward_dtoken_v1(dy, dtoken):
    # One thread per channel d: dtoken[d] = sum of dy[n, d, 0] over n ascending.
    d = cuda.grid(1)
    n_, d_, _ = dy.shape
    if d < d_:
        acc = float32(0.0)
        for b in range(n_):
            acc += dy[b, d, 0]
        dtoken[d] = acc


@cuda_kernel(f"void({_F3}, {_F1}, {_F3})")
def _position_embedding_forward_v1(x, pos, y):
    # One thread per element: y = x + pos[t * D + d] (reads its element of x before writing y).
    i = cuda.grid(1)
    n_, d_, t_ = x.shape
    if i < n_ * d_ * t_:
        b, d, t = i // (d_ * t_), (i // t_) % d_, i % t_
        y[b, d, t] = x[b, d, t] + pos[t * d_ + d]


@cuda_kernel(f"void({_F3}, {_F1})")
def _position_embedding_backward_v1(dy, dpos):
    # One thread per k = t * D + d, in dpos's memory order: the sum of dy[n, d, t] over n ascending.
    k = cuda.grid(1)
    n_, d_, t_ = dy.shape
    if k < d_ * t_:
        t, d = k // d_, k % d_
        acc = float32(0.0)
        for b in range(n_):
            acc += dy[b, d, t]
        dpos[k] = acc


@cuda_kernel(f"void({_F3}, {_F2}, int64)")
def _token_select_forward_v1(x, y, index):
    # One thread per element of y (N, D): the token at ``index``.
    i = cuda.grid(1)
    n_, d_, _ = x.shape
    if i < n_ * d_:
        b, d = i // d_, i % d_
        y[b, d] = x[b, d, index]


@cuda_kernel(f"void({_F2}, {_F3}, int64)")
def _token_select_backward_v1(dy, dx, index):
    # One thread per element of dx (N, D, T): dy at the selected token, 0 at the others.
    i = cuda.grid(1)
    n_, d_, t_ = dx.shape
    if i < n_ * d_ * t_:
        b, d, t = i // (d_ * t_), (i // t_) % d_, i % t_
        if t == index:
            dx[b, d, t] = dy[b, d]
        else:
            dx[b, d, t] = float32(0.0)


# ---------------------------------------------------------------- launchers
def token_index(op, index, x):
    """``index`` as a token position in [0, T) of ``x`` (N, D, H, W), T = H*W (negative: from the end);
    a ValueError naming ``op`` if it is not an int or is out of range."""
    t = x.shape[2] * x.shape[3]
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise ValueError(f"{op}: index must be an int, got {index!r}")
    if not -t <= index < t:
        raise ValueError(f"{op}: index {int(index)} is out of range for T={t} tokens (H*W of "
                         f"{tuple(x.shape)})")
    return int(index) % t


def _with_class_token(op, name, a, x):
    """Check ``a`` is float32 of exactly (N, D, T+1, 1) for ``x`` (N, D, H, W); return it as (N, D, T+1)."""
    n, d, h, w = x.shape
    check(f"{op} {name}", a, shape=(n, d, h * w + 1, 1))
    contiguous(f"{op} {name}", a)
    return a.reshape(n, d, h * w + 1)


def _pos(op, name, pos, x):
    n, d, h, w = x.shape
    return _elements(op, name, pos, h * w * d, f"T*D, laid out as (1, T, D) = {(1, h * w, d)}")


def _selected(op, name, a, x):
    """Check ``a`` is float32 of exactly (N, D) for ``x`` (N, D, H, W)."""
    check(f"{op} {name}", a, shape=x.shape[:2])
    contiguous(f"{op} {name}", a)
    return a


def class_token_forward(x, token, y, *, stream=0, version="v1", block=BLOCK):
    """y (N, D, T+1, 1): ``token`` (D elements, any shape) then the T tokens of ``x``."""
    op = "class_token_forward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    tok = _elements(op, "token", token, x.shape[1], "D, one per channel")
    y3 = _with_class_token(op, "y", y, x)
    launch_1d(_class_token_forward_v1, y3.size, block, stream, x3, tok, y3)


def class_token_backward(dy, dx, dtoken, *, stream=0, version="v1", block=BLOCK):
    """dx = dy without its first token; dtoken[d] = sum over n of dy[n, d, 0]. dy is (N, D, T+1, 1)
    for dx (N, D, H, W), T = H*W; dx must not alias dy."""
    op = "class_token_backward"
    check_version(version, VERSIONS)
    dx3 = _nchw(op, "dx", dx)
    dy3 = _with_class_token(op, "dy", dy, dx)
    dtok = _elements(op, "dtoken", dtoken, dx.shape[1], "D, one per channel")
    check_apart(op, ("dx", dx), ("dy", dy))
    launch_1d(_class_token_backward_dtoken_v1, dtok.size, block, stream, dy3, dtok)
    launch_1d(_class_token_backward_dx_v1, dx3.size, block, stream, dy3, dx3)


def position_embedding_forward(x, pos, y, *, stream=0, version="v1", block=BLOCK):
    """y = x + pos, pos (T*D elements) laid out as (1, T, D); ``y`` may be the same array as ``x``."""
    op = "position_embedding_forward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    y3 = _nchw(op, "y", y, shape=x.shape)
    launch_1d(_position_embedding_forward_v1, x3.size, block, stream, x3, _pos(op, "pos", pos, x), y3)


def position_embedding_backward(dy, dpos, *, stream=0, version="v1", block=BLOCK):
    """dpos[t * D + d] = sum over n of dy[n, d, t] (the input's gradient is dy itself)."""
    op = "position_embedding_backward"
    check_version(version, VERSIONS)
    dy3 = _nchw(op, "dy", dy)
    dp = _pos(op, "dpos", dpos, dy)
    launch_1d(_position_embedding_backward_v1, dp.size, block, stream, dy3, dp)


def token_select_forward(x, y, *, index, stream=0, version="v1", block=BLOCK):
    """y (N, D) = the token ``index`` of x (N, D, H, W)."""
    op = "token_select_forward"
    check_version(version, VERSIONS)
    x3 = _nchw(op, "x", x)
    i = token_index(op, index, x)
    y2 = _selected(op, "y", y, x)
    launch_1d(_token_select_forward_v1, y2.size, block, stream, x3, y2, i)


def token_select_backward(dy, dx, *, index, stream=0, version="v1", block=BLOCK):
    """dx (N, D, H, W): dy (N, D) at the token ``index``, 0 elsewhere."""
    op = "token_select_backward"
    check_version(version, VERSIONS)
    dx3 = _nchw(op, "dx", dx)
    i = token_index(op, index, dx)
    dy2 = _selected(op, "dy", dy, dx)
    launch_1d(_token_select_backward_v1, dx3.size, block, stream, dy2, dx3, i)


OPS = {name: Op(name, globals()[f"{name}_ref"], globals()[name], VERSIONS) for name in (
    "class_token_forward", "class_token_backward", "position_embedding_forward",
    "position_embedding_backward", "token_select_forward", "token_select_backward")}


def examples(rng):
    r, nan = example_arrays(rng)
    xs = r(2, 4, 3, 2)
    return [
        Example("class_token_forward", (r(2, 3, 5, 1), r(1, 1, 3), nan(2, 3, 6, 1)), (2,),
                launch={"block": 8}, label="T=5, token (1, 1, D)"),
        Example("class_token_forward", (xs, r(4), nan(2, 4, 7, 1)), (2,), label="H*W 3x2, token (D,)"),
        Example("class_token_backward", (r(2, 3, 6, 1), nan(2, 3, 5, 1), nan(1, 1, 3)), (1, 2),
                launch={"block": 8}, label="T=5"),
        Example("class_token_backward", (r(3, 4, 7, 1), nan(3, 4, 3, 2), nan(4)), (1, 2), label="H*W 3x2"),
        Example("class_token_backward", (r(2, 2, 1, 1), nan(2, 2, 0, 1), nan(2)), (1, 2), label="T=0"),
        Example("position_embedding_forward", (r(2, 3, 5, 1), r(1, 5, 3), nan(2, 3, 5, 1)), (2,),
                launch={"block": 8}, label="T=5, pos (1, T, D)"),
        Example("position_embedding_forward", (xs, r(24), xs), (2,), label="y aliases x, H*W 3x2"),
        Example("position_embedding_backward", (r(2, 3, 5, 1), nan(1, 5, 3)), (1,), launch={"block": 8},
                label="T=5"),
        Example("position_embedding_backward", (r(3, 4, 3, 2), nan(24)), (1,), label="H*W 3x2, N=3"),
        Example("token_select_forward", (r(2, 3, 5, 1), nan(2, 3)), (1,), kwargs={"index": 0},
                launch={"block": 4}, label="index 0"),
        Example("token_select_forward", (xs, nan(2, 4)), (1,), kwargs={"index": -1}, label="index -1, 3x2"),
        Example("token_select_backward", (r(2, 3), nan(2, 3, 5, 1)), (1,), kwargs={"index": 0},
                launch={"block": 8}, label="index 0"),
        Example("token_select_backward", (r(2, 4), nan(2, 4, 3, 2)), (1,), kwargs={"index": 4},
                label="index 4, 3x2"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
