"""Property-based fuzzing of the public API: random small graphs, random (often bad) hyper-parameters,
batches, labels, learning rates and memory configurations, on the host device.

The property: every call either raises a ValueError (NonFiniteError is one) or a BudgetError, with a
message, or runs, and then its results are the reference's: the loss is what a host re-run of the
forward pass with the NumPy references computes (snlite.anomaly), bit for bit, and a run under a
random MemoryConfig trains to the same loss and weights as the baseline. Never another exception
type (a TypeError, an IndexError, a NumPy error from deep inside), never a silent NaN.
"""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from snlite import anomaly
from snlite.config import CHOICES, MemoryConfig
from snlite.graph import Graph
from snlite.errors import BudgetError
from snlite.train import Model

SETTINGS = settings(max_examples=600, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

BAD = {  # what users get wrong: a float, zero, a negative, a bool, a string, NaN
    "out_channels": [0, -1, 2.5, 2.0, True, "2"], "out_features": [0, 2.5, "2"],
    "kernel": [0, 1.5, (2,), "3"],
    "stride": [0, 1.5], "padding": [-1, 0.5], "eps": [-1.0, float("nan"), "1e-5"],
    "momentum": [-0.1, 1.5, float("nan")], "size": [0, 17, 2.5], "alpha": [-1.0, float("inf")],
    "k": [0.0, -1.0], "p": [-0.1, 1.0, float("nan"), "0.5", None], "groups": [0, 1.5, "2"],
    "ceil_mode": ["yes", None],
}


@st.composite
def layer(draw):
    """One builder call, as (method, keyword arguments); one argument in eight is a bad one."""
    kind = draw(st.sampled_from(["conv2d", "relu", "relu6", "maxpool", "avgpool", "batchnorm", "lrn",
                                 "dropout", "add", "concat", "flatten", "linear"]))
    kw = {}
    if kind == "conv2d":
        kw = dict(out_channels=draw(st.integers(1, 3)),
                  kernel=draw(st.sampled_from([1, 2, 3, (1, 2), (3, 1)])),
                  stride=draw(st.sampled_from([1, 1, 2])), padding=draw(st.sampled_from([0, 1])),
                  groups=draw(st.sampled_from([1, 1, 2, 3])))  # 2 or 3 need channels they divide
    elif kind in ("maxpool", "avgpool"):
        kw = dict(kernel=draw(st.sampled_from([1, 2, 3, (2, 1)])), stride=draw(st.sampled_from([None, 1, 2])),
                  padding=draw(st.sampled_from([0, 0, 1])), ceil_mode=draw(st.booleans()))
    elif kind == "batchnorm":
        kw = dict(eps=draw(st.sampled_from([1e-5, 1e-3])), momentum=draw(st.floats(0.0, 1.0)))
    elif kind == "lrn":
        kw = dict(size=draw(st.integers(1, 5)), alpha=draw(st.sampled_from([1e-4, 0.5])),
                  k=draw(st.sampled_from([1.0, 2.0])))
    elif kind == "dropout":
        kw = dict(p=draw(st.sampled_from([0.0, 0.3, 0.9])))
    elif kind == "linear":
        kw = dict(out_features=draw(st.integers(1, 4)))
    if kw and draw(st.integers(0, 7)) == 0:
        arg = draw(st.sampled_from(sorted(kw)))
        kw[arg] = draw(st.sampled_from(BAD[arg]))
    return kind, kw


def build(input_shape, num_classes, layers, flatten_last):
    g = Graph(input_shape, num_classes, name="fuzz")
    x = g.input()
    for kind, kw in layers:
        if kind == "add":
            x = g.add(x, g.relu(x))
        elif kind == "concat":
            x = g.concat([x, g.relu(x)])
        else:
            x = getattr(g, kind)(x, **kw)
    if flatten_last and len(x.shape) == 4:
        x = g.flatten(x)
    g.softmax_loss(g.linear(x, num_classes))
    return g


@st.composite
def batch(draw, shape, classes):
    """A batch and labels: mostly right, sometimes poisoned (NaN, inf), mis-shaped or mistyped."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.standard_normal(shape).astype(np.float32) if all(isinstance(s, int) and s > 0 for s in shape) \
        else np.zeros((2, 2), np.float32)
    n = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 2
    labels = rng.integers(0, max(int(classes), 1) if isinstance(classes, int) else 2, n)
    how = draw(st.sampled_from(["good"] * 12 + ["nan", "inf", "shape", "strings", "float labels", "range",
                                                "label count", "nan labels", "bool labels"]))
    if how == "nan" and x.size:
        x.flat[draw(st.integers(0, x.size - 1))] = np.nan
    elif how == "inf" and x.size:
        x.flat[draw(st.integers(0, x.size - 1))] = draw(st.sampled_from([np.inf, -np.inf]))
    elif how == "shape":
        x = x[:, :1] if x.ndim > 1 and x.shape[1] > 1 else np.zeros((1,), np.float32)
    elif how == "strings":
        x = x.astype(str)
    elif how == "float labels":
        labels = labels + 0.5
    elif how == "range":
        labels = labels + 100
    elif how == "label count":
        labels = labels[:-1]
    elif how == "nan labels":
        labels = np.full(n, np.nan)
    elif how == "bool labels":
        labels = labels > 0
    return x, labels


CONFIG = st.builds(MemoryConfig, liveness=st.booleans(), offload=st.booleans(), cache=st.booleans(),
                   recompute=st.sampled_from(CHOICES["recompute"]),
                   workspace=st.sampled_from(CHOICES["workspace"]), fit=st.sampled_from(CHOICES["fit"]),
                   budget_bytes=st.sampled_from([None] * 4 + [1024, 16 << 10, 256 << 10, 1 << 20]))


def _clear(e):
    """An expected error: a ValueError or BudgetError whose message says something."""
    assert isinstance(e, (ValueError, BudgetError)), f"{type(e).__name__}: {e}"
    assert str(e).strip(), f"{type(e).__name__} without a message"


@SETTINGS
@given(n=st.sampled_from([1, 2, 3] * 6 + [0, 2.5]), c=st.integers(1, 3), hw=st.integers(2, 7),
       flat_input=st.sampled_from([False] * 5 + [True]), classes=st.sampled_from([2, 3, 4] * 6 + [1, 2.5]),
       layers=st.lists(layer(), max_size=4),
       flatten_last=st.sampled_from([True] * 9 + [False]), data=st.data(),
       config=CONFIG,
       lr=st.sampled_from([0.01, 0.1, 1.0] * 6 + [0.0, -0.1, float("inf"), float("nan"), "0.1"]),
       seed=st.integers(0, 3))
def test_random_graphs_and_inputs_fail_clearly_or_match_the_reference(n, c, hw, flat_input, classes, layers,
                                                                      flatten_last, data, config, lr, seed):
    shape = (n, c * hw) if flat_input else (n, c, hw, hw)
    try:
        g = build(shape, classes, layers, flatten_last)
    except Exception as e:  # noqa: BLE001 (the property: only clear ValueErrors)
        _clear(e)
        event("the graph is refused")
        return
    x, labels = data.draw(batch(g.input_shape, g.num_classes))
    model = params = None
    try:
        model = Model(g, config, device="host", seed=seed)
        params = model.params
        loss = model.step(x, labels, lr=lr, momentum=0.9)
    except Exception as e:  # noqa: BLE001
        _clear(e)
        event(f"the step is refused: {type(e).__name__}")
        if params is not None:  # a refused step changes nothing
            assert model.iteration == 0
            for k, v in model.params.items():
                np.testing.assert_array_equal(v, params[k], err_msg=k)
        return
    event("the step runs")
    # it ran: a finite loss, the reference's, bit for bit, and the baseline's under any config
    assert math.isfinite(loss)
    *_, (name, ref) = anomaly.forward_outputs(g, params, x, labels, iteration=0, seed=seed)
    assert name == g.loss_layer and np.float32(loss) == ref[0]
    base = Model(g, device="host", seed=seed)
    assert base.step(x, labels, lr=lr, momentum=0.9) == loss
    for k, v in base.params.items():
        np.testing.assert_array_equal(model.params[k], v, err_msg=k)
    logits = model.predict(x)
    assert logits.shape == (g.input_shape[0], g.num_classes)


@SETTINGS
@given(samples=st.integers(0, 5), poison=st.sampled_from([None, np.nan, np.inf]),
       labels=st.sampled_from(["good", "short", "float", "strings", "none"]))
def test_predict_and_evaluate_fail_clearly_or_match_the_reference(samples, poison, labels):
    g = Graph((2, 1, 4, 4), 3)
    g.softmax_loss(g.linear(g.flatten(g.maxpool(g.relu(g.conv2d(g.input(), 2, 3, padding=1)), 2)), 3))
    model = Model(g, device="host", seed=1)
    rng = np.random.default_rng(samples)
    x = rng.standard_normal((samples, 1, 4, 4)).astype(np.float32)
    if poison is not None and samples:
        x[-1, 0, 1, 1] = poison
    y = {"good": rng.integers(0, 3, samples), "short": np.zeros(max(samples - 1, 0), int),
         "float": rng.integers(0, 3, samples) + 0.25, "strings": np.array(["1"] * samples),
         "none": None}[labels]
    logits = model.predict(x)
    assert logits.shape == (samples, 3)
    for start in range(0, samples, 2):  # each batch of 2 (padded), as the reference computes it
        chunk = np.zeros((2, 1, 4, 4), np.float32)
        chunk[:len(x[start:start + 2])] = x[start:start + 2]
        *_, (_, ref) = anomaly.forward_outputs(g, model.params, chunk, train=False)
        np.testing.assert_array_equal(logits[start:start + 2], ref[:len(x[start:start + 2])])
    try:
        acc = model.evaluate(x, y)
    except Exception as e:  # noqa: BLE001
        _clear(e)
        return
    assert (poison is None or samples == 0) and (labels == "good" or samples == 0 and labels != "none")
    assert samples == 0 or acc == np.mean(logits.argmax(axis=1) == y)  # the share of right answers


def test_the_fuzz_strategies_reach_both_outcomes():
    """Guard against a property that holds vacuously: the graph strategy builds valid graphs and bad ones."""
    outcomes = set()

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(layers=st.lists(layer(), max_size=3))
    def probe(layers):
        try:
            build((2, 2, 6, 6), 3, layers, True)
            outcomes.add("built")
        except ValueError:
            outcomes.add("refused")

    probe()
    assert outcomes == {"built", "refused"}


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
