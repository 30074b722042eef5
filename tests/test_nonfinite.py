"""NaN and Inf, as PyTorch treats them: every kernel propagates them exactly as its NumPy reference
does, and the references follow PyTorch where a rule is needed (ReLU, max pooling, dropout).

Nothing here needs PyTorch: the rules are written out, each with the PyTorch code that makes it."""
import dataclasses

import numpy as np
import pytest

import kernels
from kernels import activation as A, dropout as D, pooling as P, softmax as S
from kernels._check import compare, run_example

POISON = (np.nan, np.inf, -np.inf)
NOT_NEGATIVE = {("batchnorm_forward_infer", 4)}  # running_var: the simulator's math.sqrt raises on -inf


def _poisoned(ex, seed):
    """``ex`` with a NaN, a +inf and a -inf in each float32 input (an all-NaN array is an output
    to be written, and is left alone); aliased arrays stay aliased."""
    rng = np.random.default_rng(seed)
    done = {}

    def poison(i, a):
        if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size and not np.isnan(a).all()):
            return a
        if id(a) not in done:
            values = POISON[:2] if (ex.op, i) in NOT_NEGATIVE else POISON
            b = a.copy()
            flat = b.reshape(-1)
            for pos, v in zip(rng.choice(flat.size, size=min(len(values), flat.size), replace=False), values):
                flat[pos] = v
            done[id(a)] = b
        return done[id(a)]

    return dataclasses.replace(ex, args=tuple(poison(i, a) for i, a in enumerate(ex.args)))


def _cases():
    for fam in kernels.FAMILIES:
        mod = kernels.family(fam)
        for i, ex in enumerate(mod.examples(np.random.default_rng(0))):
            version = (ex.versions or mod.OPS[ex.op].versions)[-1]  # the newest: the one the runtime uses
            yield pytest.param(fam, i, version, id=f"{fam}.{ex.op}[{ex.label or i}]-{version}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy and the simulator's threads warn of NaN
@pytest.mark.parametrize("fam,index,version", list(_cases()))
def test_every_kernel_propagates_nan_and_inf_as_its_reference(fam, index, version):
    """Each example of each family with NaN, +inf and -inf in its inputs: the simulated kernel's
    outputs are NaN, inf and finite in exactly the reference's places (and close elsewhere)."""
    mod = kernels.family(fam)
    ex = _poisoned(mod.examples(np.random.default_rng(0))[index], seed=index)
    with np.errstate(all="ignore"):
        want, got = run_example(mod.OPS, ex, version)
    err = compare(ex, want, got)
    assert err is None, err
    for w, g in zip(want, got):
        if w.dtype.kind == "f":
            assert np.array_equal(np.isnan(w), np.isnan(g)) and np.array_equal(np.isinf(w), np.isinf(g))


def test_the_poisoned_examples_do_reach_the_outputs():
    """The test above would pass vacuously if no non-finite value came out: most outputs show one."""
    shown = 0
    for fam in kernels.FAMILIES:
        mod = kernels.family(fam)
        for i, ex in enumerate(mod.examples(np.random.default_rng(0))):
            ex = _poisoned(ex, seed=i)
            op = mod.OPS[ex.op]
            args = [a.copy() if isinstance(a, np.ndarray) else a for a in ex.args]
            with np.errstate(all="ignore"):
                op.reference(*args, **ex.kwargs)
            shown += any(args[j].dtype.kind == "f" and not np.isfinite(args[j]).all() for j in ex.outputs)
    assert shown >= 30


# ---------------------------------------------------------------- the rules, as PyTorch has them
X = np.array([np.nan, np.inf, -np.inf, -1.0, -0.0, 0.0, 2.0], np.float32)


def test_relu_propagates_nan_and_passes_its_gradient():
    """torch.relu = clamp_min(x, 0): NaN stays NaN, +inf stays +inf. Its backward is
    threshold_backward(grad, result, 0) = (result <= 0 ? 0 : grad): a NaN passes the gradient."""
    y, dx = np.empty_like(X), np.empty_like(X)
    A.relu_forward_ref(X, y)
    np.testing.assert_array_equal(y, [np.nan, np.inf, 0, 0, 0, 0, 2])
    A.relu_backward_ref(X, y, np.full_like(X, 3.0), dx)
    np.testing.assert_array_equal(dx, [3, 3, 0, 0, 0, 0, 3])


def test_maxpool_propagates_nan_and_sends_its_gradient_to_the_last_nan():
    """PyTorch's max_pool2d scans the window with ``if (val > maxval || isnan(val))``: the output is
    NaN and the index is the window's last NaN; ties keep the first maximum; a window of -inf keeps
    its first position."""
    x = np.array([[[[1.0, np.nan, 5.0, 5.0],
                    [np.nan, 0.0, 2.0, 5.0],
                    [-np.inf, -np.inf, np.inf, 1.0],
                    [-np.inf, -np.inf, 3.0, np.inf]]]], np.float32)
    y, dx = np.empty((1, 1, 2, 2), np.float32), np.empty_like(x)
    P.maxpool2d_forward_ref(x, y, kernel=2)
    np.testing.assert_array_equal(y, [[[[np.nan, 5.0], [-np.inf, np.inf]]]])
    P.maxpool2d_backward_ref(x, y, np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32), dx, kernel=2)
    np.testing.assert_array_equal(dx, [[[[0, 0, 2, 0], [1, 0, 0, 0], [3, 0, 4, 0], [0, 0, 0, 0]]]])


def test_dropout_keeps_nan_and_inf_visible_where_it_drops():
    """PyTorch's dropout is x * mask * scale: a dropped NaN or inf is NaN (0 * NaN, 0 * inf)."""
    x = np.tile(X, 40)
    y, mask = np.empty_like(x), np.empty(x.shape, np.uint8)
    D.dropout_forward_ref(x, y, p=0.5, seed=1)
    D.dropout_mask_ref(mask, p=0.5, seed=1)
    dropped = mask == 0
    assert dropped.any() and (~dropped).any()
    nonfinite = ~np.isfinite(x)
    assert np.isnan(y[dropped & nonfinite]).all() and np.array_equal(y[dropped & ~nonfinite], np.zeros(
        int((dropped & ~nonfinite).sum()), np.float32))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(y[~dropped], x[~dropped] * np.float32(2.0))
    dx = np.empty_like(x)
    D.dropout_backward_ref(x, dx, p=0.5, seed=1)
    assert np.isnan(dx[dropped & nonfinite]).all() and not dx[dropped & ~nonfinite].any()


def test_a_nan_logit_makes_the_loss_and_its_row_nan():
    """cross_entropy(logits) with a NaN in a row: that row's probabilities and the mean loss are NaN;
    a -inf logit is only a zero probability, and the loss stays finite unless it is the label's."""
    logits = np.array([[0.0, np.nan, 1.0], [0.0, -np.inf, 1.0], [2.0, 1.0, 0.0]], np.float32)
    prob, loss = np.empty_like(logits), np.empty(1, np.float32)
    labels = np.array([0, 0, 2], np.int32)
    S.softmax_xent_forward_ref(logits, labels, prob, loss)
    assert np.isnan(loss[0]) and np.isnan(prob[0]).all() and np.isfinite(prob[1:]).all() and prob[1, 1] == 0
    S.softmax_xent_forward_ref(logits[1:], labels[1:], prob[1:], loss)
    assert np.isfinite(loss[0])
    with np.errstate(divide="ignore"):
        S.softmax_xent_forward_ref(logits[1:2], np.array([1], np.int32), prob[1:2], loss)
    assert loss[0] == np.inf
