"""Training a whole network: gradients against central differences on the host device, host
against the CUDA simulator, PyTorch-style parameters, determinism, and clear errors."""
import numpy as np
import pytest

from nets import convnext_net, gated_net, gelu_tanh_net, grouped_net, swin_net, vit_net
from snlite.device import CudaDevice, HostDevice
from snlite.graph import Graph
from snlite.executor import dropout_seed
from snlite.anomaly import NonFiniteError
from snlite.train import Model


def fork_join_net(n=2, hw=6, dropout=True):
    """A fork (conv1 read three times), a residual add, a concat, BN, LRN, dropout, avg and max pooling."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3)
    x = g.input()
    c1 = g.conv2d(x, 3, 3, padding=1, name="conv1")
    a = g.relu(g.batchnorm(c1, name="bn1"), name="relu1")
    b = g.conv2d(c1, 3, 1, bias=False, name="conv2")
    s = g.lrn(g.add(a, b, name="add1"), size=3, alpha=0.5, name="lrn1")
    cat = g.concat([s, c1], name="cat1")
    p = g.avgpool(g.maxpool(cat, 2, stride=1, name="pool1"), 2, name="pool2")
    y = g.flatten(p, name="flat1")
    if dropout:
        y = g.dropout(y, p=0.3, name="drop1")
    g.softmax_loss(g.linear(y, 3, name="fc1"))
    return g


def _data(g, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(g.input_shape).astype(np.float32)
    labels = rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32)
    return x, labels


# grouped: depthwise, ReLU6, ceil mode; gated: Hardswish, SiLU, Sigmoid, Hardsigmoid, channel scale;
# convnext: layer norms over channels, Linears over channels, the layer scale; vit: attention, the class
# token, the position embedding, one token read out; gelu_tanh: GELU's tanh approximation (Swin's
# whole-network gradients are PyTorch's, to float64: tests/test_from_torch.py; its window attention's
# backward is checked alone by central differences in tests/test_window_attention.py)
@pytest.mark.parametrize("net", [fork_join_net, grouped_net, gated_net, convnext_net, vit_net, gelu_tanh_net])
def test_whole_network_gradients_match_central_differences(net):
    g = net()
    model = Model(g, device="host", seed=3)
    x, labels = _data(g)
    base = model.params
    model.iteration = 0
    _, grads = model.forward_backward(x, labels)
    rng = np.random.default_rng(0)
    eps = 2e-3  # small enough not to cross ReLU / max-pool kinks, large enough for float32 losses
    for name, grad in grads.items():
        for idx in [tuple(int(rng.integers(0, s)) for s in grad.shape) for _ in range(4)]:
            losses = []
            for sign in (1, -1):
                p = {k: v.copy() for k, v in base.items()}
                p[name][idx] += sign * eps
                model.set_params(p)
                model.iteration = 0  # the same dropout mask every time
                losses.append(model.forward_backward(x, labels)[0])
            numeric = (losses[0] - losses[1]) / (2 * eps)
            assert abs(numeric - grad[idx]) <= 1e-3 + 5e-2 * abs(numeric), (
                f"d loss / d {name}{list(idx)}: backward {grad[idx]:.6f}, central difference {numeric:.6f}")


@pytest.mark.parametrize("net", [lambda: fork_join_net(n=2, hw=4), lambda: grouped_net(n=1),
                                 lambda: gated_net(n=1), lambda: convnext_net(n=2, hw=2),
                                 lambda: vit_net(n=2, hw=2), lambda: swin_net(n=1, hw=4)],
                         ids=["fork_join", "grouped", "gated", "convnext", "vit", "swin"])
def test_host_and_simulator_agree(net):
    """One training step (forward, backward, SGD with momentum) on the host device and on the CUDA
    simulator: the same loss, and the same gradients (the first step moves each weight by lr times
    its gradient). One step, not two: on the simulator each one takes seconds."""
    g = net()
    x, labels = _data(g)
    lr, results = 0.1, []
    for dev in (HostDevice(), CudaDevice()):
        model = Model(g, device=dev, seed=5)
        before = model.params
        loss = model.step(x, labels, lr=lr, momentum=0.9)
        results.append((loss, before, model.params))
    (l0, b0, p0), (l1, b1, p1) = results
    assert l0 == pytest.approx(l1, rel=1e-5)
    for name in p0:
        np.testing.assert_array_equal(b0[name], b1[name],
                                      err_msg=f"{name}: the same seed, the same initial value")
        np.testing.assert_allclose((b1[name] - p1[name]) / lr, (b0[name] - p0[name]) / lr, rtol=1e-3,
                                   atol=1e-5, err_msg=f"{name}: the step (lr x gradient) differs")


def test_training_is_deterministic_and_reduces_the_loss():
    g = fork_join_net(n=4)
    x, labels = _data(g)
    runs = []
    for _ in range(2):
        model = Model(g, device="host", seed=7)
        runs.append([model.step(x, labels, lr=0.05, momentum=0.9) for _ in range(8)])
    assert runs[0] == runs[1], "the same seed must give the same losses, bit for bit"
    assert runs[0][-1] < runs[0][0]


def test_batchnorm_running_stats_update_once_per_step_and_predict_uses_them():
    g = fork_join_net()
    model = Model(g, device="host", seed=0)
    x, labels = _data(g)
    model.step(x, labels, lr=0.01)
    after_one = model.params["bn1.running_mean"]
    c1 = model.params  # running_mean after one step = 0.9 * 0 + 0.1 * batch mean (PyTorch's rule)
    assert np.abs(after_one).max() > 0
    logits = model.predict(x)
    assert logits.shape == (2, 3)
    # predict changes nothing
    np.testing.assert_array_equal(model.params["bn1.running_mean"], c1["bn1.running_mean"])
    np.testing.assert_array_equal(model.predict(x), logits)  # inference is deterministic (no dropout)
    assert model.predict(np.concatenate([x, x, x[:1]])).shape == (5, 3)


def test_dropout_mask_depends_on_iteration_not_on_history():
    g = fork_join_net()
    x, labels = _data(g)
    m1, m2 = Model(g, device="host", seed=1), Model(g, device="host", seed=1)
    _, first = m1.forward_backward(x, labels)  # no update: only the dropout mask changes
    _, second = m1.forward_backward(x, labels)
    _, again = m2.forward_backward(x, labels)
    assert not np.array_equal(first["fc1.weight"], second["fc1.weight"]), \
        "a new iteration must draw a new mask"
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert dropout_seed(1, 0, 3) == dropout_seed(1, 0, 3) != dropout_seed(1, 1, 3) != dropout_seed(1, 0, 4)


def test_set_params_checks_names_and_shapes_before_writing():
    g = fork_join_net()
    model = Model(g, device="host")
    before = model.params
    bad = dict(before)
    bad["conv1.weight"] = np.zeros((1, 2, 3), np.float32)
    bad["nope"] = np.zeros(1)
    del bad["fc1.bias"]
    with pytest.raises(ValueError,
                       match=r"missing \['fc1.bias'\].*unexpected \['nope'\].*conv1.weight: expected"):
        model.set_params(bad)
    for k, v in model.params.items():
        np.testing.assert_array_equal(v, before[k])


def test_bad_batches_are_refused():
    g = fork_join_net()
    model = Model(g, device="host")
    x, labels = _data(g)
    with pytest.raises(ValueError, match="input batch has shape"):
        model.step(x[:1], labels[:1])
    with pytest.raises(ValueError, match=r"labels must be 2 integers in \[0, 3\)"):
        model.step(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got 0"):
        model.step(x, labels, lr=0)


def test_every_zoo_model_runs_a_training_route_on_the_meta_device():
    """At the paper's batch sizes: the layers' kernel calls and views work with shapes alone."""
    from snlite.models import DEFAULT_BATCH, get_model

    # every kind of layer
    for name in ("lenet", "alexnet", "vgg16", "resnet50", "inception_v4", "densenet121"):
        g = get_model(name, batch=DEFAULT_BATCH.get(name, 16))
        model = Model(g, device="meta")
        results = model.executor.run(model.programs["grads"])
        assert results == {}  # the meta device holds no values, and runs no kernels: memory only
        assert model.executor.launch_bytes[model.step_mode] == [r.counted_bytes for r in model.trace.op_steps]
        assert len(model.trace.steps) >= \
            2 * len(g.layers) - sum(l.kind == "flatten" for l in g.layers.values())
        assert model.trace.peak_bytes >= sum(t.nbytes for t in g.tensors().values() if t.kind == "weight")


# ---------------------------------------------------------------- never silent: NaN, Inf and bad arguments
def test_a_nan_pixel_stops_the_step_names_where_and_changes_nothing():
    """One NaN pixel used to give a normal-looking loss while conv1's weights turned NaN."""
    g = fork_join_net()
    model = Model(g, device="host", seed=2)
    x, labels = _data(g)
    model.step(x, labels, lr=0.1)
    before, iteration = model.params, model.iteration
    x[1, 0, 2, 3] = np.nan
    with pytest.raises(NonFiniteError, match=r"^training iteration 1: the loss is nan; the first non-finite "
                                             r"values appear in the input batch: it has 1 NaN of 144 values "
                                             r"\(the first at \(1, 0, 2, 3\): nan\)\. Nothing was updated"):
        model.step(x, labels, lr=0.1)
    assert model.iteration == iteration
    for name, value in model.params.items():  # weights and BatchNorm's running statistics as before
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    with pytest.raises(NonFiniteError, match="the loss is nan"):
        model.forward_backward(x, labels)


