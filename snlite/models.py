"""The model zoo: the networks SuperNeurons was measured on, as :class:`snlite.graph.Graph` objects.

Every builder takes the batch size as the keyword ``batch`` and returns a finished graph (it ends in
``softmax_loss``). Layer names follow the reference implementation each docstring cites (PyTorch
``state_dict`` names where there is one), so ``g.param_count()`` and the tensor names can be checked
against it:

    >>> from snlite.models import get_model
    >>> get_model("resnet50", batch=4).param_count()
    25557032

Default batch sizes (``DEFAULT_BATCH``) are the paper's: the width experiment of docs/paper.md
section 7 (the largest batch SuperNeurons trained on a 12 GB K40) for VGG16, Inception-v4 and the
ResNets; 200 for AlexNet (a moderate default chosen for this project; the paper's largest is 1792,
see ``PAPER_WIDTH_BATCH``); 16 for the deep grown ResNets of the depth experiment. Nets the paper
did not run take their usual training batch: LeNet 64 (Caffe's MNIST example), CIFAR ResNets 128
(He et al. 2016), DenseNet-121 64.

Differences from the references, forced by snlite's layers: pooling uses floor mode (Caffe's AlexNet
uses ceil mode, but at 227x227 every pooling divides exactly, so the shapes agree). Inception-v4's
3x3 average poolings exclude the zero padding from the divisor, as the reference does.
"""
from __future__ import annotations

import functools
import re

from snlite.checks import integer
from snlite.graph import Graph
from snlite.records import without_cycle_collection

PAPER_WIDTH_BATCH = {"alexnet": 1792, "vgg16": 224, "inception_v4": 240, "resnet50": 384, "resnet101": 256,
                     "resnet152": 176}  # docs/paper.md section 7: largest batch SuperNeurons fits in 12 GB
DEPTH_BATCH = 16  # docs/paper.md section 7: the depth experiment's batch
DEFAULT_BATCH = dict(PAPER_WIDTH_BATCH, alexnet=200, lenet=64, cifar_resnet=128, densenet121=64,
                     mini_inception=128, vgg11=64)


# ----------------------------------------------------------------------------- LeNet, AlexNet, VGG
def lenet(batch=DEFAULT_BATCH["lenet"], input_shape=(1, 28, 28), num_classes=10, padding=None) -> Graph:
    """Caffe's LeNet (examples/mnist/lenet_train_test.prototxt): conv 20 5x5, maxpool 2, conv 50 5x5,
    maxpool 2, fc 500, relu, fc 10; 431,080 parameters on 1x28x28.

    ``input_shape`` is (C, H, W). Both convolutions use ``padding`` (default 0, Caffe's); inputs smaller
    than 16x16, too small for two valid 5x5 convolutions and two poolings (e.g. the 1x8x8 digits data
    set), default to padding 2 ("same" convolutions: 8 -> 8 -> 4 -> 4 -> 2).
    """
    if not (isinstance(input_shape, (tuple, list)) and len(input_shape) == 3):
        raise ValueError(f"lenet's input_shape is one image, (C, H, W), without the batch (batch=...): got "
                         f"{input_shape!r}")
    c, h, w = input_shape
    if padding is None:
        padding = 0 if min(h, w) >= 16 else 2
    g = Graph((batch, c, h, w), num_classes, name="lenet")
    x = g.conv2d(g.input(), 20, 5, padding=padding, name="conv1")
    x = g.maxpool(x, 2, name="pool1")
    x = g.conv2d(x, 50, 5, padding=padding, name="conv2")
    x = g.maxpool(x, 2, name="pool2")
    x = g.relu(g.linear(g.flatten(x, name="flatten"), 500, name="ip1"), name="relu1")
    g.softmax_loss(g.linear(x, num_classes, name="ip2"))
    return g


