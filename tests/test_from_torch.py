"""snlite.from_torch against PyTorch: torchvision's networks, imported, compute what PyTorch computes.

For a model of every family the importer must take (AlexNet, ResNet-18/50, DenseNet-121, GoogLeNet,
SqueezeNet, MobileNet-V2 and V3, ResNeXt, EfficientNet, RegNet-Y, MNASNet, ShuffleNet-V2, ConvNeXt,
ViT, Swin, and networks of its own; VGG is AlexNet's layers, more of them, and the other depths and
widths are more of the same layers, left out for time), at a small input on the host device: the
parameter count is PyTorch's, the logits in eval mode agree, and in train mode (dropout off) the loss
and every gradient agree, with the weights moved across by state_dict name in both directions. Then
the refusals: an operation or hyper-parameter snlite has no layer for, and a forward that branches on
data, each one clear error. ViT's and Swin's names and refusals are in
tests/test_from_torch_transformers.py, a PyTorch NET on the command line in tests/test_cli_torch.py.

Needs torch and torchvision (the ``torch`` extra: ``pip install -e ".[test,torch]"``); skipped,
with the reason shown, without them."""
import collections
import copy
import importlib.util
import re

import numpy as np
import pytest

from snlite.config import MemoryConfig
from snlite.train import Model

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e \".[torch]\"")
if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed: pip install -e \".[torch]\"", allow_module_level=True)

from snlite.torch_import import TorchImportError, from_torch, import_torchvision, torch_params  # noqa: E402
from torch_modules import Net, Scale, refused  # noqa: E402

tv = import_torchvision().models
torch.set_num_threads(1)  # the tests run one per core
nn, F = torch.nn, torch.nn.functional

# name -> (constructor, input (C, H, W), batch). AlexNet's adaptive average pool is the identity only at
# 224x224 (its features end 6x6 there), so it runs one sample at that size; the others run 64x64 in
# batches of 4 (DenseNet 8), see _torchvision for why. One model per block design: ResNet-34, -101 and
# -152 are ResNet-18's and -50's blocks, more of them (about 12 s of CPU), and VGG is AlexNet's kinds of
# layers, more of them (6.6 s).
MODELS = {
    "alexnet": (tv.alexnet, (3, 224, 224), 1),
    "resnet18": (tv.resnet18, (3, 64, 64), 4),
    "resnet50": (tv.resnet50, (3, 64, 64), 4),
    "densenet121": (tv.densenet121, (3, 64, 64), 8),
    # should import: ceil-mode pooling (GoogLeNet, SqueezeNet), ReLU6 and depthwise convolution
    # (MobileNet-V2), grouped convolution (ResNeXt-50)
    "googlenet": (tv.googlenet, (3, 64, 64), 4),
    "squeezenet1_1": (tv.squeezenet1_1, (3, 64, 64), 4),
    "mobilenet_v2": (tv.mobilenet_v2, (3, 64, 64), 4),
    "resnext50_32x4d": (tv.resnext50_32x4d, (3, 64, 64), 4),
    # squeeze-and-excitation (a per-channel gate times the feature map) with Hardswish and Hardsigmoid
    # (MobileNet-V3), SiLU and Sigmoid (EfficientNet, its stochastic depth off), ReLU and Sigmoid
    # (RegNet-Y); a mean over (H, W) as the global pool (MNASNet)
    "mobilenet_v3_small": (tv.mobilenet_v3_small, (3, 64, 64), 4),
    "efficientnet_b0": (tv.efficientnet_b0, (3, 64, 64), 4),
    "regnet_y_400mf": (tv.regnet_y_400mf, (3, 64, 64), 4),
    "mnasnet0_5": (tv.mnasnet0_5, (3, 64, 64), 4),
    # x.chunk(2, dim=1) into its parts, and the channel shuffle (ShuffleNet-V2)
    "shufflenet_v2_x0_5": (tv.shufflenet_v2_x0_5, (3, 64, 64), 4),
    # a network of one's own: LeakyReLU, Tanh, GELU, ELU, SELU, CELU, Softplus and Mish, as modules and
    # as functions
    "own_smooth_net": (lambda num_classes: SmoothNet(num_classes), (3, 16, 16), 4),
    # a network of one's own with padding="same" and "valid", adaptive max and average pools to 1x1 and
    # their squeeze()s
    "own_pooled_net": (lambda num_classes: PooledNet(num_classes), (3, 8, 8), 4),
    # an MLP of one's own: BatchNorm1d and LayerNorm over (N, features)
    "own_mlp": (lambda num_classes: nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16),
        nn.LayerNorm(16), nn.GELU(), nn.Linear(16, num_classes)), (3, 8, 8), 8),
    # an MLP on vectors: input_shape (features,), as the Graph takes (N, features)
    "own_mlp_on_vectors": (lambda num_classes: nn.Sequential(
        nn.Linear(48, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, num_classes)), (48,), 8),
    # torchvision's ConvNeXt code in small (convnext_tiny is the same blocks, 28 M weights): the permutes
    # to channels-last and back, LayerNorm and LayerNorm2d (F.layer_norm on the module's own weight),
    # Linears over channels, GELU, the layer scale (a parameter times the block), stochastic depth off
    "convnext_small_config": (lambda num_classes, **kw: tv.convnext.ConvNeXt(
        [tv.convnext.CNBlockConfig(16, 32, 2), tv.convnext.CNBlockConfig(32, None, 1)],
        num_classes=num_classes, **kw), (3, 32, 32), 4),
    # torchvision's VisionTransformer in small (vit_b_16 is the same code, 86 M weights, 224x224): the
    # patch embedding reshaped and permuted to tokens, the class token and the position embedding (the
    # model's own parameters), MultiheadAttention, LayerNorm and Linears on each token, x[:, 0]
    "vit_small_config": (lambda num_classes: tv.vision_transformer.VisionTransformer(
        image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
        num_classes=num_classes), (3, 16, 16), 4),
    # torchvision's SwinTransformer in small (swin_t is the same code, 28 M weights): window attention with
    # its relative position bias, in windows shifted every second block (rolled and masked), patch
    # merging, LayerNorms and Linears over channels, stochastic depth off
    "swin_small_config": (lambda num_classes: tv.swin_transformer.SwinTransformer(
        patch_size=[2, 2], embed_dim=8, depths=[2, 2], num_heads=[2, 2], window_size=[2, 2],
        stochastic_depth_prob=0.0, num_classes=num_classes), (3, 8, 8), 4),
    # a ViT of one's own, as students write it: patches by flatten(2).transpose(1, 2), the class token
    # and position embedding the model's own parameters, pooled by the class token or by a mean
    "own_vit": (lambda num_classes: OwnViT(num_classes, pool="cls"), (3, 16, 16), 4),
    "own_vit_mean": (lambda num_classes: OwnViT(num_classes, pool="mean"), (3, 16, 16), 4),
}
class OwnBlock(nn.Module):
    """A pre-norm transformer block written out, as torchvision's EncoderBlock is."""

    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class OwnViT(nn.Module):
    """A ViT of one's own: 4x4 patches of a 16x16 image, two blocks, its head on the class token or on the
    mean of the tokens."""

    def __init__(self, num_classes, pool, dim=16, heads=2):
        super().__init__()
        self.patch_embed, self.pool = nn.Conv2d(3, dim, 4, stride=4), pool
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, 17, dim) * 0.5)
        self.blocks = nn.Sequential(OwnBlock(dim, heads), OwnBlock(dim, heads))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0] if self.pool == "cls" else x.mean(dim=1))


