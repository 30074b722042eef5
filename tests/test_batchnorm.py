"""Batch normalization: gradients of the reference, PyTorch's running-statistics rule, the
recompute contract (update_running=False moves nothing), determinism, and argument checks."""
import numpy as np
import pytest
from numba import cuda

from kernels import batchnorm as bn
from gradcheck import check_backward, rand64

AXES = {2: (0,), 4: (0, 2, 3)}


def _train_args(rng, shape, dtype=np.float32, loc=0.0):
    c = shape[1]
    x = (rng.standard_normal(shape) + loc).astype(dtype)
    gamma, beta = rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)
    rmean, rvar = rng.standard_normal(c).astype(dtype), (np.abs(rng.standard_normal(c)) + 0.5).astype(dtype)
    return [x, gamma, beta, np.empty_like(x), rmean, rvar, np.empty(c, dtype), np.empty(c, dtype)]


def _on_device(args):
    return [cuda.to_device(a) for a in args]


def _host(args):
    return [a.copy_to_host() for a in args]


@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (5, 3)])
def test_backward_reference_matches_central_differences(rng, shape):
    x, gamma, beta = rand64(rng, *shape), rand64(rng, shape[1]), rand64(rng, shape[1])
    c = shape[1]

    def forward(keep=None):
        y, mean, invstd = np.empty_like(x), np.empty(c), np.empty(c)
        bn.batchnorm_forward_train_ref(x, gamma, beta, y, np.zeros(c), np.ones(c), mean, invstd,
                                       update_running=False)
        if keep is not None:
            keep.extend([mean, invstd])
        return y

    saved = []
    forward(saved)
    dy = rand64(rng, *shape)
    dx, dgamma, dbeta = np.empty_like(x), np.empty(c), np.empty(c)
    bn.batchnorm_backward_ref(x, dy, gamma, saved[0], saved[1], dx, dgamma, dbeta)
    check_backward("batchnorm", forward, {"x": dx, "gamma": dgamma, "beta": dbeta},
                   {"x": x, "gamma": gamma, "beta": beta}, dy, rtol=1e-5, atol=1e-6)


def _pytorch_running_stats(batches, rmean, rvar, momentum):
    """PyTorch's rule, written out: biased variance normalizes, the unbiased one is tracked."""
    rmean, rvar = rmean.astype(np.float64), rvar.astype(np.float64)
    for x in batches:
        axes = AXES[x.ndim]
        rmean = (1 - momentum) * rmean + momentum * x.mean(axis=axes, dtype=np.float64)
        rvar = (1 - momentum) * rvar + momentum * x.var(axis=axes, ddof=1, dtype=np.float64)
    return rmean, rvar


@pytest.mark.parametrize("version", bn.VERSIONS)
@pytest.mark.parametrize("shape,momentum", [((3, 4, 2, 3), 0.1), ((7, 3), 0.5)])
def test_running_stats_follow_pytorch_over_steps(rng, version, shape, momentum):
    args = _train_args(rng, shape, loc=2.0)
    ref_args = [a.copy() for a in args]
    dev = _on_device(args)
    batches = [(rng.standard_normal(shape) * 1.5 + 2.0).astype(np.float32) for _ in range(3)]
    for xb in batches:
        dev[0] = cuda.to_device(xb)
        bn.batchnorm_forward_train(*dev, momentum=momentum, version=version, block=8)
        ref_args[0] = xb.copy()
        bn.batchnorm_forward_train_ref(*ref_args, momentum=momentum)
    want = _pytorch_running_stats(batches, args[4], args[5], momentum)
    got = _host(dev)
    for name, pos, w in (("running_mean", 4, want[0]), ("running_var", 5, want[1])):
        np.testing.assert_allclose(got[pos], w, rtol=1e-5, atol=1e-6, err_msg=f"{name} ({version})")
        np.testing.assert_allclose(ref_args[pos], w, rtol=1e-5, atol=1e-6, err_msg=f"{name} (reference)")


