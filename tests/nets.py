"""Small networks, data and helpers shared by the memory tests."""
import itertools

import numpy as np

from snlite.config import MemoryConfig
from snlite.graph import Graph
from snlite.train import Model

FLAGS = dict(liveness=(False, True), offload=(False, True), cache=(False, True),
             update_in_backward=(False, True), recompute=("off", "speed", "memory", "cost_aware"),
             workspace=("none", "fastest", "dynamic"))
# every combination of the switches; the momentum waits on the host in every other one (workspace, the
# last switch, has three values, so each combination of the others sees both places)
ALL_CONFIGS = [MemoryConfig(**dict(zip(FLAGS, values)), optimizer_state=("device", "host")[i % 2])
               for i, values in enumerate(itertools.product(*FLAGS.values()))]


def mixed_net(n=2, hw=6):
    """A fork, a residual add, a concat, BN, LRN, dropout, and a chain of convs so offload has work."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="mixed")
    x = g.input()
    c1 = g.conv2d(x, 3, 3, padding=1, name="conv1")
    a = g.relu(g.batchnorm(c1, name="bn1"), name="relu1")
    c2 = g.conv2d(a, 3, 3, padding=1, name="conv2")
    b = g.conv2d(c1, 3, 1, bias=False, name="conv3")
    s = g.lrn(g.add(g.relu(c2, name="relu2"), b, name="add1"), size=3, alpha=0.5, name="lrn1")
    cat = g.concat([s, c1], name="cat1")
    c4 = g.conv2d(g.maxpool(cat, 2, name="pool1"), 4, 3, padding=1, name="conv4")
    y = g.dropout(g.flatten(g.relu(c4, name="relu4"), name="flat1"), p=0.3, name="drop1")
    g.softmax_loss(g.linear(y, 3, name="fc1"))
    return g


def grouped_net(n=2, hw=6):
    """The layers torchvision's MobileNet-V2, ResNeXt, SqueezeNet and GoogLeNet add, in small: a
    depthwise conv (stride 2), ReLU6, 1x1 and 3x3 convs of two groups into an add, and a ceil-mode
    max pooling whose last window runs off the end (3x3 -> 2x2)."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="grouped")
    x = g.relu6(g.batchnorm(g.conv2d(g.input(), 4, 3, padding=1, name="conv1"), name="bn1"), name="relu6_1")
    d = g.relu6(g.conv2d(x, 4, 3, stride=2, padding=1, groups=4, bias=False, name="dw1"), name="relu6_2")
    y = g.add(g.conv2d(d, 6, 1, groups=2, name="pw1"), g.conv2d(d, 6, 3, padding=1, groups=2, name="gc1"),
              name="add1")
    y = g.maxpool(g.relu6(y, name="relu6_3"), 2, ceil_mode=True, name="pool1")
    g.softmax_loss(g.linear(g.flatten(y), 3, name="fc1"))
    return g


def gated_net(n=2, hw=6):
    """The layers torchvision's MobileNet-V3, EfficientNet and RegNet-Y add, in small: Hardswish, two
    squeeze-and-excitation blocks (a global average pool, two 1x1 convs with a GELU or a LeakyReLU
    between, a Hardsigmoid or a Sigmoid gate that scales the block's input channel by channel; each input
    read twice, a fork), SiLU, a Hardswish read by a residual add, ShuffleNet's split of the channels in
    two (one half through a conv), their concat and channel shuffle (6 channels in 2 groups: its gradient
    is the shuffle in 3), and a Tanh."""
    def se(x, gate, name):
        s = g.avgpool(x, x.shape[2:], name=f"{name}.pool")
        inner = g.gelu if gate == g.hardsigmoid else g.leaky_relu
        s = inner(g.conv2d(s, 2, 1, name=f"{name}.fc1"), name=f"{name}.act")
        return g.channel_scale(x, gate(g.conv2d(s, x.shape[1], 1, name=f"{name}.fc2"), name=f"{name}.gate"),
                               name=f"{name}.scale")

    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="gated")
    x = g.hardswish(g.batchnorm(g.conv2d(g.input(), 4, 3, padding=1, name="conv1"), name="bn1"), name="hs1")
    y = g.silu(se(x, g.hardsigmoid, "se1"), name="silu1")
    y = g.add(g.hardswish(se(g.conv2d(y, 4, 3, padding=1, name="conv2"), g.sigmoid, "se2"), name="hs2"), x,
              name="add1")
    half = g.conv2d(g.narrow(y, 2, 2, name="split.b"), 4, 1, name="conv3")  # 6 channels: 2 groups of 3
    y = g.concat([g.narrow(y, 0, 2, name="split.a"), half], name="cat1")
    y = g.channel_shuffle(y, 2, name="shuffle1")
    g.softmax_loss(g.linear(g.flatten(g.maxpool(g.tanh(y, name="tanh1"), 2, name="pool1")), 3, name="fc1"))
    return g