def test_the_first_layer_whose_output_is_not_finite_is_named():
    """Finite inputs and weights whose product overflows float32 in conv2: conv2 is named, not a later
    layer."""
    g = fork_join_net()
    model = Model(g, device="host")
    p = model.params
    p["conv2.weight"][:] = 3e38
    model.set_params(p)
    x, labels = _data(g)
    with pytest.raises(NonFiniteError, match=r"layer 'conv2' \(conv2d, forward step \d+\): its output has "
                                             r".*inf.* while its inputs and parameters are finite"):
        model.step(x, labels)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the simulator's threads compute NaN in NumPy scalars
def test_nan_and_inf_reach_the_logits_on_host_and_simulator():
    """Every layer kind (conv, BN, ReLU, LRN, add, concat, both poolings, flatten, dropout, linear,
    softmax) with NaN and +-inf in the input: training stops on both devices with the same finding,
    and predict's logits are non-finite in the same places on both, as the host re-run says."""
    from snlite import anomaly

    g = fork_join_net(n=2, hw=4)
    x, labels = _data(g)
    x[0, 0, 1, 1], x[0, 1, 2, 0], x[0, 1, 3, 3] = np.nan, np.inf, -np.inf
    messages, logits = [], []
    for dev in (HostDevice(), CudaDevice()):
        model = Model(g, device=dev, seed=5)
        with pytest.raises(NonFiniteError) as e:
            model.forward_backward(x, labels)
        messages.append(str(e.value))
        logits.append(model.predict(x))
    assert messages[0] == messages[1] \
        and "the input batch: it has 1 NaN and 1 +inf and 1 -inf of 64" in messages[0]
    *_, (name, want) = anomaly.forward_outputs(g, Model(g, device="host", seed=5).params, x, train=False)
    assert name == "fc1" and not np.isfinite(want[0]).any() and np.isfinite(want[1]).all()
    for got in logits:
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)


