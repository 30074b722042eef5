"""The graph builder: shapes, names, errors, and the steps' reads and writes."""
import pytest

from snlite.graph import Graph
from snlite.layers import LAYER_TYPES, ReLU
from snlite.workspace import CONV_OPS, candidates


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
    assert [n for n in t if n.startswith("drop1")] == ["drop1", "drop1.grad"], "dropout saves no mask"
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
    assert set(drop_b.reads) == {"drop1.grad"} and drop_b.inplace == ()  # dy only; a separate dx, as cuDNN's
    assert steps[("drop1", "forward")].writes == ("drop1",)  # no mask is saved
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
    assert {n for n, l in g.layers.items() if l.checkpoint} == \
        {"data", "conv1", "conv2", "add1", "cat1", "fc1",
                                                                 "softmax"}


@pytest.mark.parametrize("build,match", [
    (lambda g, x: g.conv2d(x, 4, 9), r"conv2d 'conv1'.*kernel"),
    (lambda g, x: g.add(g.conv2d(x, 4, 3), g.conv2d(x, 5, 3)),
     r"add 'add1': input 0 has shape \(2, 4, 6, 6\) but input 1 has shape \(2, 5, 6, 6\)"),
    (lambda g, x: g.concat([g.conv2d(x, 4, 3), x]), r"concat 'concat1': inputs must agree in N, H, W"),
    (lambda g, x: g._add("conv3d", [x], None), r"unknown layer type 'conv3d'"),
    (lambda g, x: g.softmax_loss(g.linear(g.flatten(x), 7)),
     r"7 classes but the graph was built with num_classes=4"),
    (lambda g, x: g.conv2d(x, 4, 3, name="data"), r"'data' is already used by a data layer: give this "
                                                  r"conv2d another name"),
    (lambda g, x: g.relu(x, name="a@b"), r"layer name 'a@b': a name is a non-empty string without '@', "),
    (lambda g, x: g.relu(x, name="r#r1"), r"layer name 'r#r1': .* without '@', '#' or ':'"),
    (lambda g, x: g.relu(x, name="data:in"), r"layer name 'data:in': .* without '@', '#' or ':'"),
    (lambda g, x: g.add(x, x), r"same tensor appears twice"),
    (lambda g, x: g.dropout(x, p=1.0), r"p must be in \[0, 1\)"),
])
def test_errors_name_the_layer_and_shapes(build, match):
    g = Graph((2, 3, 8, 8), 4)
    with pytest.raises(ValueError, match=match):
        build(g, g.input())


def test_a_read_no_step_writes_fails_loudly(monkeypatch):
    class Forgetful(ReLU):  # its backward reads a saved tensor its forward does not declare writing
        kind = "forgetful"
        bwd_reads = ("x", "dy", "mask")

        def saved(self):
            return {"mask": ((2, 4), "float32")}

    monkeypatch.setitem(LAYER_TYPES, "forgetful", Forgetful)
    g = Graph((2, 4), 4)
    g.softmax_loss(g.linear(g._add("forgetful", [g.input()], None), 4))
    with pytest.raises(AssertionError, match=r"step 6 \(forgetful1 backward\) reads \['forgetful1.mask'\] "
                       "before any step writes them: the forgetful layer's declarations are incomplete"):
        g.steps()


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


