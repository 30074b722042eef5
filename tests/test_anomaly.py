"""snlite.anomaly: the host re-run that names where a NaN or an infinity first appeared."""
import numpy as np
import pytest

from snlite import anomaly
from snlite.config import MemoryConfig
from snlite.graph import Graph
from snlite.train import Model


def net(n=4):
    """Every layer whose forward the re-run must reproduce, dropout included (its mask depends on
    the seed, the iteration and the layer's index)."""
    g = Graph((n, 2, 6, 6), 3)
    x = g.input()
    c1 = g.conv2d(x, 3, 3, padding=1, name="conv1")
    a = g.relu(g.batchnorm(c1, name="bn1"), name="relu1")
    s = g.lrn(g.add(a, g.conv2d(c1, 3, 1, name="conv2"), name="add1"), size=3, name="lrn1")
    p = g.avgpool(g.maxpool(g.concat([s, c1], name="cat1"), 2, stride=1, name="pool1"), 2, name="pool2")
    g.softmax_loss(g.linear(g.dropout(g.flatten(p, name="flat1"), p=0.4, name="drop1"), 3, name="fc1"))
    return g


@pytest.mark.parametrize("config", [MemoryConfig(), MemoryConfig.superneurons()],
                         ids=["baseline", "superneurons"])
def test_the_rerun_reproduces_the_training_loss_bit_for_bit(config):
    """On the host device the re-run computes exactly what the runtime computed (same references, same
    dropout masks at every iteration): a finding is about the step that failed, not another one."""
    g = net()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(g.input_shape).astype(np.float32)
    labels = rng.integers(0, 3, g.input_shape[0])
    model = Model(g, config, device="host", seed=11)
    for _ in range(3):
        params, iteration = model.params, model.iteration
        loss = model.step(x, labels, lr=0.1, momentum=0.9)
        *_, (name, rerun) = anomaly.forward_outputs(g, params, x, labels, iteration=iteration, seed=11)
        assert name == "softmax" and rerun[0] == np.float32(loss)


def test_inference_rerun_gives_predicts_logits():
    g = net()
    model = Model(g, device="host", seed=3)
    x = np.random.default_rng(1).standard_normal(g.input_shape).astype(np.float32)
    model.step(x, [0, 1, 2, 0])
    *_, (name, logits) = anomaly.forward_outputs(g, model.params, x, train=False)
    assert name == "fc1"
    np.testing.assert_array_equal(logits, model.predict(x))


def test_first_nonfinite_names_the_batch_the_weights_or_the_layer():
    g = net(n=2)
    model = Model(g, device="host")
    params, x = model.params, np.ones(g.input_shape, np.float32)
    labels = [0, 1]
    assert anomaly.first_nonfinite(g, params, x, labels) is None
    bad_x = x.copy()
    bad_x[1, 1, 5, 5] = np.inf
    assert anomaly.first_nonfinite(g, params, bad_x, labels) == \
        "the input batch: it has 1 +inf of 144 values (the first at (1, 1, 5, 5): inf)"
    bad = dict(params, **{"conv2.weight": np.full((3, 3, 1, 1), np.nan, np.float32)})
    assert anomaly.first_nonfinite(g, bad, x, labels).startswith(
        "the parameters of layer 'conv2' (conv2d): conv2.weight has 9 NaN of 9 values "
        "(the first at (0, 0, 0, 0): nan), before this step ran")
    huge = dict(params, **{"fc1.weight": np.full((3, 24), 3e38, np.float32)})
    assert anomaly.first_nonfinite(g, huge, x, labels).startswith("layer 'fc1' (linear, forward step ")
    # running statistics matter in inference only
    stats = dict(params, **{"bn1.running_var": np.array([1, np.nan, 1], np.float32)})
    assert anomaly.first_nonfinite(g, stats, x, labels) is None
    assert "bn1.running_var has 1 NaN" in anomaly.first_nonfinite(g, stats, x, train=False)


def test_describe():
    assert anomaly.describe(np.zeros(3)) is None
    assert anomaly.describe(np.array([[1, np.nan], [-np.inf, np.nan]])) == \
        "2 NaN and 1 -inf of 4 values (the first at (0, 1): nan)"


def test_the_rerun_leaves_the_parameters_alone():
    g = net(n=2)
    params = Model(g, device="host").params
    copy = {k: v.copy() for k, v in params.items()}
    list(anomaly.forward_outputs(g, params, np.ones(g.input_shape, np.float32), [0, 1]))
    for k in params:
        np.testing.assert_array_equal(params[k], copy[k])
