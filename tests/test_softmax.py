"""Softmax cross-entropy: the backward reference against central differences of the loss,
invalid labels (references raise, kernels give NaN), stability, determinism, argument checks."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from kernels import softmax as sm
from gradcheck import assert_grad_close, numeric_grad


def _forward_ref(logits, labels):
    prob, loss = np.empty_like(logits), np.empty(1, logits.dtype)
    sm.softmax_xent_forward_ref(logits, labels, prob, loss)
    return prob, loss


def _forward_dev(logits, labels, version, block=4):
    dev = [cuda.to_device(a) for a in (logits, labels, np.empty_like(logits), np.empty(1, np.float32))]
    sm.softmax_xent_forward(*dev, version=version, block=block)
    return dev[2].copy_to_host(), dev[3].copy_to_host()


@pytest.mark.parametrize("n,k", [(4, 5), (1, 3), (6, 2)])
def test_backward_reference_matches_central_differences(rng, n, k):
    logits, labels = 2 * rng.standard_normal((n, k)), rng.integers(0, k, n).astype(np.int32)
    prob, _ = _forward_ref(logits, labels)
    dlogits = np.empty_like(prob)
    sm.softmax_xent_backward_ref(prob, labels, dlogits)
    numeric = numeric_grad(lambda: float(_forward_ref(logits, labels)[1][0]), logits)
    assert_grad_close("softmax_xent logits", dlogits, numeric, rtol=1e-5, atol=1e-7)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), k=st.integers(1, 9), scale=st.sampled_from([0.1, 3.0, 50.0]),
       seed=st.integers(0, 99))
def test_reference_invariants(n, k, scale, seed):
    """Rows of prob sum to 1, the loss is >= 0, and it is the mean of -log prob[label]."""
    rng = np.random.default_rng(seed)
    logits, labels = scale * rng.standard_normal((n, k)), rng.integers(0, k, n).astype(np.int32)
    prob, loss = _forward_ref(logits, labels)
    np.testing.assert_allclose(prob.sum(axis=1), 1.0, rtol=1e-12)
    assert loss[0] >= -1e-12
    picked = prob[np.arange(n), labels]
    if picked.min() > 1e-300:
        np.testing.assert_allclose(loss[0], np.mean(-np.log(picked)), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("version", sm.VERSIONS)
def test_loss_stays_finite_when_the_label_probability_underflows(version):
    logits = np.array([[100.0, -100.0, 0.0], [0.0, 1.0, 2.0]], np.float32)
    labels = np.array([1, 2], np.int32)
    prob, loss = _forward_dev(logits, labels, version)
    assert prob[0, 1] == 0.0
    _, want = _forward_ref(logits.astype(np.float64), labels)
    np.testing.assert_allclose(loss, want, rtol=1e-6)


@pytest.mark.parametrize("bad", [-1, 5])
def test_invalid_label_references_raise(rng, bad):
    logits, labels = rng.standard_normal((3, 5)), np.array([0, bad, 4], np.int32)
    with pytest.raises(ValueError, match=rf"label {bad} at batch index 1 is outside \[0, 5\)"):
        sm.check_labels(labels, 5)
    with pytest.raises(ValueError, match="outside"):
        _forward_ref(logits, labels)
    with pytest.raises(ValueError, match="outside"):
        sm.softmax_xent_backward_ref(np.full((3, 5), 0.2), labels, np.empty((3, 5)))


@pytest.mark.parametrize("version", sm.VERSIONS)
def test_invalid_label_kernels_give_nan_loss_and_a_nan_gradient_row(rng, version):
    logits = rng.standard_normal((3, 5)).astype(np.float32)
    labels = np.array([0, 7, 4], np.int32)
    prob, loss = _forward_dev(logits, labels, version)
    assert np.isnan(loss[0])
    good_prob, _ = _forward_ref(logits, np.zeros(3, np.int32))
    np.testing.assert_allclose(prob, good_prob, rtol=1e-5, atol=1e-7)  # prob does not depend on labels
    d = cuda.to_device(prob)
    sm.softmax_xent_backward(d, cuda.to_device(labels), d)
    d = d.copy_to_host()
    assert np.isnan(d[1]).all() and not np.isnan(d[[0, 2]]).any()


@pytest.mark.parametrize("version", sm.VERSIONS)
def test_forward_is_deterministic_and_versions_agree(rng, version):
    logits = (4 * rng.standard_normal((6, 11))).astype(np.float32)
    labels = rng.integers(0, 11, 6).astype(np.int32)
    first, again = _forward_dev(logits, labels, version), _forward_dev(logits, labels, version)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    other = _forward_dev(logits, labels, "v2" if version == "v1" else "v1")
    for a, b in zip(first, other):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("version", sm.VERSIONS)
def test_forward_in_place_equals_out_of_place(rng, version):
    logits = (3 * rng.standard_normal((5, 7))).astype(np.float32)
    labels = cuda.to_device(rng.integers(0, 7, 5).astype(np.int32))
    inplace, loss_in = cuda.to_device(logits), cuda.to_device(np.full(1, np.nan, np.float32))
    sm.softmax_xent_forward(inplace, labels, inplace, loss_in, version=version, block=4)
    prob, loss = _forward_dev(logits, labels.copy_to_host(), version)
    np.testing.assert_array_equal(inplace.copy_to_host(), prob)
    np.testing.assert_array_equal(loss_in.copy_to_host(), loss)


def test_backward_in_place_equals_out_of_place(rng):
    prob, _ = _forward_ref(rng.standard_normal((4, 6)).astype(np.float32), np.zeros(4, np.int32))
    labels = cuda.to_device(np.array([5, 0, 3, 3], np.int32))
    inplace, out = cuda.to_device(prob), cuda.to_device(np.full_like(prob, np.nan))
    sm.softmax_xent_backward(cuda.to_device(prob), labels, out)
    sm.softmax_xent_backward(inplace, labels, inplace)
    np.testing.assert_array_equal(inplace.copy_to_host(), out.copy_to_host())


def _dev(*shape, dtype=np.float32):
    return cuda.to_device(np.zeros(shape, dtype))


def _fwd(logits=(3, 4), labels=(3,), prob=(3, 4), loss=(1,), label_dtype=np.int32):
    """Arguments of a forward call, built when the test runs (not at collection)."""
    return lambda: (_dev(*logits), _dev(*labels, dtype=label_dtype), _dev(*prob), _dev(*loss))


@pytest.mark.parametrize("args,kwargs,match", [
    (_fwd(label_dtype=np.int64), {}, r"softmax_xent_forward labels: expected dtype int32, got int64"),
    (_fwd(labels=(4,)), {}, r"softmax_xent_forward labels: expected shape \(3,\), got \(4,\)"),
    (_fwd(prob=(4, 3)), {}, r"softmax_xent_forward prob: expected shape \(3, 4\)"),
    (_fwd(loss=()), {}, r"softmax_xent_forward loss: expected shape \(1,\)"),
    (_fwd(logits=(0, 4), labels=(0,), prob=(0, 4)), {}, r"logits: expected a non-empty \(N, K\)"),
    (_fwd(), {"block": 6}, r"block must be a power of two"),
], ids=["labels int64", "labels shape", "prob shape", "loss shape", "empty batch", "block"])
def test_forward_bad_arguments_raise_clear_errors(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        sm.softmax_xent_forward(*args(), **kwargs)


def test_backward_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match=r"softmax_xent_backward dlogits: expected shape \(3, 4\)"):
        sm.softmax_xent_backward(_dev(3, 4), _dev(3, dtype=np.int32), _dev(3, 5))
    with pytest.raises(ValueError, match=r"softmax_xent_backward prob: expected a non-empty"):
        sm.softmax_xent_backward(_dev(12), _dev(3, dtype=np.int32), _dev(12))