@pytest.mark.parametrize("build,match", [
    (lambda g, x: g.conv2d(x, 4.5, 3), r"conv2d: out_channels must be an integer >= 1, got 4.5"),
    (lambda g, x: g.conv2d(x, 4.0, 3), r"out_channels must be an integer"),
    (lambda g, x: g.conv2d(x, True, 3), r"out_channels must be an integer"),
    (lambda g, x: g.conv2d(x, "4", 3), r"out_channels must be an integer"),
    (lambda g, x: g.conv2d(x, 4, 2.5), r"conv2d: kernel must be an integer >= 1 or a pair of them, got 2.5"),
    (lambda g, x: g.conv2d(x, 4, (3, 3, 3)), r"kernel must be an integer"),
    (lambda g, x: g.conv2d(x, 4, 3, padding=-1), r"padding must be an integer >= 0"),
    (lambda g, x: g.linear(g.flatten(x), 2.0), r"linear: out_features must be an integer"),
    (lambda g, x: g.maxpool(x, 2, stride=0), r"maxpool: stride must be an integer >= 1"),
    (lambda g, x: g.avgpool(x, 2, name="p", padding=1.5), r"avgpool 'p': padding must be an integer >= 0"),
    (lambda g, x: g.lrn(x, size=2.5), r"lrn: size must be an integer"),
    (lambda g, x: g.lrn(x, size=17), r"lrn: size must be at most 16"),
    (lambda g, x: g.lrn(x, k=0), r"lrn: k must be a finite number > 0"),
    (lambda g, x: g.batchnorm(x, momentum=float("nan")), r"batchnorm: momentum must be in \[0, 1\], got nan"),
    (lambda g, x: g.batchnorm(x, eps="1e-5"), r"batchnorm: eps must be a finite number >= 0, got '1e-5'"),
    (lambda g, x: g.dropout(x, p="0.5"), r"dropout: p must be in \[0, 1\), got '0.5'"),
    (lambda g, x: g.concat(x), r"concat: expected a list of nodes"),
])
def test_arguments_have_pytorchs_types(build, match):
    """Integer sizes are integers (a float is refused, never truncated: conv2d(x, 4.5, 3) used to make
    4 channels), numbers are finite numbers, and every error is a ValueError naming the layer."""
    g = Graph((2, 3, 8, 8), 4)
    with pytest.raises(ValueError, match=match):
        build(g, g.input())


@pytest.mark.parametrize("args,match", [
    (((2, 3.5, 8, 8), 4), r"input_shape must be .* of positive integers, got \(2, 3.5, 8, 8\)"),
    (((2, 3, 8), 4), r"input_shape must be"),
    ((5, 4), r"input_shape must be"),
    (((2, 3), 2.5), r"num_classes must be an integer >= 2, got 2.5"),
    (((2, 3), 1), r"num_classes must be an integer >= 2, got 1"),
])
def test_graph_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        Graph(*args)


def test_input_ranks_are_pytorchs():
    """Linear takes (N, features), as PyTorch's does (no implicit flattening: the error says to add a
    flatten); LRN needs (N, C, ...) with 3 dimensions or more; conv and pooling need 4; batch and layer
    normalization take either, as PyTorch's BatchNorm1d and LayerNorm(features) do (N, features)."""
    g = Graph((2, 3, 4, 4), 4)
    x = g.input()
    with pytest.raises(ValueError, match=r"linear 'fc': expected an \(N, in_features\) input, got shape "
                                         r"\(2, 3, 4, 4\); flatten it first: "
                                         r"g.linear\(g.flatten\(x\), ...\)"):
        g.linear(x, 4, name="fc")
    assert g.linear(g.flatten(x), 4).shape == (2, 4)
    g = Graph((2, 6), 4)
    x = g.input()
    for build, match in ((lambda: g.lrn(x),
                          r"lrn 'lrn1': expected an \(N, C, H, W\) input .* got shape \(2, 6\)"),
                         (lambda: g.conv2d(x, 4, 1), r"conv2d 'conv1': expected an \(N, C, H, W\) input"),
                         (lambda: g.maxpool(x, 1),
                          r"maxpool 'maxpool1'.*expected x of shape \(N, C, H, W\)")):
        with pytest.raises(ValueError, match=match):
            build()
    assert g.relu(g.linear(x, 5)).shape == (2, 5)
    assert g.batchnorm(x).shape == g.layernorm(x).shape == (2, 6)
    assert g.layers["ln1"].saved()["save_rstd"] == ((2, 1, 1), "float32")
    h = Graph((1, 6), 4)
    with pytest.raises(ValueError, match=r"batchnorm 'bn': training needs more than 1 value per channel"):
        h.batchnorm(h.input(), name="bn")


