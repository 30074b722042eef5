"""SGD inside backward and momentum on the host (``update_in_backward``, ``optimizer_state``):
the same weights as the baseline step by step (host, simulator, adversarial streams), full gradients
from forward_backward, a bad step that changes nothing, the checker and the adversarial device on
the momentum's copies, and the memory it saves, counted by kind."""
import dataclasses

import numpy as np
import pytest

from nets import data_for, mixed_net
from snlite.adversary import COPY_TIES, AdversarialDevice
from snlite.anomaly import NonFiniteError
from snlite.checker import ProgramError, RaceError, check, find_races, races_by_definition
from snlite.config import MemoryConfig
from snlite.device import CudaDevice
from snlite.graph import Graph
from snlite.errors import BudgetError
from snlite.pipeline import place, simulate
from snlite.program import Copy, Free, Launch, Record, Wait
from snlite.train import Model

SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)
IN_BACKWARD = {
    "in backward": MemoryConfig(update_in_backward=True),
    "in backward, momentum on the host": MemoryConfig(liveness=True, update_in_backward=True,
                                                      optimizer_state="host"),
    "superneurons()": MemoryConfig.superneurons(),
    "superneurons(), momentum on the host": MemoryConfig.superneurons(optimizer_state="host"),
}


def tiny_resnet(n=2, hw=4, units=2, bn=True, channels=3):
    """A stem and residual units (conv-BN-ReLU-conv-BN, add, ReLU), then a linear layer: the
    smallest ResNet. ``units=0``: the stem's ReLU and one conv added back to it (two convolutions in
    all, small enough for the simulator)."""
    g = Graph(input_shape=(n, 2, hw, hw), num_classes=3, name="tiny_resnet")
    x = g.relu(g.conv2d(g.input(), channels, 3, padding=1, name="stem"), name="stem_relu")
    norm = (lambda y, name: g.batchnorm(y, name=name)) if bn else (lambda y, name: y)
    for u in range(1, units + 1):
        y = g.relu(norm(g.conv2d(x, channels, 3, padding=1, bias=not bn, name=f"u{u}c1"), f"u{u}bn1"),
                   name=f"u{u}r1")
        y = norm(g.conv2d(y, channels, 3, padding=1, bias=not bn, name=f"u{u}c2"), f"u{u}bn2")
        x = g.relu(g.add(y, x, name=f"u{u}add"), name=f"u{u}out")
    if not units:
        x = g.relu(g.add(g.conv2d(x, channels, 3, padding=1, name="c1"), x, name="add"), name="out")
    g.softmax_loss(g.linear(g.flatten(x, name="flat"), 3, name="fc"))
    return g


def _state(model) -> dict:
    """Weights, BatchNorm buffers and momentum, read back (momentum from the slab where it waits)."""
    return dict(model.params, **{f"{n}.momentum": model._read(f"{n}.momentum") for n in model.learnable})


def _train(g, config, device="host", steps=3):
    x, labels = data_for(g)
    model = Model(g, config, device=device, seed=3)
    losses = [model.step(x, labels, **SGD) for _ in range(steps)]
    return losses, _state(model), model


def _same(a, b):
    assert a[0] == b[0], "losses differ"
    assert a[1].keys() == b[1].keys()
    for name, value in a[1].items():
        np.testing.assert_array_equal(b[1][name], value, err_msg=name)


# ------------------------------------------------------------------------------ the same numbers
@pytest.mark.parametrize("name", IN_BACKWARD)
def test_updating_in_backward_gives_the_baselines_weights_and_momentum_step_by_step(name):
    g = tiny_resnet()
    base = _train(g, MemoryConfig())
    run = _train(g, IN_BACKWARD[name])
    assert run[2].in_backward and run[2].step_mode == "train" and "grads" not in run[2].programs
    _same(base, run)


def test_on_the_simulator_too():
    """The CUDA kernels (SGD with its loss guard, reading momentum brought back from pinned memory):
    two steps of the smallest ResNet, bit-identical to the simulator's baseline."""
    g = tiny_resnet(n=1, hw=2, units=0, bn=False, channels=2)
    base = _train(g, MemoryConfig(), CudaDevice(), steps=2)
    run = _train(g, IN_BACKWARD["in backward, momentum on the host"], CudaDevice(), steps=2)
    assert run[2].executor.host_views, "the momentum must really wait in the slab"
    _same(base, run)


@pytest.mark.parametrize("copies", COPY_TIES)
@pytest.mark.parametrize("order", ["late", "early"])
def test_on_the_adversarial_device_with_momentum_on_the_host(order, copies):
    g = mixed_net()
    base = _train(g, MemoryConfig())
    _same(base, _train(g, IN_BACKWARD["superneurons(), momentum on the host"],
                       AdversarialDevice(order, seed=5, copies=copies)))