def alexnet(batch=DEFAULT_BATCH["alexnet"], num_classes=1000) -> Graph:
    """Caffe's BVLC AlexNet (models/bvlc_alexnet/train_val.prototxt) at 3x227x227, without its
    two-group convolutions: LRN (size 5, alpha 1e-4, beta 0.75) after relu1 and relu2, before pooling;
    dropout 0.5 after relu6 and relu7. 62,378,344 parameters (60,965,224 with groups)."""
    g = Graph((batch, 3, 227, 227), num_classes, name="alexnet")
    x = g.input()
    for i, (out, k, s, p, lrn, pool) in enumerate([(96, 11, 4, 0, True, True), (256, 5, 1, 2, True, True),
                                                   (384, 3, 1, 1, False, False), (384, 3, 1, 1, False, False),
                                                   (256, 3, 1, 1, False, True)], 1):
        x = g.relu(g.conv2d(x, out, k, stride=s, padding=p, name=f"conv{i}"), name=f"relu{i}")
        if lrn:
            x = g.lrn(x, size=5, alpha=1e-4, beta=0.75, name=f"norm{i}")
        if pool:
            x = g.maxpool(x, 3, stride=2, name=f"pool{i}")
    x = g.flatten(x, name="flatten")
    for i in (6, 7):
        x = g.dropout(g.relu(g.linear(x, 4096, name=f"fc{i}"), name=f"relu{i}"), 0.5, name=f"drop{i}")
    g.softmax_loss(g.linear(x, num_classes, name="fc8"))
    return g