class SmoothNet(nn.Module):
    """The activations no torchvision classifier above uses, in a network of one's own."""

    def __init__(self, num_classes):
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.LeakyReLU(0.1)
        self.conv2, self.act2 = nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.GELU()
        self.act3, self.act4, self.act5 = nn.ELU(0.7), nn.CELU(0.5), nn.Softplus(2.0, 1.5)
        self.act6, self.act7 = nn.SELU(), nn.Mish()
        self.fc = nn.Linear(8 * 8 * 8, num_classes)

    def forward(self, x):
        y = self.act1(self.bn1(self.conv1(x)))
        z = self.conv2(y)
        y = torch.tanh(self.act2(z)) + F.leaky_relu(F.gelu(z), 0.3)
        y = self.act3(y) + self.act4(z) + self.act5(y) + F.softplus(z, 0.5) + F.elu(y, 1.5)
        y = self.act6(y) + self.act7(z) + F.selu(y) + F.mish(z) + F.celu(y, 2.0)
        return self.fc(torch.flatten(torch.nn.functional.tanh(y), 1))


class PooledNet(nn.Module):
    """Padding as words, channel dropout (off, to compare), and the global pools students write."""

    def __init__(self, num_classes):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 8, 3, padding="same"), nn.Conv2d(8, 8, 5, padding="same")
        self.conv3, self.pool = nn.Conv2d(8, 8, 3, padding="valid"), nn.AdaptiveMaxPool2d(1)
        self.drop, self.fc = nn.Dropout2d(0.0), nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.conv3(self.drop(F.relu(self.conv2(F.dropout2d(F.relu(self.conv1(x)), 0.0, self.training)))))
        return self.fc(self.pool(x).squeeze() + F.adaptive_avg_pool2d(x, (1, 1)).squeeze((2, 3)))


# constructor arguments: no dropout (training must be deterministic to compare), GoogLeNet without its
# auxiliary classifiers (a second and third output)
KWARGS = {"alexnet": {"dropout": 0.0},
          "googlenet": {"dropout": 0.0, "aux_logits": False, "init_weights": True},
          "squeezenet1_1": {"dropout": 0.0}, "mobilenet_v2": {"dropout": 0.0},
          "mobilenet_v3_small": {"dropout": 0.0}, "mnasnet0_5": {"dropout": 0.0},
          "efficientnet_b0": {"dropout": 0.0, "stochastic_depth_prob": 0.0},
          # a layer scale of 0.5, not 1e-6: each block's weights then get gradients worth comparing
          "convnext_small_config": {"stochastic_depth_prob": 0.0, "layer_scale": 0.5}}