def test_forward_backward_still_returns_every_gradient_and_updates_nothing():
    g = mixed_net()
    x, labels = data_for(g)
    base = Model(g, device="host", seed=3)
    model = Model(g, IN_BACKWARD["superneurons()"], device="host", seed=3)
    model.step(x, labels, **SGD)
    base.step(x, labels, **SGD)
    before = _state(model)
    (l0, g0), (l1, g1) = base.forward_backward(x, labels), model.forward_backward(x, labels)
    assert l0 == l1 and g0.keys() == g1.keys() == set(model.learnable)
    for n in g0:
        np.testing.assert_array_equal(g1[n], g0[n], err_msg=n)
    after, base_after = _state(model), _state(base)
    for n, v in after.items():
        if n.endswith(("running_mean", "running_var")):  # a training forward moves them, as in the baseline
            np.testing.assert_array_equal(v, base_after[n], err_msg=n)
        else:  # the weights and momentum as they were
            np.testing.assert_array_equal(v, before[n], err_msg=n)
    # the model placed a second program for it; its next step updates inside backward as before
    assert set(model.programs) == {"train", "infer", "grads"}
    assert model.step(x, labels, **SGD) == base.step(x, labels, **SGD)
    _same(([], _state(base)), ([], _state(model)))


@pytest.mark.parametrize("name", ["in backward", "superneurons(), momentum on the host"])
def test_a_step_with_a_nan_loss_changes_no_weight_no_momentum_and_no_statistic(name):
    """Inside backward the updates run before the host sees the loss: the SGD kernel reads it and
    skips itself, and the host puts BatchNorm's statistics back."""
    g = tiny_resnet()
    x, labels = data_for(g)
    model = Model(g, IN_BACKWARD[name], device="host", seed=3)
    model.step(x, labels, **SGD)
    before, iteration = _state(model), model.iteration
    x[0, 1, 2, 2] = np.nan
    with pytest.raises(NonFiniteError, match="the loss is nan.*Nothing was updated"):
        model.step(x, labels, **SGD)
    assert model.iteration == iteration
    after = _state(model)
    for n, v in before.items():
        np.testing.assert_array_equal(after[n], v, err_msg=n)


# ------------------------------------------------------------------------------ checked like activations
def _event_after(program, why_copy, wait) -> bool:
    """Whether ``wait``'s event was recorded right after a copy for ``why_copy``."""
    k = next(k for k, ins in enumerate(program.body) if type(ins) is Record and ins.event == wait.event)
    prev = program.body[k - 1]
    return type(prev) is Copy and prev.why == why_copy


def _state_waits(program) -> list[int]:
    return [i for i, ins in enumerate(program.body) if type(ins) is Wait and ins.why in ("landed", "release")
            and _event_after(program, "state", ins)]


def test_the_checker_catches_every_missing_wait_on_the_momentums_copies():
    """Removing a wait on a momentum copy is a race exactly when the definition says so; the landed
    and release waits both matter somewhere."""
    program = place(mixed_net(), IN_BACKWARD["in backward, momentum on the host"], "train")
    check(program)
    caught = set()
    for i in _state_waits(program):
        mutant = program.without(i)
        fast, slow = find_races(mutant), races_by_definition(mutant)
        assert bool(fast) == bool(slow), \
            f"removing #{i} ({program.body[i]}): checker {fast} vs definition {slow}"
        if fast:
            caught.add(program.body[i].why)
            with pytest.raises(RaceError, match=r"race on \S*momentum"):
                check(mutant)
    assert caught == {"landed", "release"}


def test_the_adversarial_device_turns_a_missing_momentum_wait_into_wrong_numbers():
    g = mixed_net()
    config = IN_BACKWARD["in backward, momentum on the host"]
    base = _train(g, config, steps=2)
    program = base[2].programs["train"]
    landed = [i for i in _state_waits(program) if program.body[i].why == "landed"
              and any(r.on_data for r in find_races(program.without(i)))]
    assert landed
    for i in landed[:3]:
        changed = []
        for order, copies in [(o, c) for o in ("late", "early") for c in COPY_TIES]:
            model = Model(g, config, device=AdversarialDevice(order, seed=i, copies=copies), seed=3)
            model.programs["train"] = program.without(i)
            x, labels = data_for(g)
            try:
                losses = [model.step(x, labels, **SGD) for _ in range(2)]
            except (ValueError, FloatingPointError, NonFiniteError) as e:
                changed.append(f"{order}, {copies}: {type(e).__name__}")
                continue
            state = _state(model)
            if losses != base[0] or any(not np.array_equal(state[n], v) for n, v in base[1].items()):
                changed.append(f"{order}, {copies}")
        assert changed, f"without #{i} ({program.body[i]}) every order still gives the right numbers"