# ---------------------------------------------------------------- groups, ReLU6, ceil mode
def test_grouped_conv_weights_params_and_flops_are_pytorchs():
    g = Graph((2, 8, 6, 6), 4)
    x = g.input()
    d = g.conv2d(x, 8, 3, padding=1, groups=8, bias=False, name="dw")  # depthwise
    y = g.conv2d(d, 4, 1, groups=2, name="pw")  # two groups of 4 inputs and 2 outputs
    g.softmax_loss(g.linear(g.flatten(g.relu6(y)), 4, name="fc"))
    t = g.tensors()
    assert t["dw.weight"].shape == (8, 1, 3, 3) and t["pw.weight"].shape == (4, 4, 1, 1)
    assert g.param_count() == 8 * 9 + (4 * 4 + 4) + (4 * 144 + 4)
    assert g.layers["dw"].flops() == 2 * (2 * 8 * 36) * 9 and g.layers["pw"].flops() == 2 * (2 * 4 * 36) * 4
    assert g.layers["relu6_1"].kind == "relu6" and not g.layers["relu6_1"].checkpoint  # cheap: recomputed
    relu6_b = next(s for s in g.steps() if s.layer == "relu6_1" and s.phase == "backward")
    assert relu6_b.inplace == (("pw.grad", "flatten1.grad"),)  # dx written into dy's buffer, as ReLU's
    plain = Graph((2, 8, 6, 6), 4)
    c = plain.conv2d(plain.input(), 8, 3)
    assert "groups" not in plain.layers[c.name].attrs  # groups=1 leaves a plain conv as it always was
    for op in CONV_OPS:  # im2col runs groups=1 only: the chooser offers a grouped conv direct alone
        assert {ch.algo for ch in candidates(g.layers["dw"], op)} == {"direct"}
        assert {ch.algo for ch in candidates(plain.layers[c.name], op)} == {"direct", "im2col"}


def test_ceil_mode_pooling_shapes_and_attributes():
    g = Graph((2, 3, 112, 112), 4)
    x = g.input()
    p = g.maxpool(x, 3, 2, ceil_mode=True, name="pool1")
    q = g.avgpool(x, 3, 2, ceil_mode=True, name="pool2")
    f = g.maxpool(x, 3, 2, name="pool3")
    assert p.shape == q.shape == (2, 3, 56, 56) and f.shape == (2, 3, 55, 55)  # GoogLeNet's first pool
    assert "ceil_mode" not in g.layers["pool3"].attrs  # floor mode leaves a pool as it always was


@pytest.mark.parametrize("build,match", [
    (lambda g, x: g.conv2d(x, 4, 3, groups=2),
     r"conv2d 'conv1': in_channels \(3\) must be divisible by groups \(2\)"),
    (lambda g, x: g.conv2d(g.conv2d(x, 4, 1), 6, 3, groups=4),
     r"out_channels \(6\) must be divisible by groups"),
    (lambda g, x: g.conv2d(x, 3, 3, groups=0), r"conv2d: groups must be an integer >= 1, got 0"),
    (lambda g, x: g.conv2d(x, 3, 3, groups=1.0), r"conv2d: groups must be an integer >= 1"),
    (lambda g, x: g.maxpool(x, 2, ceil_mode="yes"), r"maxpool: ceil_mode must be True or False"),
])
def test_group_and_ceil_mode_errors_name_the_layer(build, match):
    g = Graph((2, 3, 8, 8), 4)
    with pytest.raises(ValueError, match=match):
        build(g, g.input())


def test_narrow_and_channel_shuffle_refuse_what_does_not_fit_when_built():
    g = Graph(input_shape=(2, 6, 4, 4), num_classes=2)
    x = g.input()
    with pytest.raises(ValueError, match=r"narrow 'n': channels \[4, 8\) of an \(N, C, H, W\) input, got "
                                         r"\(2, 6, 4, 4\)"):
        g.narrow(x, 4, 4, name="n")
    with pytest.raises(ValueError, match="narrow: start must be an integer >= 0, got -1"):
        g.narrow(x, -1, 2)
    with pytest.raises(ValueError, match=r"channel_shuffle 's': 4 groups must divide the channels"):
        g.channel_shuffle(x, 4, name="s")
    assert g.channel_shuffle(g.narrow(x, 2, 4), 2).shape == (2, 4, 4, 4)