def _torchvision(name, **kw):
    """torchvision's ``name`` with 10 classes, seeded, made well-conditioned enough to compare in float32.

    Freshly initialized, a deep ResNet in training mode amplifies rounding: a channel that is nearly
    constant over the batch (dead after a ReLU, or 2x2 pixels of a small batch) is divided by
    sqrt(var + eps), and residual streams grow with depth; PyTorch's CPU kernels sum in double where
    snlite's sum in float32, and ResNet-152's first gradients then differ by 20 % while the loss agrees
    to 1e-5. So: every batch normalization gets eps 1e-3 (which the import must carry over) and random
    running statistics (which eval mode must use), each residual block's last one a scale of 0.05 to 0.15
    (a block starts near the identity, as with torchvision's ``zero_init_residual``, but every weight
    still gets a gradient), and the batch makes the last ones average at least 16 numbers per channel."""
    make = MODELS[name][0]
    torch.manual_seed(0)
    net = make(num_classes=10, **kw)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eps = 1e-3
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
        last = {tv.resnet.Bottleneck: "bn3", tv.resnet.BasicBlock: "bn2"}.get(type(m))  # ResNeXt's too
        if last:
            with torch.no_grad():
                getattr(m, last).weight.uniform_(0.05, 0.15)
    return net


def _close(got, want, what):
    """float32 agreement, each number within 0.1 % of PyTorch's or 1e-4 of the tensor's largest.
    assert_allclose's own test runs a million numbers at a time first (on AlexNet's 38 M weights
    assert_allclose took seconds, its temporaries page-faulted in anew each call); where that finds a
    number out of tolerance, a NaN, an infinity or another shape, assert_allclose decides and says where."""
    scale = float(np.abs(want).max()) or 1.0
    g, w, n = np.ravel(got), np.ravel(want), 1 << 20
    if np.shape(got) == np.shape(want) and all(
            np.all(np.abs(g[i:i + n] - w[i:i + n]) <= 1e-4 * scale + 1e-3 * np.abs(w[i:i + n]))
            for i in range(0, w.size, n)):
        return
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4 * scale, err_msg=what)


def _gradient_close(got, want, tol, what, floor=0.0):
    """``got`` within ``tol`` of PyTorch's gradient ``want``, in norm, relative to its size (or to
    ``floor``, where the gradient is about zero: a bias feeding a batch normalization, MobileNet's)."""
    err, size = float(np.linalg.norm(got - want)), float(np.linalg.norm(want))
    assert err <= tol * max(size, floor), f"{what}: off by {err / size:.2e} of its size (tolerance {tol:g})"


# The reference is PyTorch in float64, not in float32: PyTorch's float32 CPU kernels round differently
# from one CPU to the next, and on an AMD EPYC its DenseNet-121 gradients were 4.7 % off the float64
# ones (denseblock3.denselayer16.norm2.weight) where snlite's were 3e-4 off. Against float64, a wrong
# name, a missing layer or a wrong hyper-parameter is off by about the gradient's own size, and rounding
# by at most 2.1e-2 (MobileNet-V2's features.17.conv.1.1.bias, a ReLU6 near its edge, where PyTorch's
# own float32 is 2.2e-2 off); most gradients agree to 1e-3.
GRAD_TOL = 3e-2


@pytest.mark.parametrize("name", list(MODELS))
def test_imported_model_computes_what_pytorch_computes(name):
    _, shape, batch = MODELS[name]
    net = _torchvision(name, **KWARGS.get(name, {}))
    g = from_torch(net, shape, batch=batch)
    assert g.param_count() == sum(p.numel() for p in net.parameters())
    assert g.num_classes == 10 and g.input_shape == (batch,) + shape
    # liveness computes what the baseline does, bit for bit (tests/test_executor.py), in an arena a few
    # times smaller: the host fills a fresh arena with NaN, 0.8 s for ResNet-152's baseline one here
    model = Model(g, MemoryConfig(liveness=True), device="host", seed=0)
    model.set_params(net.state_dict())  # PyTorch's own state_dict, by name
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + shape).astype(np.float32)
    labels = rng.integers(0, 10, batch)

    ref = copy.deepcopy(net).double()  # the reference: the same weights, in float64 (see GRAD_TOL)
    ref.eval()
    with torch.no_grad():
        _close(model.predict(x), ref(torch.from_numpy(x).double()).numpy(), f"{name}: eval logits")

    ref.train()
    loss, grads = model.forward_backward(x, labels)
    t_loss = F.cross_entropy(ref(torch.from_numpy(x).double()), torch.from_numpy(labels))
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-4)
    named = dict(ref.named_parameters())
    assert sorted(grads) == sorted(named)
    floor = 1e-4 * max(float(np.linalg.norm(p.grad.numpy())) for p in named.values())
    for pname, p in named.items():
        _gradient_close(grads[pname], p.grad.numpy(), GRAD_TOL, f"{name}: gradient of {pname}", floor)
    state = model.params  # the running statistics both training forwards updated, then back into PyTorch
    for k, v in torch_params(ref).items():
        _close(state[k], v, f"{name}: {k} after a training step")
    loaded = collections.OrderedDict((k, torch.from_numpy(v)) for k, v in state.items())
    loaded._metadata = net.state_dict()._metadata  # the modules' versions, as torch.save keeps them (MNASNet
    missing, unexpected = net.load_state_dict(loaded, strict=False)  # refuses a state without its own)
    integer = {k for k, v in net.state_dict().items() if not v.is_floating_point()}  # counters, Swin's index
    assert not unexpected and set(missing) <= integer
    back = torch_params(net)
    assert sorted(back) == sorted(state) and all(np.array_equal(back[k], v) for k, v in state.items())