def test_predict_shows_nan_and_evaluate_refuses_it():
    g = fork_join_net()
    model = Model(g, device="host")
    x, labels = _data(g)
    x[0, 0, 0, 0] = np.nan
    logits = model.predict(x)
    assert np.isnan(logits[0]).all() and np.isfinite(logits[1]).all()  # sample 1 is untouched in inference
    with pytest.raises(NonFiniteError, match=r"evaluate: the logits of 1 of 2 samples are not finite \(the "
                                             r"first: sample 0\); the first non-finite values appear in the "
                                             r"input batch"):
        model.evaluate(x, labels)


def test_anomaly_mode_finds_what_never_reaches_the_loss():
    """A -inf pixel that the first ReLU turns into 0: the loss is finite; only --anomaly sees it."""
    g = Graph((2, 1, 4, 4), 3)
    g.softmax_loss(g.linear(g.flatten(g.conv2d(g.relu(g.input()), 2, 3)), 3))
    x, labels = _data(g)
    x[0, 0, 0, 0] = -np.inf
    assert np.isfinite(Model(g, device="host").step(x, labels))
    model = Model(g, device="host", anomaly=True)
    with pytest.raises(NonFiniteError, match=r"the loss is finite, but anomaly detection found non-finite "
                                             r"values in the input batch: it has 1 -inf of 32 values"):
        model.step(x, labels)
    assert model.iteration == 0
    model.step(np.nan_to_num(x, neginf=0.0), labels)
    assert model.iteration == 1


