"""The model zoo: published parameter counts, shapes, names, depths, and that every net compiles."""
import pytest

from snlite.models import (DEFAULT_BATCH, MODELS, PAPER_WIDTH_BATCH, alexnet, cifar_resnet, densenet121,
                           get_model, inception_v4, lenet, resnet, vgg16)

# Published counts: Caffe's LeNet and BVLC AlexNet (groups removed), torchvision (vgg11, vgg16, resnet*,
# densenet121), pretrainedmodels / timm (inceptionv4 with 1000 classes).
PUBLISHED_PARAMS = {"lenet": 431_080, "alexnet": 62_378_344, "vgg11": 132_863_336, "vgg16": 138_357_544,
                    "resnet50": 25_557_032,
                    "resnet101": 44_549_160, "resnet152": 60_192_808, "inception_v4": 42_679_816,
                    "densenet121": 7_978_856}


def cifar_resnet_params(depth, num_classes=10):
    """Independent count: stem conv + BN, 3 stages of n basic blocks (two 3x3 convs + two BNs each),
    a 1x1 conv + BN projection where the channels change, fc."""
    n = (depth - 2) // 6
    total = 3 * 16 * 9 + 2 * 16
    c_in = 16
    for c in (16, 32, 64):
        for b in range(n):
            total += c_in * c * 9 + c * c * 9 + 4 * c
            if c_in != c:
                total += c_in * c + 2 * c
            c_in = c
    return total + 64 * num_classes + num_classes


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_param_count_is_the_published_one(name):
    assert get_model(name, batch=1).param_count() == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("depth", [20, 32, 44, 56, 110])
def test_cifar_resnet_param_count(depth):
    assert cifar_resnet(depth, batch=1).param_count() == cifar_resnet_params(depth)


def test_cifar_resnet20_is_option_b():
    # option A (zero-padding shortcuts) is the paper's 0.27M; option B adds two 1x1 conv + BN projections
    option_a = cifar_resnet_params(20) - (16 * 32 + 2 * 32) - (32 * 64 + 2 * 64)
    assert option_a == 269_722
    assert get_model("cifar_resnet20", batch=1).param_count() == option_a + 2752


def test_mini_inception_forks_four_ways_and_concats():
    g = get_model("mini_inception", batch=2)
    conv = {"stem": 3 * 16 * 9 + 16}  # each conv's weights and bias, by hand
    for n, cin, (w0, (r1, w1), (r2, w2), w3) in (("block1", 16, (8, (8, 12), (4, 6), 6)),
                                                  ("block2", 32, (16, (16, 24), (8, 12), 12))):
        conv[n] = (cin * w0 + w0 + cin * r1 + r1 + r1 * w1 * 9 + w1 + cin * r2 + r2 + r2 * w2 * 9 + w2
                   + w2 * w2 * 9 + w2 + cin * w3 + w3)
    assert g.param_count() == sum(conv.values()) + 64 * 10 + 10
    tensors = g.tensors()
    assert tensors["block1"].shape == (2, 32, 16, 16) and tensors["block2"].shape == (2, 64, 8, 8)
    fwd = {s.layer: s for s in g.steps() if s.phase == "forward"}
    readers = [L for L, s in fwd.items() if "pool1" in s.reads]
    assert len(readers) == 4  # block2's input forks into its four branches


@pytest.mark.parametrize("name,shapes", [
    ("alexnet",
     {"pool1": (2, 96, 27, 27), "pool2": (2, 256, 13, 13), "pool5": (2, 256, 6, 6), "fc6": (2, 4096)}),
    ("vgg16", {"features.30": (2, 512, 7, 7), "classifier.0": (2, 4096)}),
    ("resnet50",
     {"maxpool": (2, 64, 56, 56), "layer1.2.relu3": (2, 256, 56, 56), "layer2.3.relu3": (2, 512, 28, 28),
                  "layer3.5.relu3": (2, 1024, 14, 14), "layer4.2.relu3": (2, 2048, 7, 7)}),
    ("inception_v4", {"features.3": (2, 160, 73, 73), "features.4": (2, 192, 71, 71),
                      "features.5": (2, 384, 35, 35), "features.10": (2, 1024, 17, 17),
                      "features.18": (2, 1536, 8, 8), "features.21": (2, 1536, 8, 8),
                      "avg_pool": (2, 1536, 1, 1)}),
    ("densenet121", {"features.pool0": (2, 64, 56, 56), "features.denseblock1": (2, 256, 56, 56),
                     "features.transition1.pool": (2, 128, 28, 28), "features.denseblock3": (2, 1024, 14, 14),
                     "features.denseblock4": (2, 1024, 7, 7)}),
    ("cifar_resnet20", {"layer1.2.relu2": (2, 16, 32, 32), "layer2.0.relu2": (2, 32, 16, 16),
                        "layer3.2.relu2": (2, 64, 8, 8)}),
])
def test_intermediate_and_output_shapes(name, shapes):
    g = get_model(name, batch=2)
    for layer, shape in shapes.items():
        assert g.layers[layer].out_shape == shape, layer
    assert g.layers["softmax"].out_shape == (2, g.num_classes)