def test_layer_names_are_the_state_dict_names_and_repeated_calls_are_numbered():
    net = _torchvision("resnet18")
    g = from_torch(net, (3, 32, 32), batch=4, name="r18")
    assert g.name == "r18"
    # torchvision's BasicBlock calls its one relu module twice; += is traced as a sum in the block
    assert [n for n in g.layers if n.startswith("layer1.0.")] == [
        "layer1.0.conv1", "layer1.0.bn1", "layer1.0.relu", "layer1.0.conv2", "layer1.0.bn2",
        "layer1.0.add", "layer1.0.relu_1"]
    assert g.inputs["layer2.0.add"] == ["layer2.0.bn2", "layer2.0.downsample.1"]
    assert "avgpool" not in g.layers  # 32x32 in, 1x1 after layer4: pooling to 1x1 is the identity
    assert g.inputs["flatten"] == ["layer4.1.relu_1"] and g.inputs["fc"] == ["flatten"]
    assert g.inputs["softmax"] == ["fc"]


def test_module_names_snlite_reserves_are_renamed_and_the_net_still_plans():
    """PyTorch allows a module named ``data``, ``labels`` or ``r#1`` (add_module refuses only '.' and
    ''): the graph's own data layer and labels keep their names, and '@', '#' and ':' (snlite's tensor
    names use them) become '_'; the import places and trains."""
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, module in (("data", torch.nn.Conv2d(3, 4, 3)), ("r#1", torch.nn.ReLU()),
                                 ("labels", torch.nn.Flatten()), ("f@c:x", torch.nn.Linear(4 * 6 * 6, 5))):
                self.add_module(name, module)

        def forward(self, x):
            x = getattr(self, "r#1")(self.data(x))
            return getattr(self, "f@c:x")(self.labels(x))

    with pytest.warns(UserWarning) as warned:
        g = from_torch(Odd(), (3, 8, 8), batch=2)
    said = sorted(str(w.message) for w in warned)
    assert [re.search(r"the module '(\S+)' is the layer '(\S+)'", m).groups() for m in said] == [
        ("data", "data_1"), ("f@c:x", "f_c_x"), ("labels", "labels_1"), ("r#1", "r_1")], said
    assert all(w.filename == __file__ for w in warned), "the warning names the caller's line, not snlite's"
    assert list(g.layers) == ["data", "data_1", "r_1", "labels_1", "f_c_x", "softmax"]
    Model(g, MemoryConfig.superneurons(), device="meta")

    class ScaledByData(torch.nn.Module):  # a layer named for its parameter's owner (ConvNeXt's layer scale)
        def __init__(self):
            super().__init__()
            self.conv, self.data = torch.nn.Conv2d(3, 4, 3), torch.nn.Module()
            self.data.gamma = torch.nn.Parameter(torch.full((4, 1, 1), 0.5))
            self.fc = torch.nn.Linear(4 * 6 * 6, 5)

        def forward(self, x):
            return self.fc(torch.flatten(self.data.gamma * self.conv(x), 1))

    with pytest.warns(UserWarning, match="the module 'data' is the layer 'data_1'"):
        g = from_torch(ScaledByData(), (3, 8, 8), batch=2)
    assert g.layers["data_1"].kind == "layer_scale"


def test_adaptive_pool_that_tiles_is_an_average_pool_and_identity_is_no_layer():
    net = _torchvision("resnet18")
    g = from_torch(net, (3, 64, 64))  # layer4 ends 2x2: adaptive 1x1 is a 2x2 average pool
    assert g.layers["avgpool"].attrs["kernel"] == (2, 2) and g.input_shape[0] == 32
    g = from_torch(tv.alexnet(), (3, 224, 224), batch=1)  # features end 6x6: the 6x6 pool is nothing
    assert "avgpool" not in g.layers and g.inputs["flatten"] == ["features.12"]