# torchvision's configurations: A (VGG-11) and D (VGG-16); numbers are conv widths, "M" a max pool
VGG_CONFIGS = {
    "vgg11": (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
}


def vgg16(batch=DEFAULT_BATCH["vgg16"], num_classes=1000) -> Graph:
    """VGG-16 (Simonyan & Zisserman 2015, configuration D, no BN) at 3x224x224, named as torchvision's
    ``vgg16`` (features.0 ... features.30, classifier.0 ... classifier.6; its adaptive 7x7 average pool
    is the identity at 224x224 and is left out). 138,357,544 parameters."""
    return _vgg("vgg16", batch, num_classes)


def vgg11(batch=DEFAULT_BATCH["vgg11"], num_classes=1000) -> Graph:
    """VGG-11 (configuration A, no BN), named as torchvision's ``vgg11``: 8 convs instead of 13, the
    same classifier. 132,863,336 parameters. A smaller VGG for the exact planner (snlite optimal)."""
    return _vgg("vgg11", batch, num_classes)


def _vgg(name, batch, num_classes) -> Graph:
    g = Graph((batch, 3, 224, 224), num_classes, name=name)
    x, i = g.input(), 0
    for v in VGG_CONFIGS[name]:
        if v == "M":
            x, i = g.maxpool(x, 2, name=f"features.{i}"), i + 1
        else:
            x = g.conv2d(x, v, 3, padding=1, name=f"features.{i}")
            x, i = g.relu(x, name=f"features.{i + 1}"), i + 2
    x = g.flatten(x, name="flatten")  # torchvision: torch.flatten(x, 1)
    x = g.dropout(g.relu(g.linear(x, 4096, name="classifier.0"), name="classifier.1"), 0.5,
                  name="classifier.2")
    x = g.dropout(g.relu(g.linear(x, 4096, name="classifier.3"), name="classifier.4"), 0.5,
                  name="classifier.5")
    g.softmax_loss(g.linear(x, num_classes, name="classifier.6"))
    return g


# ----------------------------------------------------------------------------- ResNets
RESNET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def resnet_blocks(depth: int) -> tuple[int, int, int, int]:
    """Bottleneck units per stage: the standard tables for 50 and 101; otherwise (3, 8, n3, 3) with
    depth = 3 * (3 + 8 + n3 + 3) + 2 and n3 >= 36 (152 and deeper: the third stage grows, as the
    paper's depth experiments did)."""
    if depth in RESNET_BLOCKS:
        return RESNET_BLOCKS[depth]
    n3, rem = divmod(depth - 2, 3)
    if rem or n3 - 14 < 36:
        def ok(d):
            return d in RESNET_BLOCKS or (d >= 152 and (d - 2) % 3 == 0)
        basic = f"; ResNet-{depth} is built of basic blocks: import torchvision's (snlite plan " \
                f"torchvision:resnet{depth}, snlite.from_torch)" if depth in (18, 34) else ""
        raise ValueError(f"no bottleneck ResNet of depth {depth}: valid depths are 50, 101 and "
                         f"3*(3+8+n3+3)+2 for n3 >= 36 (152, 155, 158, ...); nearest: {_nearest(depth, ok)}"
                         f"{basic}")
    return (3, 8, n3 - 14, 3)


def resnet(depth: int, batch=None, num_classes=1000) -> Graph:
    """ImageNet bottleneck ResNet (He et al. 2016) at 3x224x224, torchvision's v1.5 layout and names:
    conv1/bn1/relu/maxpool, then layerS.B.{conv1,bn1,relu1,conv2,bn2,relu2,conv3,bn3,add,relu3} with the
    stride on the 3x3 conv2, convolutions without bias, and a projection shortcut layerS.0.downsample.0
    (1x1 conv) + .1 (BN) on each stage's first unit; then avgpool and fc. Parameters: 25,557,032 (50),
    44,549,160 (101), 60,192,808 (152). See :func:`resnet_blocks` for the valid depths.
    ``batch`` defaults to the paper's (docs/paper.md section 7): 384 / 256 / 176, or 16 for deeper nets."""
    blocks = resnet_blocks(depth)
    if batch is None:
        batch = PAPER_WIDTH_BATCH.get(f"resnet{depth}", DEPTH_BATCH)
    g = Graph((batch, 3, 224, 224), num_classes, name=f"resnet{depth}")
    x = g.relu(g.batchnorm(g.conv2d(g.input(), 64, 7, stride=2, padding=3, bias=False, name="conv1"),
                           name="bn1"), name="relu")
    x = g.maxpool(x, 3, stride=2, padding=1, name="maxpool")
    with without_cycle_collection():  # the paper's deepest has 25,017 layers, and no cycle among them
        for s, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512)), 1):
            for b in range(n):
                x = _bottleneck(g, x, width, stride=2 if b == 0 and s > 1 else 1, name=f"layer{s}.{b}")
    x = g.avgpool(x, x.shape[2], name="avgpool")
    g.softmax_loss(g.linear(g.flatten(x, name="flatten"), num_classes, name="fc"))
    return g


def _nearest(depth, ok):
    """The closest valid depths below and above ``depth``, as text."""
    below = next((d for d in range(depth - 1, 0, -1) if ok(d)), None)
    above = next(d for d in range(max(depth + 1, 1), depth + 10_000) if ok(d))
    return " and ".join(str(d) for d in (below, above) if d is not None)