def test_convnexts_layers_declare_what_they_read_and_are_cheap():
    """A layer norm over channels saves each pixel's mean and 1 / std (N, H, W) and its backward reads
    them; a Linear over channels is a 1x1 conv whose weight is stored as the Linear's (out, in); the
    layer scale's parameter, named as asked, is read by its backward (its gradient is dy * x summed);
    norms, the scale and the GELU are dropped and recomputed, the convs kept."""
    import sys
    from pathlib import Path

    from snlite.config import MemoryConfig
    from snlite.scheduler import Scheduler

    sys.path.insert(0, str(Path(__file__).parent))
    from nets import convnext_net

    g = convnext_net(n=2, hw=4)
    t, steps = g.tensors(), {(s.layer, s.phase): s for s in g.steps()}
    assert t["block.ln.save_rstd"].shape == (2, 4, 4) and t["block.fc1.weight"].shape == (16, 4)
    assert t["block.layer_scale"].shape == (4, 1, 1) and g.layers["block.fc1"].flops() == 2 * 2 * 16 * 4 * 16
    assert set(steps["block.ln", "backward"].reads) == {"block.dw", "block.ln.grad", "block.ln.save_mean",
                                                        "block.ln.save_rstd", "block.ln.weight"}
    assert set(steps["block", "backward"].reads) == {"block.fc2", "block.grad", "block.layer_scale"}
    plan = Scheduler(g, MemoryConfig(liveness=True, recompute="memory")).plan()
    dropped = set(plan.recompute.dropped)
    assert {"stem.ln", "stem.elu", "stem.celu", "block.ln", "block.act", "block.drop", "block", "head.ln",
            "head.bn", "head.mish", "head.softplus", "head.selu"} <= dropped
    assert not {"stem", "block.dw", "block.fc1", "block.fc2", "block.add", "fc0", "fc1"} & dropped


@pytest.mark.parametrize("build, match", [
    (lambda g, x: g.layernorm(x, eps=-1e-6, name="ln"), r"layernorm 'ln': eps"),
    (lambda g, x: g.layer_scale(x, param="bias", name="ls"), r"layer_scale 'ls': param must name the "
                                                              r"parameter .* got 'bias'"),
    (lambda g, x: g.layer_scale(x, param="my scale", name="ls"), r"got 'my scale'"),
    (lambda g, x: g.layer_scale(x, init=float("nan"), name="ls"), r"layer_scale 'ls': init"),
    (lambda g, x: g.pointwise_linear(x, 0, name="fc"), r"conv2d 'fc': out_features"),
    (lambda g, x: g.celu(x, 0, name="act"), r"celu 'act': alpha must not be 0"),
    (lambda g, x: g.dropout2d(g.flatten(x), name="drop"), r"dropout2d 'drop': expected an \(N, C, H, W\) "
                                                          r"input .* use g.dropout"),
    (lambda g, x: g.dropout2d(x, p=1.0, name="drop"), r"dropout2d 'drop': p"),
    (lambda g, x: g.softplus(x, beta=0, name="act"), r"softplus 'act': beta must not be 0"),
    (lambda g, x: g.softplus(x, threshold=float("inf"), name="act"), r"softplus 'act': threshold"),
    (lambda g, x: g.elu(x, alpha="1", name="act"), r"elu 'act': alpha"),
    (lambda g, x: g.pointwise_linear(g.flatten(x), 4, name="fc"),
     r"conv2d 'fc': pointwise_linear takes an \(N, C, H, W\) input, got \(2, 48\); .*g.linear"),
])
def test_convnext_layer_errors_name_the_layer(build, match):
    g = Graph(input_shape=(2, 3, 4, 4), num_classes=2)
    with pytest.raises(ValueError, match=match):
        build(g, g.input())