def test_torchvision_style_names():
    t = vgg16(batch=1).tensors()
    assert t["features.28.weight"].shape == (512, 512, 3, 3) \
        and t["classifier.6.weight"].shape == (1000, 4096)
    t = resnet(50, batch=1).tensors()
    assert t["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
    assert t["layer2.0.conv2.weight"].shape == (128, 128, 3, 3) and "layer1.0.conv1.bias" not in t
    assert t["layer4.2.bn3.running_var"].shape == (2048,) and t["fc.weight"].shape == (1000, 2048)
    t = densenet121(batch=1).tensors()
    assert t["features.denseblock4.denselayer16.conv2.weight"].shape == (32, 128, 3, 3)
    assert t["features.transition3.conv.weight"].shape == (512, 1024, 1, 1) and "features.norm5.bias" in t
    t = inception_v4(batch=1).tensors()
    assert t["features.21.branch2_3b.conv.weight"].shape == (256, 512, 3, 1)
    assert t["features.11.branch2.4.conv.weight"].shape == (256, 224, 1, 7)
    assert t["last_linear.weight"].shape == (1000, 1536)


def test_resnet_stride_on_the_3x3_conv():  # torchvision v1.5
    g = resnet(50, batch=1)
    assert g.layers["layer2.0.conv1"].attrs["stride"] == (1, 1)
    assert g.layers["layer2.0.conv2"].attrs["stride"] == (2, 2)


def test_alexnet_layer_order():
    fwd = alexnet(batch=1).route()[0]
    assert fwd[:5] == ["data", "conv1", "relu1", "norm1", "pool1"]
    assert fwd[fwd.index("fc6"):fwd.index("fc8")] == ["fc6", "relu6", "drop6", "fc7", "relu7", "drop7"]
    assert alexnet(batch=1).layers["norm2"].attrs == dict(size=5, alpha=1e-4, beta=0.75, k=1.0)


def test_densenet_layers_read_every_earlier_feature():
    g = densenet121(batch=1)
    for j in range(2, 7):
        assert len(g.inputs[f"features.denseblock1.denselayer{j}.concat"]) == j
    assert len(g.inputs["features.denseblock4"]) == 17


def test_lenet_on_small_inputs():
    g = lenet(batch=5, input_shape=(1, 8, 8), num_classes=10)
    assert g.layers["pool2"].out_shape == (5, 50, 2, 2)
    assert g.param_count() == 431_080 - 500 * 50 * (16 - 4)
    g = lenet(batch=2, input_shape=(3, 32, 32), num_classes=4)
    assert g.layers["pool2"].out_shape == (2, 50, 5, 5) and g.layers["softmax"].out_shape == (2, 4)
    assert lenet(batch=1, padding=2).layers["pool2"].out_shape == (1, 50, 7, 7)


@pytest.mark.parametrize("depth", [155, 302, 1001])
def test_grown_resnet_has_the_formula_number_of_convs(depth):
    n3 = (depth - 2) // 3 - (3 + 8 + 3)
    g = resnet(depth, batch=1)
    kinds = [layer.kind for layer in g.layers.values()]
    units = 3 + 8 + n3 + 3
    assert kinds.count("conv2d") == 1 + 3 * units + 4  # stem, three per unit, four projections
    assert kinds.count("add") == units and kinds.count("linear") == 1
    assert f"layer3.{n3 - 1}.relu3" in g.layers and f"layer3.{n3}.relu3" not in g.layers
    assert 1 + 3 * units + 1 == depth  # weighted layers: the definition of depth


@pytest.mark.parametrize("depth,nearest", [(48, "50"), (100, "50 and 101"), (153, "152 and 155"), (0, "50")])
def test_invalid_resnet_depth(depth, nearest):
    with pytest.raises(ValueError, match=f"nearest: {nearest}$"):
        resnet(depth)


def test_invalid_cifar_depth():
    with pytest.raises(ValueError, match="nearest: 14 and 20"):
        cifar_resnet(19)


def test_get_model():
    assert get_model("ResNet200", batch=2).input_shape == (2, 3, 224, 224)
    assert get_model("cifar_resnet56", batch=3, num_classes=100).num_classes == 100
    assert get_model("alexnet").input_shape[0] == DEFAULT_BATCH["alexnet"] == 200
    assert get_model("resnet101").input_shape[0] == PAPER_WIDTH_BATCH["resnet101"]
    assert resnet(155).input_shape[0] == 16  # the paper's depth-experiment batch
    with pytest.raises(ValueError, match="unknown model 'googlenet'; known: lenet, alexnet, vgg11, vgg16"):
        get_model("googlenet")
    with pytest.raises(ValueError, match="depth 51"):
        get_model("resnet51")
    with pytest.raises(ValueError, match=r"^alexnet's batch must be an integer >= 1, got '8'$"):
        get_model("alexnet", batch="8")


def test_every_zoo_model_compiles_at_its_paper_batch():
    for name in MODELS:
        batch = PAPER_WIDTH_BATCH.get(name, DEFAULT_BATCH.get(name, DEFAULT_BATCH["cifar_resnet"]))
        g = get_model(name, batch=batch)
        steps = g.steps()
        assert len(steps) == 2 * len(g.layers), name
        assert g.tensors()["data"].shape[0] == batch and steps[-1].layer == "data", name