@pytest.mark.parametrize("version", bn.VERSIONS)
def test_update_running_false_moves_nothing_and_recomputes_the_same_bits(rng, version):
    """The recompute stage re-runs the forward: same y and saved stats, running stats untouched."""
    args = _train_args(rng, (3, 5, 2, 3))
    first = _on_device(args)
    bn.batchnorm_forward_train(*first, version=version, block=8)
    first = _host(first)
    again = _on_device(first)  # running stats already updated once
    bn.batchnorm_forward_train(*again, update_running=False, version=version, block=8)
    again = _host(again)
    for pos in range(8):
        np.testing.assert_array_equal(again[pos], first[pos], err_msg=f"argument {pos}")
    ref = [a.copy() for a in args]
    bn.batchnorm_forward_train_ref(*ref, update_running=False)
    np.testing.assert_array_equal(ref[4], args[4])
    np.testing.assert_array_equal(ref[5], args[5])


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_v2_is_deterministic_and_close_to_v1(rng, op):
    shape = (4, 3, 3, 5)
    if op == "forward":
        args, launch, outs = _train_args(rng, shape), bn.batchnorm_forward_train, (3, 6, 7)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
        mean, invstd = x.mean(axis=(0, 2, 3)), 1 / np.sqrt(x.var(axis=(0, 2, 3)) + 1e-5)
        args = [x, rng.standard_normal(shape).astype(np.float32), rng.standard_normal(3).astype(np.float32),
                mean.astype(np.float32), invstd.astype(np.float32), np.empty_like(x),
                np.empty(3, np.float32), np.empty(3, np.float32)]
        launch, outs = bn.batchnorm_backward, (5, 6, 7)
    runs = {}
    for version in ("v1", "v2", "v2"):
        dev = _on_device(args)
        launch(*dev, version=version, block=8)
        runs.setdefault(version, []).append(_host(dev))
    for pos in outs:
        np.testing.assert_array_equal(runs["v2"][0][pos], runs["v2"][1][pos])
        np.testing.assert_allclose(runs["v2"][0][pos], runs["v1"][0][pos], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("version", bn.VERSIONS)
def test_two_pass_variance_survives_a_large_mean(rng, version):
    """E[x^2] - E[x]^2 in float32 would lose every digit here; mean-then-deviations does not."""
    args = _train_args(rng, (4, 2, 3, 3), loc=1000.0)
    ref = [a.astype(np.float64) for a in args]
    bn.batchnorm_forward_train_ref(*ref)
    dev = _on_device(args)
    bn.batchnorm_forward_train(*dev, version=version, block=8)
    got = _host(dev)
    np.testing.assert_allclose(got[7], ref[7], rtol=1e-3)
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-3, atol=1e-3)


def test_inference_equals_training_when_running_stats_are_the_batch_stats(rng):
    x, gamma, beta, y, _, _, mean, invstd = _train_args(rng, (5, 3, 2, 2), dtype=np.float64)
    bn.batchnorm_forward_train_ref(x, gamma, beta, y, np.zeros(3), np.ones(3), mean, invstd, eps=1e-3)
    var = x.var(axis=(0, 2, 3))
    y_infer = np.empty_like(x)
    bn.batchnorm_forward_infer_ref(x, gamma, beta, mean, var, y_infer, eps=1e-3)
    np.testing.assert_allclose(y_infer, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pos,replacement,kwargs,match", [
    (3, np.empty((2, 3, 2, 3), np.float32), {}, r"batchnorm_forward_train y: expected shape \(2, 3, 2, 2\)"),
    (1, np.empty(4, np.float32), {}, r"batchnorm_forward_train gamma: expected shape \(3,\)"),
    (6, np.empty(3, np.float64), {}, r"batchnorm_forward_train save_mean: expected dtype float32"),
    (0, np.empty(3, np.float32), {}, r"batchnorm_forward_train x: .*at least 2 dimensions"),
    (None, None, {"block": 12}, r"block must be a power of two"),
    (None, None, {"block": bn.BN_BLOCK * 2}, r"block must be a power of two"),
    (None, None, {"version": "v9"}, r"unknown kernel version"),
])
def test_bad_arguments_raise_clear_errors(rng, pos, replacement, kwargs, match):
    args = _on_device(_train_args(rng, (2, 3, 2, 2)))
    if pos is not None:
        args[pos] = cuda.to_device(replacement)
    with pytest.raises(ValueError, match=match):
        bn.batchnorm_forward_train(*args, **kwargs)


def test_one_value_per_channel_is_refused(rng):
    args = _train_args(rng, (1, 3, 1, 1))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn.batchnorm_forward_train(*_on_device(args))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn.batchnorm_forward_train_ref(*args)


def test_backward_checks_shapes(rng):
    x = cuda.to_device(np.zeros((2, 3, 2, 2), np.float32))
    vec = cuda.to_device(np.zeros(3, np.float32))
    bad_dy = cuda.to_device(np.zeros((2, 4, 2, 2), np.float32))
    with pytest.raises(ValueError, match=r"batchnorm_backward dy: expected 3 channels"):
        bn.batchnorm_backward(x, bad_dy, vec, vec, vec, x, vec, vec)
    with pytest.raises(ValueError, match=r"batchnorm_backward dgamma: expected shape \(3,\)"):
        bn.batchnorm_backward(x, x, vec, vec, vec, x, cuda.to_device(np.zeros(2, np.float32)), vec)
