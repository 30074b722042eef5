"""SGD: several steps against a NumPy transcription of torch.optim.SGD's loop, the momentum == 0
contract (no buffer), and argument checks."""
import numpy as np
import pytest
from numba import cuda

from kernels import sgd


def torch_sgd_steps(w, grads, *, lr, momentum, weight_decay):
    """torch.optim.SGD.step (dampening 0, nesterov False) written out, one NumPy op at a time."""
    p, buf = w.copy(), None
    t = w.dtype.type
    for g in grads:
        d_p = g
        if weight_decay != 0:
            d_p = d_p + t(weight_decay) * p  # d_p.add(p, alpha=weight_decay)
        if momentum != 0:
            if buf is None:
                buf = d_p.copy()  # torch.clone(d_p).detach()
            else:
                buf = t(momentum) * buf + d_p  # buf.mul_(momentum).add_(d_p, alpha=1 - dampening)
            d_p = buf
        p = p - t(lr) * d_p  # p.add_(d_p, alpha=-lr)
    return p, buf


HYPER = [
    {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4},
    {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0},
    {"lr": 0.2, "momentum": 0.0, "weight_decay": 1e-2},
    {"lr": 0.01, "momentum": 0.0, "weight_decay": 0.0},
]


@pytest.mark.parametrize("hyper", HYPER, ids=lambda h: f"m={h['momentum']},wd={h['weight_decay']}")
def test_several_steps_match_torch_sgd(rng, hyper):
    shape = (4, 3, 3, 3)
    w0 = rng.standard_normal(shape).astype(np.float32)
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(5)]
    want_w, want_v = torch_sgd_steps(w0, grads, **hyper)

    w_ref, v_ref = w0.copy(), np.zeros_like(w0)
    w_dev, v_dev = cuda.to_device(w0), cuda.to_device(np.zeros_like(w0))
    for g in grads:
        sgd.sgd_update_ref(w_ref, g, v_ref, **hyper)
        sgd.sgd_update(w_dev, cuda.to_device(g), v_dev, **hyper)
    # The reference is the same float32 arithmetic, op for op: bit-identical.
    np.testing.assert_array_equal(w_ref, want_w)
    # The GPU may fuse multiply-adds (FMA), so the kernel is compared within a few ulps.
    np.testing.assert_allclose(w_dev.copy_to_host(), want_w, rtol=1e-6, atol=1e-7)
    if hyper["momentum"] != 0:
        np.testing.assert_array_equal(v_ref, want_v)
        np.testing.assert_allclose(v_dev.copy_to_host(), want_v, rtol=1e-6, atol=1e-7)


def test_zero_momentum_neither_reads_nor_writes_v(rng):
    w0, g = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
    garbage = np.full(50, np.nan, np.float32)
    v = cuda.to_device(garbage)
    w_with, w_none = cuda.to_device(w0), cuda.to_device(w0)
    sgd.sgd_update(w_with, cuda.to_device(g), v, lr=0.1)
    sgd.sgd_update(w_none, cuda.to_device(g), None, lr=0.1)
    np.testing.assert_array_equal(v.copy_to_host(), garbage)
    np.testing.assert_array_equal(w_with.copy_to_host(), w_none.copy_to_host())
    assert np.isfinite(w_none.copy_to_host()).all()
    ref_v = garbage.copy()
    sgd.sgd_update_ref(w0.copy(), g, ref_v, lr=0.1)
    np.testing.assert_array_equal(ref_v, garbage)


def _dev(*shape, dtype=np.float32):
    return cuda.to_device(np.zeros(shape, dtype))


@pytest.mark.parametrize("make,kwargs,match", [
    (lambda: (_dev(3, 4), _dev(4, 3), _dev(3, 4)), {"lr": 0.1},
     r"sgd_update dw: expected shape \(3, 4\), got \(4, 3"),
    (lambda: (_dev(5), _dev(5), _dev(6)), {"lr": 0.1, "momentum": 0.9},
     r"sgd_update v: expected shape \(5,\)"),
    (lambda: (_dev(5), _dev(5), None), {"lr": 0.1, "momentum": 0.9},
     r"sgd_update v: expected a device array, got None"),
    (lambda: (_dev(5, dtype=np.float64), _dev(5), None), {"lr": 0.1},
     r"sgd_update w: expected dtype float32"),
    (lambda: (_dev(5), _dev(5), None), {"lr": -0.1}, r"sgd_update lr: expected a value >= 0, got -0.1"),
    (lambda: (_dev(5), _dev(5), _dev(5)), {"lr": 0.1, "momentum": -1},
     r"sgd_update momentum: expected a value >= 0"),
    (lambda: (_dev(5), _dev(5), None), {"lr": 0.1, "weight_decay": float("nan")}, r"sgd_update weight_decay"),
    (lambda: (_dev(5), _dev(5), None), {"lr": 0.1, "guard": _dev(0)},
     r"sgd_update guard: expected one element \(the loss\), got shape \(0,\)"),
], ids=["dw shape", "v shape", "v missing", "w dtype", "negative lr", "negative momentum",
        "nan weight decay", "empty guard"])
def test_bad_arguments_raise_clear_errors(make, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sgd.sgd_update(*make(), **kwargs)