def test_vits_layers_declare_what_they_read_and_name_their_parameters_as_pytorch():
    """Tokens (N, D, T, 1): the class token adds one, named as the model's own parameter; the position
    embedding is (1, T, D) and passes its gradient through dy's buffer; self-attention is three layers,
    the in-projection's weights named as MultiheadAttention's, the attention saving one log-sum-exp per
    head and token (no T x T matrix) and its backward reading q, k, v, its output and that; attention is
    a checkpoint, the token layers are dropped and recomputed."""
    import sys
    from pathlib import Path

    from snlite.config import MemoryConfig
    from snlite.scheduler import Scheduler

    sys.path.insert(0, str(Path(__file__).parent))
    from nets import vit_net

    g = vit_net(n=2, hw=4)  # 4x4 patches: 16 tokens, 17 with the class token, of 4 features
    t, steps = g.tensors(), {(s.layer, s.phase): s for s in g.steps()}
    assert g.layers["cat"].out_shape == (2, 4, 17, 1) and t["class_token"].shape == (1, 1, 4)
    assert t["encoder.pos_embedding"].shape == (1, 17, 4)
    mha = "block.self_attention"
    assert t[f"{mha}.in_proj_weight"].shape == (12, 4) and t[f"{mha}.in_proj_bias"].shape == (12,)
    assert t[f"{mha}.out_proj.weight"].shape == (4, 4) and f"{mha}.in_proj.weight" not in t
    assert t[f"{mha}.attention.lse"].shape == (2, 2, 17)
    assert set(steps[f"{mha}.attention", "backward"].reads) == {
        f"{mha}.in_proj", f"{mha}.attention", f"{mha}.attention.grad", f"{mha}.attention.lse"}
    assert set(steps[f"{mha}.in_proj", "backward"].reads) == {"block.ln_1", f"{mha}.in_proj.grad",
                                                              f"{mha}.in_proj_weight"}  # not the bias
    pos = steps["encoder", "backward"]
    assert pos.inplace == (("cat.grad", "encoder.grad@block.ln_1"),)  # the first of its two consumers
    assert "encoder.pos_embedding.grad" in pos.writes
    assert g.layers[f"{mha}.attention"].flops() == 4 * 2 * 17 * 17 * 4
    plan = Scheduler(g, MemoryConfig(liveness=True, recompute="memory")).plan()
    dropped = set(plan.recompute.dropped)
    assert {"cat", "encoder", "block.ln_1", "encoder.ln", "token_select1"} <= dropped
    assert not {f"{mha}.in_proj", f"{mha}.attention", f"{mha}.out_proj", "block.add"} & dropped


@pytest.mark.parametrize("build, match", [
    (lambda g, x: g.multihead_attention(x, 3, name="mha"), r"multihead_attention 'mha': heads=3 must divide "
                                                           r"the 4 features"),
    (lambda g, x: g.multihead_attention(g.flatten(x), 2, name="mha"), r"multihead_attention 'mha': expected "
                                                                      r"tokens"),
    (lambda g, x: g.attention(x, 1, name="att"), r"attention 'att': the input holds q, k and v, 3 \* D "
                                                 r"channels .* got 4 channels"),
    (lambda g, x: g.attention(g.conv2d(x, 12, 1), 0, name="att"), r"attention 'att': heads"),
    (lambda g, x: g.class_token(x, param="", name="cat"),
     r"class_token 'cat': param must name the parameter"),
    (lambda g, x: g.position_embedding(x, param=3, name="pos"), r"position_embedding 'pos': param must name"),
    (lambda g, x: g.token_select(x, 16, name="sel"),
     r"token_select 'sel': index 16 is outside the 16 tokens"),
    (lambda g, x: g.token_select(x, 0.5, name="sel"), r"token_select 'sel': index must be an integer"),
    (lambda g, x: g.token_select(g.flatten(x), name="sel"), r"token_select 'sel': expected tokens"),
])
def test_vit_layer_errors_name_the_layer(build, match):
    g = Graph(input_shape=(2, 3, 8, 8), num_classes=2)
    with pytest.raises(ValueError, match=match):
        build(g, g.conv2d(g.input(), 4, 2, stride=2))  # 4 features, 4x4 = 16 tokens