def test_densenet_concats_are_named_by_their_module():
    g = from_torch(_torchvision("densenet121"), (3, 32, 32), batch=2)
    block = "features.denseblock1"
    # the first dense layer's cat of one tensor is no layer; later ones join every earlier output
    assert f"{block}.denselayer1.concat" not in g.layers
    assert g.inputs[f"{block}.denselayer1.norm1"] == ["features.pool0"]
    assert g.inputs[f"{block}.denselayer3.concat"] == ["features.pool0", f"{block}.denselayer1.conv2",
                                                      f"{block}.denselayer2.conv2"]
    assert len(g.inputs[f"{block}.concat"]) == 7  # the block's output: its input and six layers'
    assert g.inputs["relu"] == ["features.norm5"]  # DenseNet.forward's F.relu, at the top level



class _OwnBlock(nn.Module):
    """A ConvNeXt-style block of one's own: its layer scale is called gamma, its norm a module."""

    def __init__(self, c=4):
        super().__init__()
        self.conv = nn.Conv2d(3, c, 3, padding=1)
        self.norm, self.fc, self.act = nn.LayerNorm(c), nn.Linear(c, 2 * c), nn.GELU()
        self.gamma = nn.Parameter(torch.full((2 * c, 1, 1), 0.5))

    def forward(self, x):
        return self.gamma * self.act(self.fc(self.norm(self.conv(x).permute(0, 2, 3, 1)))).permute(0, 3, 1, 2)


class _OwnNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = _OwnBlock(), nn.Linear(8, 5)

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.block(x), 1), 1))


def test_convnext_imports_whole_with_its_state_dict_names():
    """torchvision's ConvNeXt-T: every weight, under PyTorch's names; the permutes are no layers, a
    LayerNorm between them normalizes over channels, a Linear there is a 1x1 convolution with the
    Linear's (out, in) weight, and the layer scale is a layer named for the block that owns it. A block
    of one's own names its scale gamma."""
    net = tv.convnext_tiny(num_classes=10, stochastic_depth_prob=0.0)
    g = from_torch(net, (3, 32, 32), batch=2)
    assert g.param_count() == sum(p.numel() for p in net.parameters())
    kinds = {n: g.layers[n].kind for n in ("features.0.1", "features.1.0.block.2", "features.1.0.block.3",
                                           "features.1.0", "classifier.0")}
    assert kinds == {"features.0.1": "layernorm", "features.1.0.block.2": "layernorm",
                     "features.1.0.block.3": "conv2d", "features.1.0": "layer_scale",
                     "classifier.0": "layernorm"}
    assert g.tensors()["features.1.0.block.3.weight"].shape == (384, 96)
    assert g.tensors()["features.1.0.layer_scale"].shape == (96, 1, 1)
    own = from_torch(_OwnNet(), (3, 8, 8), batch=2)
    assert own.layers["block"].kind == "layer_scale" and own.layers["block"].attrs["param"] == "gamma"
    model = Model(own, device="host")
    model.set_params(_OwnNet().state_dict())
    assert sorted(model.params) == sorted(torch_params(_OwnNet()))
    root = Net(lambda s, y: s.gamma * y)
    root.gamma = nn.Parameter(torch.ones(4, 1, 1))
    refused(root, "gamma is a parameter of the model itself", "hold it in a submodule")


@pytest.mark.parametrize("forward, words", [
    (lambda s, y: y.permute(0, 2, 1, 3), ("a permute to (0, 2, 1, 3)", "permute(0, 3, 1, 2) back")),
    (lambda s, y: s.ln(y), ("a layer norm over (8,) of a tensor (2, 4, 8, 8)", "over the channels only")),
    (lambda s, y: F.max_pool2d(y.permute(0, 2, 3, 1), 1).permute(0, 3, 1, 2),
     ("a maxpool of a tensor permuted to (N, H, W, C)", "layernorm, linear")),
    (lambda s, y: y + s.scale.gamma, ("reads the parameter scale.gamma itself", "layer scale")),
    (lambda s, y: y * F.relu(s.scale.gamma), ("reads the parameter scale.gamma itself",)),
    (lambda s, y: y * s.scale.gamma, ("a product of scale.gamma (a parameter of shape (4, 1, 1, 1))",
                                      "shaped (C, 1, 1)")),
], ids=["another permute", "a norm over W", "a pool of channels-last", "a parameter added",
        "an activation of a parameter", "a scale not per channel"])
def test_what_convnext_needs_and_no_more(forward, words):
    """ConvNeXt's permutes, norms over channels and per-channel parameters import (tests above); any
    other permute, norm or read of a parameter is refused, saying what is imported instead."""
    refused(Net(forward, ln=nn.LayerNorm(8), scale=Scale(4, 1, 1, 1)), *words)