def convnext_net(n=2, hw=4):
    """ConvNeXt's layers, in small, and the smooth activations of networks of one's own: a 2x2
    stride-2 stem, its layer norm over channels, an ELU and a CELU, then a block (a 3x3 depthwise
    conv, a layer norm, a Linear over each pixel's channels to 4C, a GELU, a Dropout2d, one back
    to C, the layer scale) added to its input, and an MLP's head (a global pool, a flatten, a
    layer norm over the features, a Linear without bias, a batch norm over the features
    (BatchNorm1d), a Mish, a Linear, a Softplus, a SELU, a Linear). ELU's alpha is 1, Softplus's
    threshold 20 and SELU's input positive: an ELU of another alpha and a SELU have a kink at 0,
    a Softplus of a low threshold a jump, which the central differences of tests/test_train.py
    would step across (a bias before a batch norm has a gradient of about 0: rounding noise,
    which host and simulator need not share)."""
    g = Graph(input_shape=(n, 3, 2 * hw, 2 * hw), num_classes=3, name="convnext")
    x = g.layernorm(g.conv2d(g.input(), 4, 2, stride=2, name="stem"), 1e-6, name="stem.ln")
    x = g.celu(g.elu(x, 1.0, name="stem.elu"), 0.5, name="stem.celu")
    y = g.layernorm(g.conv2d(x, 4, 3, padding=1, groups=4, name="block.dw"), 1e-6, name="block.ln")
    y = g.dropout2d(g.gelu(g.pointwise_linear(y, 16, name="block.fc1"), name="block.act"), 0.25,
                    name="block.drop")
    y = g.layer_scale(g.pointwise_linear(y, 4, name="block.fc2"), init=0.5, name="block")
    y = g.flatten(g.avgpool(g.add(y, x, name="block.add"), hw, name="pool"))
    y = g.batchnorm(g.linear(g.layernorm(y, 1e-6, name="head.ln"), 6, bias=False, name="fc0"), name="head.bn")
    y = g.softplus(g.linear(g.mish(y, name="head.mish"), 6, name="fc1"), 2.0, name="head.softplus")
    y = g.selu(y, name="head.selu")  # of a softplus: positive, away from SELU's kink at 0
    g.softmax_loss(g.linear(y, 3, name="fc"))
    return g


def vit_net(n=2, hw=4):
    """A vision transformer in small (torchvision's VisionTransformer): 2x2 patches of a 2hw x 2hw
    image, embedded to 4 features (hw*hw tokens), the class token put first, the position embedding
    added, one encoder block (a layer norm, self-attention in 2 heads between its projections, the
    residual sum, a layer norm, an MLP on each token: a Linear to 8, a GELU, a Linear back, the
    residual sum), the last layer norm, the class token read out, and the head."""
    g = Graph(input_shape=(n, 3, 2 * hw, 2 * hw), num_classes=3, name="vit")
    x = g.conv2d(g.input(), 4, 2, stride=2, name="conv_proj")
    x = g.position_embedding(g.class_token(x, name="cat"), name="encoder")
    y = g.multihead_attention(g.layernorm(x, 1e-6, name="block.ln_1"), 2, name="block.self_attention")
    x = g.add(y, x, name="block.add")
    y = g.gelu(g.pointwise_linear(g.layernorm(x, 1e-6, name="block.ln_2"), 8, name="block.mlp.0"))
    x = g.add(x, g.pointwise_linear(y, 4, name="block.mlp.3"), name="block.add_1")
    y = g.token_select(g.layernorm(x, 1e-6, name="encoder.ln"), 0)
    g.softmax_loss(g.linear(y, 3, name="heads.head"))
    return g