def test_swins_layers_declare_what_they_read_and_name_their_parameters_as_pytorch():
    """Window attention is three layers named as torchvision's modules (qkv, the attention holding the
    relative position bias table, proj); it saves one log-sum-exp per head and pixel and its backward
    reads the table; patch merging makes 4C channels of each 2x2 block; attention is a checkpoint, the
    patch merging and the layer norms are recomputed."""
    import sys
    from pathlib import Path

    from snlite.config import MemoryConfig
    from snlite.scheduler import Scheduler

    sys.path.insert(0, str(Path(__file__).parent))
    from nets import swin_net

    g = swin_net(n=2, hw=4)
    t, steps = g.tensors(), {(s.layer, s.phase): s for s in g.steps()}
    attn = "features.1.1.attn"
    assert t[f"{attn}.qkv.weight"].shape == (12, 4) and t[f"{attn}.proj.bias"].shape == (4,)
    assert t[f"{attn}.relative_position_bias_table"].shape == (9, 2)
    assert t[f"{attn}.lse"].shape == (2, 2, 4, 4)
    assert g.layers[attn].attrs["shift"] == (1, 1) and g.layers["features.2.merge"].out_shape == (2, 16, 2, 2)
    assert set(steps[attn, "backward"].reads) == {f"{attn}.qkv", attn, f"{attn}.grad", f"{attn}.lse",
                                                 f"{attn}.relative_position_bias_table"}
    assert g.layers[attn].flops() == 4 * 2 * 4 * 4 * 4 * 4
    plan = Scheduler(g, MemoryConfig(liveness=True, recompute="memory")).plan()
    dropped = set(plan.recompute.dropped)
    assert {"features.2.merge", "features.1.1.norm1", "features.2.norm"} <= dropped
    assert not {attn, f"{attn}.qkv", f"{attn}.proj", "features.1.1.add"} & dropped


@pytest.mark.parametrize("build, match", [
    (lambda g, x: g.swin_attention(x, 3, 2, name="a"),
     r"window_attention 'a': expected q, k and v .* heads=3"),
    (lambda g, x: g.swin_attention(x, 2, 3, name="a"),
     r"window_attention 'a': windows of 3x3 do not tile the 4x4 map"),
    (lambda g, x: g.swin_attention(x, 2, 2, shift=2, name="a"),
     r"window_attention 'a': shift \(2, 2\) must be smaller than the window"),
    (lambda g, x: g.swin_attention(x, 2, 4, shift=1, name="a"), r"0 where the window covers the 4x4 map"),
    (lambda g, x: g.window_attention(x, 2, 0, name="w"), r"window_attention 'w': window"),
    (lambda g, x: g.patch_merge(g.conv2d(x, 4, 2, stride=1), name="m"),
     r"patch_merge 'm': expected an \(N, C, H, W\) map with even H and W"),
])
def test_swin_layer_errors_name_the_layer(build, match):
    g = Graph(input_shape=(2, 3, 8, 8), num_classes=2)
    with pytest.raises(ValueError, match=match):
        build(g, g.conv2d(g.input(), 4, 2, stride=2))  # 4 channels, a 4x4 map


def test_a_layer_named_like_a_weights_momentum_is_refused():
    """``c1.weight.momentum`` as a layer's name would be its output's, and SGD's momentum buffer of
    c1's weight: the plan counted one tensor for two (a lower peak) without a word."""
    g = Graph((2, 1, 8, 8), 3)
    x = g.conv2d(g.input(), 4, 3, name="c1")
    x = g.relu(x, name="c1.weight.momentum")
    g.softmax_loss(g.linear(g.flatten(x), 3))
    with pytest.raises(ValueError, match=r"a tensor of the graph is named 'c1.weight.momentum', the name of "
                                         r"SGD's momentum buffer for c1.weight: rename that layer"):
        g.steps()