def test_dropout2d_drops_channels_with_pytorchs_p():
    g = from_torch(Net(lambda s, y: s.drop(F.dropout2d(y, 0.1, training=True)), drop=nn.Dropout2d(0.3)),
                   (3, 8, 8), batch=2)
    assert [(l.kind, l.attrs["p"]) for l in g.layers.values() if l.kind.startswith("drop")] == \
        [("dropout2d", 0.1), ("dropout2d", 0.3)]


class _MnistNet(nn.Module):
    """PyTorch's MNIST example (pytorch/examples), a flatten written as a view: what students write."""

    def __init__(self, view):
        super().__init__()
        self.view = view
        self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, 1), nn.Conv2d(8, 16, 3, 1)
        self.dropout1, self.dropout2 = nn.Dropout(0.0), nn.Dropout(0.0)
        self.fc1, self.fc2 = nn.Linear(16 * 4 * 4, 32), nn.Linear(32, 10)

    def forward(self, x):
        x = self.dropout1(F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2))
        x = self.fc2(self.dropout2(F.relu(self.fc1(self.view(x)))))
        return F.log_softmax(x, dim=1)


@pytest.mark.parametrize("view", [lambda x: x.view(x.size(0), -1), lambda x: x.view(-1, 16 * 4 * 4),
                                  lambda x: x.reshape(x.shape[0], -1),
                                  lambda x: torch.reshape(x, (x.size(0), -1))],
                         ids=["view(size(0), -1)", "view(-1, F)", "reshape(shape[0], -1)", "torch.reshape"])
def test_a_view_to_features_is_a_flatten_and_a_last_log_softmax_is_the_losss_own(view):
    """Sizes (x.size(0), x.shape[0]) are no layers; a view or reshape to (N, features) is a flatten; a
    log_softmax over the classes as the last op is no layer (softmax_loss applies it, and log-softmax
    of a log-softmax is itself): the loss, and every gradient, are PyTorch's NLL loss of its output's."""
    net = _MnistNet(view)
    g = from_torch(net, (1, 12, 12), batch=4)
    assert [l.kind for l in g.layers.values()].count("flatten") == 1 and "log_softmax" not in str(g.layers)
    model = Model(g, device="host", seed=0)
    model.set_params(net.state_dict())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 1, 12, 12)).astype(np.float32)
    labels = rng.integers(0, 10, 4)
    ref = copy.deepcopy(net).double()
    out = ref(torch.from_numpy(x).double())
    z = model.predict(x).astype(np.float64)  # the logits: log_softmax of them is what the module returns
    z -= z.max(axis=1, keepdims=True)
    _close(z - np.log(np.exp(z).sum(axis=1, keepdims=True)), out.detach().numpy(), "log_softmax(logits)")
    loss, grads = model.forward_backward(x, labels)
    F.nll_loss(out, torch.from_numpy(labels)).backward()
    assert loss == pytest.approx(F.nll_loss(out, torch.from_numpy(labels)).item(), rel=1e-5)
    for pname, p in ref.named_parameters():
        _gradient_close(grads[pname], p.grad.numpy(), 1e-4, f"gradient of {pname}")


@pytest.mark.parametrize("forward, words", [
    (lambda s, y: F.log_softmax(y, dim=1), ("a log_softmax over dim 1 that is not the model's last op",)),
    (lambda s, y: y.view(y.size(0), 2, -1), ("a reshape of (4, 8, 8) to (2, 128) per sample", "flatten")),
    (lambda s, y: y * y.size(0), ("it computes with the size of a tensor", "x.view(x.size(0), -1)")),
    (lambda s, y: y.squeeze(1), ("a squeeze of (2, 4, 8, 8) over dims 1", "(N, C, 1, 1) to (N, C)")),
    (lambda s, y: F.adaptive_max_pool2d(y, 8, return_indices=True)[0],
     ("return_indices=True is not supported yet",)),
], ids=["log_softmax inside", "a reshape not to features", "a size in arithmetic on a tensor",
        "a squeeze of a map", "a pool's indices"])
def test_sizes_reshapes_and_log_softmax_are_refused_elsewhere(forward, words):
    refused(Net(forward), *words)


def test_an_unsupported_op_names_the_node_its_target_and_its_module_path():
    msg = refused(Net(lambda s, y: torch.abs(y)), "'abs_1'", "call_function abs", "snlite imports")
    assert "Conv2d" in msg  # says what is supported
    net = tv.resnet18(num_classes=10)
    net.layer2[0].relu = nn.Softsign()
    with pytest.raises(TorchImportError, match=r"'layer2_0_relu' \(call_module layer2\.0\.relu\) in "
                                               r"layer2\.0\.relu: the module Softsign has no snlite layer"):
        from_torch(net, (3, 32, 32))