def swin_net(n=2, hw=4):
    """A Swin Transformer in small (torchvision's SwinTransformer): 2x2 patches of a 2hw x 2hw image
    embedded to 4 channels and layer-normed, two blocks with 2x2 windows in 2 heads (the second's
    windows shifted by 1: rolled, masked) each a layer norm, window attention between its qkv and proj
    Linears, the residual sum, a layer norm, an MLP over channels (a Linear to 8, a GELU, a Linear back)
    and the residual sum; patch merging, its layer norm and Linear without bias; the last layer norm,
    the global pool and the head."""
    g = Graph(input_shape=(n, 3, 2 * hw, 2 * hw), num_classes=3, name="swin")
    x = g.layernorm(g.conv2d(g.input(), 4, 2, stride=2, name="features.0.0"), name="features.0.2")
    for k, shift in enumerate((0, 1)):
        b = f"features.1.{k}"
        y = g.swin_attention(g.layernorm(x, name=f"{b}.norm1"), 2, 2, shift, name=f"{b}.attn")
        x = g.add(x, y, name=f"{b}.add")
        y = g.gelu(g.pointwise_linear(g.layernorm(x, name=f"{b}.norm2"), 8, name=f"{b}.mlp.0"))
        x = g.add(x, g.pointwise_linear(y, 4, name=f"{b}.mlp.3"), name=f"{b}.add_1")
    x = g.layernorm(g.patch_merge(x, name="features.2.merge"), name="features.2.norm")
    x = g.layernorm(g.pointwise_linear(x, 8, bias=False, name="features.2.reduction"), name="norm")
    g.softmax_loss(g.linear(g.flatten(g.avgpool(x, hw // 2, name="avgpool")), 3, name="head"))
    return g


def gelu_tanh_net(n=2, hw=4):
    """GELU's tanh approximation (GPT-2's and BERT's activation) where networks put it: after a batch
    norm of a conv's map, read by a conv and by a residual add (a fork), after the add, and in an MLP's
    head on (N, features)."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="gelu_tanh")
    y = g.gelu_tanh(g.batchnorm(g.conv2d(g.input(), 3, 3, padding=1, name="conv1"), name="bn1"), name="act1")
    y = g.gelu_tanh(g.add(g.conv2d(y, 3, 3, padding=1, name="conv2"), y, name="add1"), name="act2")
    y = g.flatten(g.avgpool(y, 2, name="pool1"))
    y = g.gelu_tanh(g.linear(y, 6, name="fc1"), name="act3")
    g.softmax_loss(g.linear(y, 3, name="fc2"))
    return g


def data_for(g, seed=1):
    """A random batch and labels for ``g``."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(g.input_shape).astype(np.float32),
            rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32))


def train_steps(g, config, device, program=None, steps=2):
    """``steps`` SGD steps of ``g`` under ``config`` on ``device`` (a fixed batch, seed 4), with
    ``program`` in place of the Model's own "grads" program if given: (losses, parameters), for the
    mutation and edit tests to compare with a baseline run bit for bit."""
    x, labels = data_for(g)
    model = Model(g, config, device=device, seed=4)
    if program is not None:
        model.programs["grads"] = program
    losses = [model.step(x, labels, lr=0.1, momentum=0.9) for _ in range(steps)]
    return losses, model.params


def run(capsys, *argv) -> tuple[int, str, str]:
    """``snlite ARGV`` in this process: its exit status, stdout and stderr (never a traceback)."""
    from snlite import cli

    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def alexnet(batch):
    from snlite.models import get_model

    return get_model("alexnet", batch)