def _bottleneck(g, x, width, stride, name):
    shortcut = x
    if stride != 1 or x.shape[1] != 4 * width:
        shortcut = g.conv2d(x, 4 * width, 1, stride=stride, bias=False, name=f"{name}.downsample.0")
        shortcut = g.batchnorm(shortcut, name=f"{name}.downsample.1")
    y = x
    for i, (out, k, st) in enumerate([(width, 1, 1), (width, 3, stride), (4 * width, 1, 1)], 1):
        y = g.batchnorm(g.conv2d(y, out, k, stride=st, padding=k // 2, bias=False, name=f"{name}.conv{i}"),
                        name=f"{name}.bn{i}")
        if i < 3:
            y = g.relu(y, name=f"{name}.relu{i}")
    return g.relu(g.add(y, shortcut, name=f"{name}.add"), name=f"{name}.relu3")


def cifar_resnet(depth: int, batch=DEFAULT_BATCH["cifar_resnet"], num_classes=10) -> Graph:
    """CIFAR ResNet (He et al. 2016, section 4.2) at 3x32x32: depth = 6n + 2 (20, 32, 44, 56, 110...):
    conv 3x3 16 + BN + ReLU, three stages of n basic blocks (two 3x3 convs, 16 / 32 / 64 channels,
    stride 2 at the start of stages 2 and 3), global average pooling, fc. Convolutions have no bias.
    Where the shape changes the shortcut is a projection, 1x1 conv + BN (the paper's option B; its
    CIFAR nets used option A, zero-padding, for which snlite has no layer), so ResNet-20 has
    272,474 parameters rather than the paper's 0.27M of option A (269,722)."""
    n, rem = divmod(depth - 2, 6)
    if rem or n < 1:
        def ok(d):
            return d >= 8 and (d - 2) % 6 == 0
        raise ValueError(f"no CIFAR ResNet of depth {depth}: depth must be 6n+2 with n >= 1 (8, 14, 20, 26, "
                         f"...; He et al. used 20, 32, 44, 56, 110); nearest: {_nearest(depth, ok)}")
    g = Graph((batch, 3, 32, 32), num_classes, name=f"cifar_resnet{depth}")
    x = g.relu(g.batchnorm(g.conv2d(g.input(), 16, 3, padding=1, bias=False, name="conv1"), name="bn1"),
               name="relu")
    for s, width in enumerate((16, 32, 64), 1):
        for b in range(n):
            name, stride, shortcut = f"layer{s}.{b}", 2 if b == 0 and s > 1 else 1, x
            if stride != 1 or x.shape[1] != width:
                shortcut = g.conv2d(x, width, 1, stride=stride, bias=False, name=f"{name}.downsample.0")
                shortcut = g.batchnorm(shortcut, name=f"{name}.downsample.1")
            y = g.conv2d(x, width, 3, stride=stride, padding=1, bias=False, name=f"{name}.conv1")
            y = g.relu(g.batchnorm(y, name=f"{name}.bn1"), name=f"{name}.relu1")
            y = g.batchnorm(g.conv2d(y, width, 3, padding=1, bias=False, name=f"{name}.conv2"),
                            name=f"{name}.bn2")
            x = g.relu(g.add(y, shortcut, name=f"{name}.add"), name=f"{name}.relu2")
    x = g.avgpool(x, x.shape[2], name="avgpool")
    g.softmax_loss(g.linear(g.flatten(x, name="flatten"), num_classes, name="fc"))
    return g


# ----------------------------------------------------------------------------- Inception-v4
def _basic(g, x, out, k, stride=1, padding=0, name=""):
    """BasicConv2d of pretrainedmodels/timm: conv (no bias) + BN (eps 0.001) + ReLU."""
    x = g.conv2d(x, out, k, stride=stride, padding=padding, bias=False, name=f"{name}.conv")
    return g.relu(g.batchnorm(x, eps=1e-3, name=f"{name}.bn"), name=f"{name}.relu")


def _chain(g, x, convs, name):
    """A branch of BasicConv2d's given as (out, kernel, stride, padding), named name.0, name.1, ..."""
    for i, (out, k, s, p) in enumerate(convs):
        x = _basic(g, x, out, k, s, p, name=f"{name}.{i}")
    return x


def _pool_branch(g, x, out, name):
    """3x3 average pool (stride 1, padding 1) then a 1x1 BasicConv2d: branch3 of Inception-A/B/C."""
    pool = g.avgpool(x, 3, stride=1, padding=1, count_include_pad=False, name=f"{name}.0")
    return _basic(g, pool, out, 1, name=f"{name}.1")


def _inception_a(g, x, n):
    return g.concat([_basic(g, x, 96, 1, name=f"{n}.branch0"),
                     _chain(g, x, [(64, 1, 1, 0), (96, 3, 1, 1)], f"{n}.branch1"),
                     _chain(g, x, [(64, 1, 1, 0), (96, 3, 1, 1), (96, 3, 1, 1)], f"{n}.branch2"),
                     _pool_branch(g, x, 96, f"{n}.branch3")], name=n)


def _inception_b(g, x, n):
    return g.concat([_basic(g, x, 384, 1, name=f"{n}.branch0"),
                     _chain(g, x, [(192, 1, 1, 0), (224, (1, 7), 1, (0, 3)), (256, (7, 1), 1, (3, 0))],
                            f"{n}.branch1"),
                     _chain(g, x, [(192, 1, 1, 0), (192, (7, 1), 1, (3, 0)), (224, (1, 7), 1, (0, 3)),
                                   (224, (7, 1), 1, (3, 0)), (256, (1, 7), 1, (0, 3))], f"{n}.branch2"),
                     _pool_branch(g, x, 128, f"{n}.branch3")], name=n)


def _inception_c(g, x, n):
    def split(y, name):  # a 1x3 and a 3x1 conv side by side
        return g.concat([_basic(g, y, 256, (1, 3), padding=(0, 1), name=f"{name}a"),
                         _basic(g, y, 256, (3, 1), padding=(1, 0), name=f"{name}b")], name=f"{name}")
    b1 = _basic(g, x, 384, 1, name=f"{n}.branch1_0")
    b2 = _basic(g, x, 384, 1, name=f"{n}.branch2_0")
    b2 = _basic(g, b2, 448, (3, 1), padding=(1, 0), name=f"{n}.branch2_1")
    b2 = _basic(g, b2, 512, (1, 3), padding=(0, 1), name=f"{n}.branch2_2")
    return g.concat([_basic(g, x, 256, 1, name=f"{n}.branch0"), split(b1, f"{n}.branch1_1"),
                     split(b2, f"{n}.branch2_3"), _pool_branch(g, x, 256, f"{n}.branch3")], name=n)


def inception_v4(batch=DEFAULT_BATCH["inception_v4"], num_classes=1000, dropout=0.2) -> Graph:
    """Inception-v4 (Szegedy et al. 2016, figure 9) at 3x299x299, as Cadene's pretrainedmodels and timm
    build it (names features.0 ... features.21, then avg_pool, last_linear): stem (features.0-5),
    4x Inception-A (6-9), Reduction-A (10), 7x Inception-B (11-17), Reduction-B (18), 3x Inception-C
    (19-21), 8x8 average pool, dropout (timm's ``drop_rate``; pretrainedmodels has none), fc.
    42,679,816 parameters with 1000 classes. The concat of Inception-C's split branches is named
    after them (features.19.branch1_1 joins branch1_1a and branch1_1b)."""
    g = Graph((batch, 3, 299, 299), num_classes, name="inception_v4")
    x = _chain(g, g.input(), [(32, 3, 2, 0), (32, 3, 1, 0), (64, 3, 1, 1)], "features")
    x = g.concat([g.maxpool(x, 3, stride=2, name="features.3.maxpool"),
                  _basic(g, x, 96, 3, stride=2, name="features.3.conv")], name="features.3")
    x = g.concat([_chain(g, x, [(64, 1, 1, 0), (96, 3, 1, 0)], "features.4.branch0"),
                  _chain(g, x, [(64, 1, 1, 0), (64, (1, 7), 1, (0, 3)), (64, (7, 1), 1, (3, 0)),
                                (96, 3, 1, 0)], "features.4.branch1")], name="features.4")
    x = g.concat([_basic(g, x, 192, 3, stride=2, name="features.5.conv"),
                  g.maxpool(x, 3, stride=2, name="features.5.maxpool")], name="features.5")
    for i in range(6, 10):
        x = _inception_a(g, x, f"features.{i}")
    x = g.concat([_basic(g, x, 384, 3, stride=2, name="features.10.branch0"),
                  _chain(g, x, [(192, 1, 1, 0), (224, 3, 1, 1), (256, 3, 2, 0)], "features.10.branch1"),
                  g.maxpool(x, 3, stride=2, name="features.10.branch2")], name="features.10")
    for i in range(11, 18):
        x = _inception_b(g, x, f"features.{i}")
    x = g.concat([_chain(g, x, [(192, 1, 1, 0), (192, 3, 2, 0)], "features.18.branch0"),
                  _chain(g, x, [(256, 1, 1, 0), (256, (1, 7), 1, (0, 3)), (320, (7, 1), 1, (3, 0)),
                                (320, 3, 2, 0)], "features.18.branch1"),
                  g.maxpool(x, 3, stride=2, name="features.18.branch2")], name="features.18")
    for i in range(19, 22):
        x = _inception_c(g, x, f"features.{i}")
    x = g.flatten(g.avgpool(x, 8, name="avg_pool"), name="flatten")
    if dropout:
        x = g.dropout(x, dropout, name="dropout")
    g.softmax_loss(g.linear(x, num_classes, name="last_linear"))
    return g


def _mini_block(g, x, widths, n):
    """One inception-style block of :func:`mini_inception`: four branches over the same input, joined
    by a concat: 1x1; 1x1 -> 3x3; 1x1 -> 3x3 -> 3x3; 3x3 max pool (stride 1) -> 1x1. Each conv has
    a bias and a ReLU after it, no BN (GoogLeNet's v1 block, with the 5x5 split into two 3x3)."""
    w0, (r1, w1), (r2, w2), w3 = widths

    def conv(y, out, k, name):
        return g.relu(g.conv2d(y, out, k, padding=k // 2, name=f"{name}.conv"), name=f"{name}.relu")

    b0 = conv(x, w0, 1, f"{n}.branch0")
    b1 = conv(conv(x, r1, 1, f"{n}.branch1.0"), w1, 3, f"{n}.branch1.1")
    b2 = conv(conv(conv(x, r2, 1, f"{n}.branch2.0"), w2, 3, f"{n}.branch2.1"), w2, 3, f"{n}.branch2.2")
    b3 = conv(g.maxpool(x, 3, stride=1, padding=1, name=f"{n}.branch3.pool"), w3, 1, f"{n}.branch3.1")
    return g.concat([b0, b1, b2, b3], name=n)


def mini_inception(batch=DEFAULT_BATCH["mini_inception"], num_classes=10) -> Graph:
    """A small Inception-like fork/concat net at 3x32x32 (CIFAR-sized), for the exact planner
    (:mod:`snlite.optimal`) and teaching: it is not a published model. Stem: conv 3x3 16 + ReLU,
    2x2 max pool (16x16); two inception-style blocks (:func:`_mini_block`, 32 then 64 channels out)
    with a 2x2 max pool between them (8x8); global average pool, fc. 41 layers (38 the exact planner may
    drop), 10,348 parameters with 10 classes: small enough that the integer program over its forks and
    concats solves in seconds."""
    g = Graph((batch, 3, 32, 32), num_classes, name="mini_inception")
    x = g.relu(g.conv2d(g.input(), 16, 3, padding=1, name="stem.conv"), name="stem.relu")
    x = g.maxpool(x, 2, name="stem.pool")
    x = _mini_block(g, x, (8, (8, 12), (4, 6), 6), "block1")
    x = g.maxpool(x, 2, name="pool1")
    x = _mini_block(g, x, (16, (16, 24), (8, 12), 12), "block2")
    x = g.avgpool(x, x.shape[2], name="avgpool")
    g.softmax_loss(g.linear(g.flatten(x, name="flatten"), num_classes, name="fc"))
    return g


# ----------------------------------------------------------------------------- DenseNet
def densenet121(batch=DEFAULT_BATCH["densenet121"], num_classes=1000, growth=32, blocks=(6, 12, 24, 16),
                bn_size=4) -> Graph:
    """torchvision's DenseNet-121 (Huang et al. 2017) at 3x224x224: features.conv0/norm0/relu0/pool0,
    four dense blocks features.denseblockK.denselayerJ.{norm1,relu1,conv1,norm2,relu2,conv2} (BN-ReLU-conv,
    a 1x1 bottleneck of bn_size*growth channels, then a 3x3 conv of growth channels), transitions
    features.transitionK.{norm,relu,conv,pool} halving channels and size, features.norm5, relu, 7x7
    average pool, classifier. Each dense layer reads the concat of its block's input and every earlier
    layer's output (``...denselayerJ.concat``); the block's output is the concat of all of them
    (``features.denseblockK``). 7,978,856 parameters."""
    g = Graph((batch, 3, 224, 224), num_classes, name="densenet121")
    x = g.conv2d(g.input(), 64, 7, stride=2, padding=3, bias=False, name="features.conv0")
    x = g.relu(g.batchnorm(x, name="features.norm0"), name="features.relu0")
    x = g.maxpool(x, 3, stride=2, padding=1, name="features.pool0")
    for k, n in enumerate(blocks, 1):
        block, feats = f"features.denseblock{k}", [x]
        for j in range(1, n + 1):
            name = f"{block}.denselayer{j}"
            y = feats[0] if j == 1 else g.concat(feats, name=f"{name}.concat")
            y = g.relu(g.batchnorm(y, name=f"{name}.norm1"), name=f"{name}.relu1")
            y = g.conv2d(y, bn_size * growth, 1, bias=False, name=f"{name}.conv1")
            y = g.relu(g.batchnorm(y, name=f"{name}.norm2"), name=f"{name}.relu2")
            feats.append(g.conv2d(y, growth, 3, padding=1, bias=False, name=f"{name}.conv2"))
        x = g.concat(feats, name=block)
        if k < len(blocks):
            t = f"features.transition{k}"
            x = g.relu(g.batchnorm(x, name=f"{t}.norm"), name=f"{t}.relu")
            x = g.avgpool(g.conv2d(x, x.shape[1] // 2, 1, bias=False, name=f"{t}.conv"), 2, name=f"{t}.pool")
    x = g.relu(g.batchnorm(x, name="features.norm5"), name="relu")
    x = g.avgpool(x, x.shape[2], name="avgpool")
    g.softmax_loss(g.linear(g.flatten(x, name="flatten"), num_classes, name="classifier"))
    return g


# ----------------------------------------------------------------------------- registry
MODELS = {
    "lenet": lenet,
    "alexnet": alexnet,
    "vgg11": vgg11,
    "vgg16": vgg16,
    "resnet50": functools.partial(resnet, 50),
    "resnet101": functools.partial(resnet, 101),
    "resnet152": functools.partial(resnet, 152),
    "inception_v4": inception_v4,
    "densenet121": densenet121,
    "cifar_resnet20": functools.partial(cifar_resnet, 20),
    "mini_inception": mini_inception,
}


def get_model(name: str, batch: int | None = None, **opts) -> Graph:
    """Build a zoo model by name; ``batch=None`` takes the builder's default. Besides the names in
    ``MODELS``, "resnetNNN" and "cifar_resnetNN" build any valid depth (``resnet(NNN)``...)."""
    kw = dict(opts) if batch is None else dict(opts, batch=integer(batch, f"{name}'s batch"))
    key = name.lower()
    if key in MODELS:
        return MODELS[key](**kw)
    m = re.fullmatch(r"(cifar_resnet|resnet)(\d+)", key)
    if m:
        return (cifar_resnet if m[1] == "cifar_resnet" else resnet)(int(m[2]), **kw)
    raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}, or resnetNNN / cifar_resnetNN "
                     f"for any valid depth")