@pytest.mark.parametrize("module, words", [
    (nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), ("padding_mode='reflect' is not supported yet",
                                                              "extra")),
    (nn.Conv2d(4, 4, 3, padding=2, dilation=2), ("dilation=(2, 2) is not supported yet",)),
    (nn.AvgPool2d(3, 1, 1, divisor_override=3), ("divisor_override=3 is not supported yet",)),
    (nn.BatchNorm2d(4, momentum=None), ("momentum=None",)),
    (nn.LayerNorm(8, elementwise_affine=False), ("elementwise_affine=False is not supported yet",)),
    pytest.param(nn.Conv2d(4, 4, 2, padding="same"), ("padding='same' with kernel (2, 2) pads one side",),
                 marks=pytest.mark.filterwarnings("ignore:Using padding='same' with even")),  # PyTorch warns
])
def test_hyper_parameters_snlite_lacks_are_refused_by_name(module, words):
    refused(Net(lambda s, y: s.extra(y), extra=module), *words)


@pytest.mark.parametrize("forward, words", [
    (lambda s, y: y * y, ("a product of tensors of shapes [(2, 4, 8, 8), (2, 4, 8, 8)]", "per-channel gate")),
    (lambda s, y: y * y.mean((1, 2, 3), keepdim=True), ("a mean over dims (1, 2, 3)", "over (H, W) only")),
    (lambda s, y: y * y[:, :1].mean((2, 3), keepdim=True), ("'getitem'",)),
    (lambda s, y: y * 0.5, ("a product with a number",)),
    (lambda s, y: y * torch.mean(y), ("a mean over dims None",)),
    (lambda s, y: y + s.drop(y), ("stochastic depth (p=0.2)", "stochastic_depth_prob=0.0", "--torch-args")),
], ids=["same-shape product", "mean over channels", "a sliced gate", "times a number", "mean of all",
        "stochastic depth"])
def test_what_squeeze_and_excitation_needs_and_no_more(forward, words):
    """The product of a feature map and a per-channel gate, a mean over (H, W), and stochastic depth
    switched off are imported (tests above); any other product, mean or a live stochastic depth is
    refused, saying what is imported instead."""
    refused(Net(forward, drop=import_torchvision().ops.StochasticDepth(0.2, "row")), *words)


def test_se_gates_and_means_import_either_way_round():
    """x * gate and gate * x are the same layer; torch.mean(x, (2, 3), keepdim=True) and x.mean((-2, -1),
    keepdim=True) are a global average pool (MNASNet's flat mean((2, 3)) is one plus a flatten), and
    stochastic depth with p=0 is no layer at all."""
    def forward(s, y):
        z = y * F.hardsigmoid(torch.mean(y, (2, 3), keepdim=True))
        return s.drop(F.hardswish(torch.sigmoid(z.mean((-2, -1), keepdim=True)) * z))

    net = Net(forward, drop=import_torchvision().ops.StochasticDepth(0.0, "row"))
    g = from_torch(net, (3, 8, 8), batch=2)
    kinds = [layer.kind for layer in g.layers.values()]
    assert kinds == ["data", "conv2d", "relu", "avgpool", "hardsigmoid", "channel_scale", "avgpool",
                     "sigmoid", "channel_scale", "hardswish", "flatten", "linear", "softmax_loss"], kinds
    scales = [n for n, layer in g.layers.items() if layer.kind == "channel_scale"]
    assert [[g.layers[i].kind for i in g.inputs[n]] for n in scales] == [["relu", "hardsigmoid"],
                                                                           ["channel_scale", "sigmoid"]]
    model = Model(g, MemoryConfig(), device="host", seed=0)
    model.set_params(net.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    net.eval()
    with torch.no_grad():
        _close(model.predict(x), net(torch.from_numpy(x)).numpy(), "logits")


def test_recurrent_layers_and_a_class_for_a_module_are_refused_saying_so():
    """A GRU's model failed in PyTorch's shape check ("Expected input to be 2D or 3D") with a hint to
    give another --input, which no input could satisfy; from_torch(Net) said only "got type"."""
    refused(Net(lambda s, y: y, gru=nn.GRU(4, 4)), "has recurrent layers (gru: GRU), and snlite has none")
    with pytest.raises(ValueError, match=r"got type Net: give one, Net\(\.\.\.\)$"):
        from_torch(Net, (3, 8, 8), batch=2)


def test_a_module_with_weights_called_twice_is_refused_and_one_without_is_not():
    """PyTorch shares a module's weights between its calls; snlite's layers own theirs, so a second call of
    a conv would plan (and count) a second copy: it is refused, saying what to do. A ReLU called twice is
    two layers (torchvision's BasicBlock does that)."""
    refused(Net(lambda s, y: s.conv(s.conv(y)), conv=nn.Conv2d(4, 4, 3, padding=1)),
             "calls conv a second time", "copy.deepcopy")
    g = from_torch(Net(lambda s, y: s.relu(y + s.relu(y)), relu=nn.ReLU()), (3, 8, 8), batch=2)
    assert [n for n in g.layers if n.startswith("relu")] == ["relu", "relu_1"]


class Chunky(nn.Module):
    def __init__(self, by_function):
        super().__init__()
        self.five, self.three, self.fc = nn.Conv2d(3, 5, 1), nn.Conv2d(3, 3, 1), nn.Linear(5 * 4 * 4, 3)
        self.by_function = by_function

    def forward(self, x):
        a, b = torch.chunk(self.five(x), 2, dim=1) if self.by_function else self.five(x).chunk(2, 1)
        return self.fc(torch.flatten(torch.cat([b, self.three(a)], 1), 1))


@pytest.mark.parametrize("by_function", [False, True])
def test_chunks_are_parts_of_the_channels_as_pytorch_cuts_them(by_function):
    """x.chunk(k, 1) and torch.chunk(x, k, dim=1): parts of ceil(C / k) channels, the last one smaller (5
    into 2: 3 and 2), each a narrow layer where a getitem takes it; along another dim it is refused."""
    net = Chunky(by_function)
    g = from_torch(net, (3, 4, 4), batch=2)
    parts = [(a.attrs["start"], a.attrs["size"]) for a in g.layers.values() if a.kind == "narrow"]
    assert sorted(parts) == [(0, 3), (3, 2)], parts
    model = Model(g, MemoryConfig(), device="host", seed=0)
    model.set_params(net.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    with torch.no_grad():
        _close(model.predict(x), net.eval()(torch.from_numpy(x)).numpy(), "logits")
    refused(Net(lambda s, y: torch.cat(y.chunk(2, 0), 0)), "a chunk along dim 0", "channels (dim 1)")


def test_in_place_op_on_a_tensor_read_later_isrefused():
    def forward(s, y):
        z = F.relu(y, inplace=True)  # overwrites y, which the sum then reads: fx's dataflow is wrong here
        return z + y
    refused(Net(forward), "overwrites", "in place")


def test_data_dependent_control_flow_is_explained():
    def forward(s, y):
        return y if y.sum() > 0 else -y
    msg = refused(Net(forward), "branches or loops on the values of a tensor", "static graph")
    assert "fx:" in msg


class _TwoHeads(nn.Module):
    """Logits and an auxiliary head, returned together as GoogLeNet and Inception-v3 do in training."""

    def __init__(self, returns):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 5), nn.ReLU(), nn.Flatten())
        self.fc, self.aux = nn.Linear(4 * 4 * 4, 5), nn.Linear(4 * 4 * 4, 5)
        self.returns = returns

    def forward(self, x):
        y = self.body(x)
        return self.returns(self.fc(y), self.aux(y))