@pytest.mark.parametrize("call,match", [
    (lambda m, x, y: m.step(x, ["a", "b"]), r"labels must be 2 integers in \[0, 3\) .*; got dtype <U1"),
    (lambda m, x, y: m.step(x, []), r"labels must be 2 integers .*; got shape \(0,\)"),
    (lambda m, x, y: m.step(x, y + 0.7), r"labels must be 2 integers .*; labels\[0\] is \d\.7"),
    (lambda m, x, y: m.step(x, np.array([np.nan, 1.0])), r"labels\[0\] is nan"),
    (lambda m, x, y: m.step(x, np.array([True, False])), r"got dtype bool"),
    (lambda m, x, y: m.step(x, [0, True]), r"labels must be 2 integers .*; labels\[1\] is True"),  # class 1
    (lambda m, x, y: m.step(x, y.reshape(2, 1)), r"got shape \(2, 1\)"),
    (lambda m, x, y: m.step(x, y, lr="0.1"), r"step: lr must be a finite number > 0, got '0.1'"),
    (lambda m, x, y: m.step(x, y, lr=float("inf")), r"step: lr must be a finite number > 0, got inf"),
    (lambda m, x, y: m.step(x, y, momentum=float("nan")), r"step: momentum must be in \[0, 1\), got nan"),
    (lambda m, x, y: m.step(x, y, weight_decay=-1),
     r"step: weight_decay must be a finite number >= 0, got -1"),
    (lambda m, x, y: m.step(x.astype(str), y), r"input batch: the input must hold numbers, got dtype <U"),
    (lambda m, x, y: m.evaluate(np.repeat(x[:1], 10, 0), y[:1]), r"evaluate: labels must be 10 integers .*; "
                                                                  r"got shape \(1,\)"),
    (lambda m, x, y: m.predict(x[0]),
     r"predict: expected samples of shape \(any, 2, 6, 6\), got shape \(2, 6, 6\)"),
    (lambda m, x, y: m.set_params({**m.params, "fc1.bias": np.array([1, np.inf, 0], np.float32)}),
     r"parameter fc1.bias is not finite: 1 \+inf of 3 values"),
    # float32 is what the update computes in: 1e39 is inf there, 1e-50 is 0, 0.99999999 is 1
    (lambda m, x, y: m.step(x, y, lr=1e39), r"step: lr must be a finite number > 0 in float32, .*got 1e\+39, "
                                            r"which float32 rounds to inf"),
    (lambda m, x, y: m.step(x, y, lr=1e-50),
     r"step: lr must be a finite number > 0 in float32, .*rounds to 0.0"),
    (lambda m, x, y: m.step(x, y, momentum=0.99999999), r"step: momentum must be in \[0, 1\) in float32, "
                                                         r".*got 0.99999999, which float32 rounds to 1.0"),
    (lambda m, x, y: m.step(x, y, weight_decay=1e39),
     r"step: weight_decay must be a finite number >= 0 in float32"),
    # not 0, but 0 in float32: momentum or weight decay silently off
    (lambda m, x, y: m.step(x, y, momentum=1e-50), r"step: momentum must be in \[0, 1\) in float32, .*got "
                                                   r"1e-50, which float32 rounds to 0.0: .* \(0 only "
                                                   r"if it is 0\)"),
    (lambda m, x, y: m.step(x, y, weight_decay=1e-50),
     r"step: weight_decay must be .* in float32, .*rounds to 0.0"),
    # an empty batch: no nan accuracy (predict gives no logits, tested in test_fuzz)
    (lambda m, x, y: m.evaluate(x[:0], y[:0]),
     r"evaluate: got no samples \(shape \(0, 2, 6, 6\)\); pass at least one"),
    (lambda m, x, y: m.step(x[:0], y[:0]), r"input batch is empty \(shape \(0, 2, 6, 6\)\)"),
    # parameters are float32: another dtype is refused, naming it, not cast; a negative variance too
    (lambda m, x, y: m.set_params({**m.params,
                                   "conv1.weight": m.params["conv1.weight"].astype(np.float64) + 1}),
     r"parameter conv1.weight has dtype float64, but parameters are float32: convert it first, "
     r"value.astype\(np.float32\); nothing was set"),
    (lambda m, x, y: m.set_params({**m.params, "fc1.bias": np.array([1, 2, 3], np.int32)}),
     r"parameter fc1.bias has dtype int32, .*astype\(np.float32\)"),
    (lambda m, x, y: m.set_params({**m.params, "fc1.bias": np.array([True, False, True])}),
     r"parameter fc1.bias has dtype bool, .*astype\(np.float32\)"),
    (lambda m, x, y: m.set_params({**m.params, "bn1.running_var": np.array([1, -0.5, 2], np.float32)}),
     r"parameter bn1.running_var is a BatchNorm variance, which cannot be negative: 1 of 3 values are \(the "
     r"first at \(1,\): -0.5\); nothing was set"),
])
def test_bad_arguments_are_clear_value_errors(call, match):
    """Each used to be a traceback from inside NumPy, a silent wrong answer (2.7 became class 2,
    evaluate broadcast 1 label over 10 samples and returned 0.0, lr=inf was taken), or a confusing
    message (NaN labels reported as -2147483648)."""
    g = fork_join_net()
    model = Model(g, device="host")
    x, labels = _data(g)
    before = model.params
    with pytest.raises(ValueError, match=match):
        call(model, x, labels)
    assert model.iteration == 0
    for name, value in model.params.items():
        np.testing.assert_array_equal(value, before[name])


