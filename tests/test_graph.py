"""The graph builder: shapes, names, errors, and the steps' reads and writes."""
import pytest

from snlite.graph import Graph


def small_net(n=2):
    """A net with a fork (conv1 read by two branches), a residual add, a concat, BN, LRN and dropout."""
    g = Graph(input_shape=(n, 3, 8, 8), num_classes=4)
    x = g.input()
    c1 = g.conv2d(x, 4, 3, padding=1, name="conv1")
    a = g.relu(g.batchnorm(c1, name="bn1"), name="relu1")
    b = g.conv2d(c1, 4, 1, name="conv2")
    s = g.add(a, b, name="add1")
    l = g.lrn(s, size=3, name="lrn1")
    cat = g.concat([l, c1], name="cat1")
    p = g.maxpool(cat, 2, name="pool1")
    d = g.dropout(g.flatten(p, name="flat1"), p=0.25, name="drop1")
    g.softmax_loss(g.linear(d, 4, name="fc1"))
    return g


def test_shapes_and_param_names():
    g = small_net()
    assert g.layers["cat1"].out_shape == (2, 8, 8, 8)
    assert g.layers["pool1"].out_shape == (2, 8, 4, 4)
    assert g.layers["flat1"].out_shape == (2, 128)
    t = g.tensors()
    assert t["conv1.weight"].shape == (4, 3, 3, 3) and t["conv1.bias"].shape == (4,)
    assert t["bn1.running_mean"].kind == "buffer" and t["bn1.weight"].kind == "weight"
    assert t["fc1.weight"].shape == (4, 128)
    assert t["drop1.mask"].dtype == "uint8"
    assert g.param_count() == (4 * 27 + 4) + 8 + (16 + 4) + (4 * 128 + 4)


def test_default_names_are_unique_and_pytorch_like():
    g = Graph((1, 1, 4, 4), 2)
    x = g.input()
    a = g.conv2d(x, 2, 3)
    b = g.conv2d(a, 2, 1)
    assert (a.name, b.name) == ("conv1", "conv2")
    assert g.relu(b).name == "relu1" and g.batchnorm(b).name == "bn1"


def test_fork_gradients_are_one_per_consumer_and_summed_in_backward():
    g = small_net()
    assert g.output_grads("conv1") == ["conv1.grad@bn1", "conv1.grad@conv2", "conv1.grad@cat1"]
    step = next(s for s in g.steps() if s.layer == "conv1" and s.phase == "backward")
    assert step.accumulate == ("conv1.grad@conv2", "conv1.grad@cat1")
    assert set(g.output_grads("conv1")) <= set(step.reads)
    assert "data" in step.reads and "data.grad" in step.writes and "conv1.weight.grad" in step.writes


def test_cudnn_conventions_in_step_declarations():
    steps = {(s.layer, s.phase): s for s in small_net().steps()}
    relu_b = steps[("relu1", "backward")]
    assert set(relu_b.reads) == {"bn1", "relu1", "relu1.grad"}  # x, y, dy
    assert relu_b.inplace == (("bn1.grad", "relu1.grad"),)  # dx into dy's buffer
    assert steps[("relu1", "forward")].inplace == ()  # forward not in place
    conv_b = steps[("conv2", "backward")]
    assert set(conv_b.reads) == {"conv1", "conv2.grad", "conv2.weight"}  # x, dy and the weight; not the bias
    assert set(conv_b.writes) == {"conv1.grad@conv2", "conv2.weight.grad", "conv2.bias.grad"}
    pool_b = steps[("pool1", "backward")]
    assert set(pool_b.reads) == {"cat1", "pool1", "flat1.grad"}  # x, y, dy (flatten's gradient is pool1's)
    assert small_net().output_grads("pool1") == ["flat1.grad"]
    drop_b = steps[("drop1", "backward")]
    assert set(drop_b.reads) == {"drop1.grad", "drop1.mask"}
    sm_b = steps[("softmax", "backward")]
    assert sm_b.inplace == (("fc1.grad", "softmax"),)
    # flatten does nothing: its output is pool1's storage, its input gradient is its output gradient
    assert g_out(small_net(), "flat1") == "pool1"


def g_out(g, name):
    return g.output_tensor(name)


def test_route_has_two_steps_per_layer_and_checkpoints():
    g = small_net()
    steps = g.steps()
    assert len(steps) == 2 * len(g.layers)
    assert [s.index for s in steps] == list(range(len(steps)))
    fwd, bwd = g.route()
    assert fwd[0] == "data" and fwd[-1] == "softmax" and bwd[0] == "softmax" and bwd[-1] == "data"
    assert {n for n, l in g.layers.items() if l.checkpoint} == {"data", "conv1", "conv2", "add1", "cat1", "fc1",
                                                                 "softmax"}


@pytest.mark.parametrize("build,match", [
    (lambda g, x: g.conv2d(x, 4, 9), r"conv2d 'conv1'.*kernel"),
    (lambda g, x: g.add(g.conv2d(x, 4, 3), g.conv2d(x, 5, 3)), r"add 'add1': input 0 has shape \(2, 4, 6, 6\) "
                                                                r"but input 1 has shape \(2, 5, 6, 6\)"),
    (lambda g, x: g.concat([g.conv2d(x, 4, 3), x]), r"concat 'concat1': inputs must agree in N, H, W"),
    (lambda g, x: g._add("conv3d", [x], None), r"unknown layer type 'conv3d'"),
    (lambda g, x: g.softmax_loss(g.linear(x, 7)), r"7 classes but the graph was built with num_classes=4"),
    (lambda g, x: g.conv2d(x, 4, 3, name="data"), r"'data' .* already used"),
    (lambda g, x: g.add(x, x), r"same tensor appears twice"),
    (lambda g, x: g.dropout(x, p=1.0), r"p must be in \[0, 1\)"),
])
def test_errors_name_the_layer_and_shapes(build, match):
    g = Graph((2, 3, 8, 8), 4)
    with pytest.raises(ValueError, match=match):
        build(g, g.input())


def test_graph_without_loss_or_after_loss():
    g = Graph((2, 3), 4)
    y = g.linear(g.input(), 4)
    with pytest.raises(ValueError, match="no softmax_loss"):
        g.steps()
    g.softmax_loss(y)
    with pytest.raises(ValueError, match="after softmax_loss"):
        g.relu(y)


def test_summary_lists_every_layer():
    g = small_net()
    text = g.summary()
    for name in g.layers:
        assert name in text
    assert f"{g.param_count():,d} parameters" in text
