"""Linear (fully connected) layers in PyTorch's layout: weight (out_features, in_features),
y = x @ w.T for a batch x of shape (N, in_features).

Run the self-check on the simulator:  NUMBA_ENABLE_CUDASIM=1 python -m kernels.linear

This family defines no kernels of its own: each op is one call of `kernels.gemm.gemm`,
    forward          y  = x @ w.T     gemm(x, w, y, trans_b=True)    (N, in) x (out, in)^T
    backward_data    dx = dy @ w      gemm(dy, w, dx)                (N, out) x (out, in)
    backward_filter  dw = dy.T @ x    gemm(dy, x, dw, trans_a=True)  (N, out)^T x (N, in)
and the bias is added and reduced by `kernels.elementwise.bias_add` / `bias_backward`.

Canonical order: GEMM's. Each output sums its products from 0.0 in ascending order of the
reduction index (in_features for forward, out_features for backward_data, the batch index for
backward_filter), so every version gives the same bits. ``version`` and ``block`` go to gemm.
"""
from __future__ import annotations

from kernels._check import Example, example_arrays, main
from kernels._common import Op, check
from kernels.gemm import VERSIONS, gemm


# ---------------------------------------------------------------- NumPy references
def linear_forward_ref(x, w, y):
    """y = x @ w.T (no bias: see elementwise.bias_add)."""
    y[...] = x @ w.T


def linear_backward_data_ref(dy, w, dx):
    """dx = dy @ w."""
    dx[...] = dy @ w


def linear_backward_filter_ref(x, dy, dw):
    """dw = dy.T @ x (overwritten, not accumulated)."""
    dw[...] = dy.T @ x


# ---------------------------------------------------------------- launchers
def _matrix(name, a):
    check(name, a)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D array, got shape {tuple(a.shape)}")
    return a.shape


def _features(op, x_name, x_shape, w_shape, w_axis):
    """Raise unless axis ``w_axis`` of the weight matches the last axis of ``x`` (or ``dy``)."""
    if w_shape[w_axis] != x_shape[1]:
        want = ("(out_features, {})" if w_axis == 1 else "({}, in_features)").format(x_shape[1])
        raise ValueError(f"{op} w: expected shape {want} to match {x_name} {tuple(x_shape)}, got "
                         f"{tuple(w_shape)}")


def linear_forward(x, w, y, *, stream=0, version="v3", block=None):
    n, _ = _matrix("linear_forward x", x)
    w_shape = _matrix("linear_forward w", w)
    _features("linear_forward", "x", x.shape, w_shape, 1)
    check("linear_forward y", y, shape=(n, w_shape[0]))
    gemm(x, w, y, trans_b=True, stream=stream, version=version, block=block)


def linear_backward_data(dy, w, dx, *, stream=0, version="v3", block=None):
    n, _ = _matrix("linear_backward_data dy", dy)
    w_shape = _matrix("linear_backward_data w", w)
    _features("linear_backward_data", "dy", dy.shape, w_shape, 0)
    check("linear_backward_data dx", dx, shape=(n, w_shape[1]))
    gemm(dy, w, dx, stream=stream, version=version, block=block)


def linear_backward_filter(x, dy, dw, *, stream=0, version="v3", block=None):
    n, fin = _matrix("linear_backward_filter x", x)
    dy_shape = _matrix("linear_backward_filter dy", dy)
    if dy_shape[0] != n:
        raise ValueError(f"linear_backward_filter dy: expected batch {n} like x {tuple(x.shape)}, "
                         f"got shape {tuple(dy_shape)}")
    check("linear_backward_filter dw", dw, shape=(dy_shape[1], fin))
    gemm(dy, x, dw, trans_a=True, stream=stream, version=version, block=block)


OPS = {
    "linear_forward": Op("linear_forward", linear_forward_ref, linear_forward, VERSIONS),
    "linear_backward_data": Op("linear_backward_data", linear_backward_data_ref,
                               linear_backward_data, VERSIONS),
    "linear_backward_filter": Op("linear_backward_filter", linear_backward_filter_ref, linear_backward_filter,
                                 VERSIONS),
}


def examples(rng):
    r, nan = example_arrays(rng)
    n, fin, fout = 7, 13, 5
    tol = {"rtol": 1e-4, "atol": 1e-5}
    small = {"block": (4, 4, 2, 2)}
    return [
        Example("linear_forward", (r(n, fin), r(fout, fin), nan(n, fout)), (2,), launch=small,
                label="7x13 -> 5", **tol),
        Example("linear_forward", (r(1, 19), r(9, 19), nan(1, 9)), (2,), launch={"block": (8, 4, 1, 2)},
                label="batch 1, 19 -> 9", **tol),
        Example("linear_backward_data", (r(n, fout), r(fout, fin), nan(n, fin)), (2,), launch=small,
                label="7x5 -> 13", **tol),
        Example("linear_backward_filter", (r(n, fin), r(n, fout), nan(fout, fin)), (2,), launch=small,
                label="batch 7, 5x13", **tol),
        Example("linear_backward_filter", (r(11, 3), r(11, 6), nan(6, 3)), (2,),
                launch={"block": (4, 8, 2, 4)}, label="batch 11, 6x3", **tol),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