Outputs = __import__("collections").namedtuple("Outputs", "logits aux")


@pytest.mark.parametrize("returns, words", [
    (Outputs, ("returns Outputs of 2 outputs, not one tensor of logits", "aux_logits=False",
               "--torch-args '{\"aux_logits\": false}'")),
    (lambda a, b: (a, b), ("the model returns tuple of 2 outputs, not one tensor of logits",)),
    (lambda a, b: [a, b, a], ("the model returns list of 3 outputs",)),
    (lambda a, b: {"logits": a, "aux": b}, ("the model returns dict of 2 outputs", "aux_logits=False"))])
def test_a_model_with_several_outputs_is_refused_with_what_to_build_instead(returns, words):
    """GoogLeNet in training mode returned a named tuple: an AttributeError's traceback, not a line."""
    with pytest.raises(TorchImportError) as e:
        from_torch(_TwoHeads(returns), (3, 8, 8), batch=2)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert from_torch(_TwoHeads(lambda a, b: a), (3, 8, 8), batch=2).num_classes == 5


def test_an_input_too_small_for_the_model_says_to_give_its_size():
    with pytest.raises(TorchImportError, match=r"PyTorch could not run _TwoHeads on an input of shape "
                                               r"\(1, 3, 4, 4\): .*give it, as input_shape or --input CxHxW"):
        from_torch(_TwoHeads(lambda a, b: a), (3, 4, 4), batch=2)


def test_a_shape_snlite_would_compute_differently_never_passes_silently():
    # 224x224 VGG: fine; at 32x32 its features end 1x1 and the adaptive pool to 7x7 repeats them
    with pytest.raises(TorchImportError, match="adaptive average pooling from 1x1 to 7x7"):
        from_torch(tv.vgg11(), (3, 32, 32))


def test_a_regression_model_and_a_wrong_batch_are_refused_saying_what_snlite_takes():
    """A model of one output said only "num_classes must be an integer >= 2, got 1"; batch=0 named
    input_shape."""
    with pytest.raises(TorchImportError, match=r"^Linear returns 1 output per sample: snlite trains "
                                               r"classifiers, whose logits \(N, classes >= 2\)"):
        from_torch(torch.nn.Linear(4, 1), (4,), batch=2)
    with pytest.raises(ValueError, match=r"from_torch's batch must be an integer >= 1, got 0"):
        from_torch(torch.nn.Linear(4, 3), (4,), batch=0)