def test_a_gradient_freed_before_its_update_is_refused():
    """The planted bug: free a weight gradient one instruction before the update that reads it."""
    program = place(mixed_net(), IN_BACKWARD["in backward"], "train")
    body = list(program.body)
    update = next(i for i, ins in enumerate(body) if type(ins) is Launch and ins.phase == "update")
    grad = next(n for n in body[update].reads if n.endswith(".grad"))
    free = next(i for i, ins in enumerate(body) if type(ins) is Free and ins.tensor == grad)
    assert free > update, "the gradient is freed after its update"
    body.insert(update, body.pop(free))
    with pytest.raises((ProgramError, RaceError), match=grad.replace(".", r"\.")):
        check(dataclasses.replace(program, body=tuple(body)))


# ------------------------------------------------------------------------------ the memory it saves
def test_each_weight_gradient_lives_only_until_its_update():
    """At most one layer's weight gradient is ever on the device (each is updated and freed right
    after its layer's backward), where the baseline holds them all; the peak drops by the rest."""
    g = tiny_resnet(n=1)
    grads = {n: t.nbytes for n, t in g.tensors().items() if t.kind == "weight_grad"}
    base, ib = simulate(g, MemoryConfig(liveness=True)), simulate(g, MemoryConfig(liveness=True,
                                                                                  update_in_backward=True))
    assert max(s.device_bytes["weight_grads"] for s in base.steps) >= sum(grads.values())
    most = max(s.device_bytes["weight_grads"] for s in ib.steps)
    assert 0 < most <= 2 * max(grads.values()) + 2048  # a layer's weight and bias gradients, in 1 KiB blocks
    assert ib.peak_bytes < base.peak_bytes


def test_momentum_on_the_host_is_counted_there_and_moves_once_each_way():
    g = tiny_resnet(n=1)
    weights = [t.nbytes for t in g.tensors().values() if t.kind == "weight"]  # one momentum buffer each
    host = simulate(g, MemoryConfig(liveness=True, update_in_backward=True, optimizer_state="host"))
    device = simulate(g, MemoryConfig(liveness=True, update_in_backward=True))
    on_host, on_device = host.by_kind()["optimizer state"], device.by_kind()["optimizer state"]
    assert sum(weights) <= on_host[1] < sum(weights) + 256 * len(weights)  # in the slab's 256 B blocks
    assert on_host[0] < on_device[0] and on_device[1] == 0
    # each buffer goes to the device for its update and back once: the only traffic (no offload here;
    # the batch in and the loss out are not counted)
    assert host.h2d_bytes == host.d2h_bytes == sum(weights)
    assert device.h2d_bytes == device.d2h_bytes == 0


def test_auto_keeps_the_momentum_on_the_device_while_it_fits_and_sends_it_to_the_host_when_not():
    g = tiny_resnet(n=1)
    auto = MemoryConfig(liveness=True, update_in_backward=True, optimizer_state="auto")
    on_device = simulate(g, auto.replace(optimizer_state="device")).peak_bytes
    on_host = simulate(g, auto.replace(optimizer_state="host")).peak_bytes
    assert on_host < on_device
    assert place(g, auto).stats["optimizer_state"] == "device"
    assert place(g, auto.replace(budget_bytes=on_device)).stats["optimizer_state"] == "device"
    assert place(g, auto.replace(budget_bytes=on_host)).stats["optimizer_state"] == "host"
    # the message describes the last placement tried, momentum on the host: it says that was auto's doing
    with pytest.raises(BudgetError, match=r"under liveness \+ update_in_backward \+ optimizer_state=host: "
                                          r".*\. \(optimizer_state is auto, and this was its try with "
                                          r"the momentum on the host: on the device, tried first, it did "
                                          r"not fit either\.\)$"):
        place(g, auto.replace(budget_bytes=on_host - 1024))
    weights = sum(t.nbytes for t in g.tensors().values() if t.kind == "weight")
    with pytest.raises(BudgetError, match=r"\(optimizer_state is auto, and this was its try with the "
                                          r"momentum on the host: the device was not tried: the weights and "
                                          r"their momentum alone exceed its budget\.\)$"):
        place(g, auto.replace(budget_bytes=max(1024, weights // 1024 * 1024)))


def test_only_a_training_step_updates_in_backward():
    """Gradients read back whole ("grads") get a program without updates, every gradient kept to the
    end; a plan that updates in backward is refused there, saying what to do instead."""
    from snlite.scheduler import Scheduler

    g = tiny_resnet(n=1)
    config = MemoryConfig(liveness=True, update_in_backward=True)
    grads = place(g, config, "grads")
    assert not any(ins.phase == "update" for ins in grads.launches())
    assert grads.stats == place(g, config.replace(update_in_backward=False), "grads").stats
    with pytest.raises(ValueError, match=r"updates the weights inside backward.*update_in_backward=False"):
        place(g, config, "grads", plan=Scheduler(g, config).plan())