def test_integer_valued_float_labels_are_classes():
    g = fork_join_net()
    x, labels = _data(g)
    a, b = Model(g, device="host"), Model(g, device="host")
    assert a.step(x, labels) == b.step(x, labels.astype(np.float64))


def test_seed_must_be_a_non_negative_integer():
    with pytest.raises(ValueError, match=r"seed must be an integer >= 0, got -1"):
        Model(fork_join_net(), device="host", seed=-1)


@pytest.mark.parametrize("who", ["step", "forward_backward", "predict", "evaluate"])
def test_the_meta_device_computes_nothing_and_says_what_to_use(who):
    """step returned nan and evaluate nan: the meta device holds shapes and bytes, no values."""
    g = fork_join_net()
    model = Model(g, device="meta")
    x, labels = _data(g)
    call = {"step": lambda: model.step(x, labels),
            "forward_backward": lambda: model.forward_backward(x, labels),
            "predict": lambda: model.predict(x), "evaluate": lambda: model.evaluate(x, labels)}[who]
    with pytest.raises(ValueError, match=rf"^{who}: the meta device holds no data \(shapes and bytes only\), "
                                         r"so it computes nothing; train and predict on device='host' "
                                         r"\(NumPy\) or 'cuda'"):
        call()
    assert model.iteration == 0


def test_logits_pooled_by_a_convolution_come_back_as_samples_by_classes():
    """SqueezeNet's head: a 1x1 convolution to the classes, pooled to 1x1, flattened; the flatten moves
    no data, so the tensor read back is the pool's (N, classes, 1, 1): predict and step reshape it."""
    g = Graph(input_shape=(3, 2, 4, 4), num_classes=5, name="conv_head")
    y = g.avgpool(g.relu(g.conv2d(g.input(), 5, 1, name="classifier")), 4, name="pool")
    g.softmax_loss(g.flatten(y, name="flatten"))
    model = Model(g, device="host", seed=0)
    x = np.random.default_rng(0).standard_normal((7, 2, 4, 4)).astype(np.float32)
    logits = model.predict(x)
    assert logits.shape == (7, 5)
    _, step_logits = model.step(x[:3], np.array([0, 1, 4]), return_logits=True)
    assert step_logits.shape == (3, 5)
    right = np.argmax(logits[:3], axis=1)
    assert model.evaluate(x[:3], right) == 1.0
    for wrong in range(3):  # each sample counts: one label off, two of three right
        labels = right.copy()
        labels[wrong] = (labels[wrong] + 1) % 5
        assert model.evaluate(x[:3], labels) == pytest.approx(2 / 3)
