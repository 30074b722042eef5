"""Stochastic gradient descent, exactly as ``torch.optim.SGD`` (dampening 0, nesterov False).

``sgd_update(w, dw, v, *, lr, momentum=0.0, weight_decay=0.0, guard=None)`` updates one parameter in place::

    d = dw + weight_decay * w      (skipped when weight_decay == 0, as PyTorch does)
    v = momentum * v + d           (only when momentum != 0)
    w = w - lr * v                 (w = w - lr * d when momentum == 0)

The momentum buffer v must start as zeros: then the first step gives v = d, which is PyTorch's
first-step ``buf = d.clone()``. With momentum == 0 PyTorch keeps no buffer, and neither does
this: v is neither read nor written, and may be None. w, dw and v may have any shape (a weight
or a bias); they are viewed as 1-D. ``guard``: a one-element array (the loss); if its value is not
finite the update is skipped, w and v untouched: a step whose loss came out NaN or infinite changes
no weight even when its updates run inside backward, before anyone could read the loss (the device
decides, no synchronization). Run the self-check on the simulator:
    NUMBA_ENABLE_CUDASIM=1 python -m kernels.sgd

Element-wise, one thread per element: no reduction, bit-reproducible.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

from kernels._check import Example, example_arrays, main
from kernels._common import Op, ceil_div, check, check_version, cuda_kernel, flat

BLOCK = 256  # threads per block


# ---------------------------------------------------------------- NumPy reference
def sgd_update_ref(w, dw, v, *, lr, momentum=0.0, weight_decay=0.0, guard=None):
    _check_hyper(lr, momentum, weight_decay)
    if guard is not None and not np.isfinite(guard.reshape(-1)[0]):
        return
    t = w.dtype.type
    d = dw + t(weight_decay) * w if weight_decay != 0 else dw
    if momentum != 0:
        v[...] = t(momentum) * v + d
        d = v
    w -= t(lr) * d


# ---------------------------------------------------------------- kernels
@cuda_kernel("void(float32[::1], float32[::1], float32[::1], int32, float32, float32)")
def _sgd_plain_v1(w, dw, guard, guarded, lr, weight_decay):
    # momentum == 0: no buffer; one thread per element. A guard that is not finite: no update.
    i = cuda.grid(1)
    if guarded != 0 and (math.isnan(guard[0]) or math.isinf(guard[0])):
        return
    if i < w.size:
        d = dw[i]
        if weight_decay != 0:
            d = d + weight_decay * w[i]
        w[i] = w[i] - lr * d


@cuda_kernel("void(float32[::1], float32[::1], float32[::1], float32[::1], int32, float32, float32, float32)")
def _sgd_momentum_v1(w, dw, v, guard, guarded, lr, momentum, weight_decay):
    # momentum != 0: update the buffer, then step along it; one thread per element. A guard that is
    # not finite (the loss of a step gone wrong): no update.
    i = cuda.grid(1)
    if guarded != 0 and (math.isnan(guard[0]) or math.isinf(guard[0])):
        return
    if i < w.size:
        d = dw[i]
        if weight_decay != 0:
            d = d + weight_decay * w[i]
        b = momentum * v[i] + d
        v[i] = b
        w[i] = w[i] - lr * b


# ---------------------------------------------------------------- launcher
def _check_hyper(lr, momentum, weight_decay):
    """PyTorch's own checks: each hyper-parameter must be >= 0."""
    for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
        if not value >= 0:
            raise ValueError(f"sgd_update {name}: expected a value >= 0, got {value!r}")


def sgd_update(w, dw, v, *, lr, momentum=0.0, weight_decay=0.0, guard=None, stream=0, version="v1"):
    """One SGD step on parameter w in place; v is the momentum buffer (unused if momentum == 0);
    skipped if ``guard`` (a one-element array) is given and not finite."""
    check_version(version, ("v1",))
    _check_hyper(lr, momentum, weight_decay)
    check("sgd_update w", w)
    check("sgd_update dw", dw, shape=w.shape)
    if momentum != 0:
        check("sgd_update v", v, shape=w.shape)
    if guard is not None:
        check("sgd_update guard", guard)
        if guard.size != 1:  # the kernels read guard[0]: an empty one would be read out of bounds
            raise ValueError("sgd_update guard: expected one element (the loss), got shape "
                             f"{tuple(guard.shape)}")
    if w.size == 0:
        return
    grid = ceil_div(w.size, BLOCK)
    g = flat(guard)[:1] if guard is not None else flat(w)[:1]  # without a guard: any array, never read
    on = np.int32(guard is not None)
    if momentum == 0:
        _sgd_plain_v1[grid, BLOCK, stream](flat(w), flat(dw), g, on, np.float32(lr),
                                           np.float32(weight_decay))
    else:
        _sgd_momentum_v1[grid, BLOCK, stream](flat(w), flat(dw), flat(v), g, on, np.float32(lr),
                                              np.float32(momentum), np.float32(weight_decay))


OPS = {"sgd_update": Op("sgd_update", sgd_update_ref, sgd_update)}


def examples(rng):
    r, _ = example_arrays(rng)
    return [
        Example("sgd_update", (r(3, 4, 3, 3), r(3, 4, 3, 3), r(3, 4, 3, 3)), (0, 2),
                kwargs={"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}, label="conv weight, momentum"),
        Example("sgd_update", (r(37), r(37), np.zeros(37, np.float32)), (0, 2),
                kwargs={"lr": 0.01, "momentum": 0.9}, label="bias, first step"),
        Example("sgd_update", (r(5, 11), r(5, 11), None), (0,), kwargs={"lr": 0.05, "weight_decay": 1e-2},
                label="no momentum, v=None"),
        Example("sgd_update", (r(300), r(300), np.full(300, np.nan, np.float32)), (0, 2), kwargs={"lr": 0.5},
                label="no momentum, v untouched"),
        Example("sgd_update", (r(40), r(40), r(40)), (0, 2),
                kwargs={"lr": 0.1, "momentum": 0.9, "guard": np.array([1.5], np.float32)},
                label="finite guard: runs"),
        Example("sgd_update", (r(40), r(40), r(40)), (0, 2),
                kwargs={"lr": 0.1, "momentum": 0.9, "guard": np.array([np.nan], np.float32)},
                label="NaN guard: no update"),
        Example("sgd_update", (r(40), r(40), None), (0,),
                kwargs={"lr": 0.1, "guard": np.array([-np.inf], np.float32)},
                label="infinite guard, no momentum"),
    ]


if __name__ == "__main__":
    main(__import__(__name__))
