"""The executor: every device replays the same program, so optimizations never change numerics (on the
host, on the adversarial stream device in its hostile orders, on the simulator), what runs is what
was planned, byte for byte, every device operation names a program stream, and nothing allocates
device memory outside the pool."""
import numpy as np
import pytest

from nets import (ALL_CONFIGS, convnext_net, data_for, gated_net, gelu_tanh_net, grouped_net, mixed_net,
                  swin_net, vit_net)
from snlite.bench import PRESETS
from snlite.adversary import COPY_TIES, AdversarialDevice
from snlite.config import MemoryConfig
from snlite.device import CudaDevice, HostDevice
from snlite.graph import Graph
from snlite.layers import LAYER_TYPES
from snlite.layers_base import Layer, UndeclaredRole
from snlite.models import lenet
from snlite.pipeline import simulate
from snlite.program import STREAMS
from snlite.scheduler import Scheduler, validate_plan
from snlite import train
from snlite.train import Model

SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)


@pytest.fixture(scope="module", autouse=True)
def programs_once():
    """The same net under the same config gets the same programs in every test here (they are a pure
    function of the two), so each is placed and race-checked once in this module, not once per Model:
    the flag matrix builds a Model per configuration in three tests, two of them on both adversarial
    orders. A net is known by its layers, their kinds, inputs and shapes, a plan by its ops; costs
    given are never memoised."""
    real, memo = train._programs, {}

    def once(graph, config, plan, costs, in_backward):
        if costs is not None:
            return real(graph, config, plan, costs, in_backward)
        net = tuple((n, l.kind, l.out_shape, tuple(graph.inputs[n]), tuple(l.params().items()))
                    for n, l in graph.layers.items())
        key = (net, config, in_backward, tuple(plan.ops))
        if key not in memo:
            memo[key] = real(graph, config, plan, costs, in_backward)
        programs, resolved = memo[key]
        return dict(programs), resolved

    train._programs = once
    yield
    train._programs = real


def _train(g, config, device="host", steps=3):
    x, labels = data_for(g)
    model = Model(g, config, device=device, seed=4)
    losses = [model.step(x, labels, **SGD) for _ in range(steps)]
    return losses, model.params, model


def _same(run, base, what):
    assert run[0] == base[0], f"losses differ under {what}"
    for name, value in base[1].items():
        assert np.array_equal(run[1][name], value), f"{name} differs from the baseline under {what}"


@pytest.fixture(scope="module")
def baseline_run():
    return _train(mixed_net(), MemoryConfig())


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: c.describe())
def test_every_flag_combination_is_bit_identical_and_runs_as_planned(config, baseline_run):
    g = mixed_net()
    run = _train(g, config)
    _same(run, baseline_run, config.describe())
    model = run[2]
    trace = simulate(g, config)
    assert max(model.step_launch_bytes) == trace.peak_bytes, "planned peak != executed peak"
    assert model.step_launch_bytes == [r.counted_bytes for r in trace.steps], "the device held other bytes"
    if not config.cache:
        validate_plan(model.plan, Scheduler(g, config).persistent())


def test_the_updates_after_backward_count_in_the_trace_as_the_device_holds_them():
    """With the momentum on the host and SGD after backward, each update fetches its momentum into fresh
    device blocks: in a net whose weights outweigh its activations the peak is there, and the trace
    counts it (op -1), launch by launch as the device held it."""
    g = lenet(batch=2)
    config = MemoryConfig(liveness=True, optimizer_state="host")
    planned = simulate(g, config)
    model = Model(g, config, device="host")
    x, labels = data_for(g)
    model.step(x, labels, lr=0.05, momentum=0.9)
    at = planned.steps[planned.peak_op]
    assert (at.op, at.step, at.phase) == (-1, -1, "update"), at
    assert model.step_launch_bytes == [r.counted_bytes for r in planned.steps]
    assert planned.peak_bytes == max(model.step_launch_bytes) == model.trace.peak_bytes, \
        "the model's trace is its whole step's, the updates after backward included"
    assert [r.counted_bytes for r in model.trace.steps] == model.step_launch_bytes
    # l_peak stays the route's busiest op: the momentum fetched for the next update is no op's working set
    assert planned.l_peak_bytes == max(r.working_set_bytes for r in planned.op_steps) < planned.peak_bytes


@pytest.mark.parametrize("order", ["late", "early"])
def test_every_flag_combination_is_bit_identical_on_the_adversarial_device(order):
    """Copies run as late (or as early) as the events allow: any missing wait would show here. The
    copy streams' ties break each way and at random, in turn, one rule per configuration."""
    g = mixed_net()
    base = _train(g, MemoryConfig(), steps=2)
    deferred = 0
    timed = [c.replace(schedule="H200") for c in ALL_CONFIGS if c.offload or c.cache]  # copies moved in time
    offline = [c.replace(fit="offline") for c in (ALL_CONFIGS + timed)[::6]]  # blocks reused tighter
    for k, config in enumerate(ALL_CONFIGS + timed + [MemoryConfig.superneurons(allocator="raw")] + offline):
        copies = COPY_TIES[k % len(COPY_TIES)]
        run = _train(g, config, device=AdversarialDevice(order, seed=k, copies=copies), steps=2)
        _same(run, base, f"{config.describe()} ({order}, copies {copies})")
        deferred += run[2].device.deferred
    assert deferred > 10_000, "the adversarial device must really have deferred the work"


@pytest.mark.parametrize("net", [grouped_net, gated_net, convnext_net, vit_net, swin_net, gelu_tanh_net])
def test_torchvisions_later_layers_train_bit_identically_under_every_preset(net):
    """Depthwise and grouped convs, ReLU6 and ceil-mode pooling (grouped); Hardswish, SiLU, Sigmoid,
    Hardsigmoid and squeeze-and-excitation's channel scale (gated); layer norms, Linears over channels
    and the layer scale (convnext); attention and the token layers (vit), window attention and patch
    merging (swin), GELU's tanh approximation (gelu_tanh); the activations and
    normalizations recomputed as cheap layers, under each benchmark preset and the workspace
    settings: the same losses and parameters, bit for bit, and the peak as planned."""
    g = net()
    if net in (grouped_net, gated_net):  # ceil-mode pooling
        assert g.layers["pool1"].out_shape[2:] == ((2, 2) if net is grouped_net else (3, 3))
    base = _train(g, MemoryConfig(), steps=2)
    configs = list(PRESETS.values()) + [MemoryConfig.superneurons(workspace=w) for w in ("none", "fastest")] \
        + [MemoryConfig(liveness=True, recompute="memory", offload=True, cache=True)]
    for config in configs:
        run = _train(g, config, steps=2)
        _same(run, base, config.describe())
        assert run[2].trace.peak_bytes == simulate(g, config).peak_bytes


@pytest.mark.parametrize("config", [MemoryConfig(allocator="raw"), MemoryConfig.superneurons(fit="best"),
                                    MemoryConfig.superneurons(fit="offline"),
                                    MemoryConfig.superneurons(allocator="raw", count="paper")],
                         ids=lambda c: f"{c.allocator}-{c.fit}-{c.count}")
def test_allocators_and_fits_are_bit_identical(config, baseline_run):
    run = _train(mixed_net(), config)
    _same(run, baseline_run, f"{config.allocator}, {config.fit} fit")
    assert run[2].trace.peak_bytes == simulate(mixed_net(), config).peak_bytes


def test_every_flag_combination_under_offline_placement_is_bit_identical_and_holds_the_planned_arena(
        baseline_run):
    """fit="offline" moves every block after the walk: the numbers stay, and the device allocates
    exactly the arena the meta device planned (the offsets' highest end), under every switch."""
    g = mixed_net()
    for config in ALL_CONFIGS:
        config = config.replace(fit="offline")
        run = _train(g, config)
        _same(run, baseline_run, config.describe() + " (offline)")
        model = run[2]
        assert model.trace.peak_bytes == simulate(g, config).peak_bytes
        assert model.device.arena_bytes == max(p.arena_bytes for p in model.programs.values())


def test_lru_cache_evicts_only_under_pressure_and_counts(baseline_run):
    g = mixed_net(n=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    assert relaxed.d2h_bytes == 0 and relaxed.cache_misses == 0 and relaxed.cache_hits > 0
    tight = MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024)
    base = _train(g, MemoryConfig())
    run = _train(g, tight, device=AdversarialDevice("late", copies="in_first"))  # fetches before evictions
    tr = run[2].trace
    assert tr.d2h_bytes > 0 and tr.cache_misses > 0, "a tighter budget must make the cache move data"
    assert tr.peak_bytes <= tight.budget_bytes
    _same(run, base, "the cache under a tight budget")


def test_no_hidden_stream_every_operation_of_an_iteration_names_a_program_stream():
    """Kernels, copies, fills, events and the SGD update all go through the program's streams; the
    iteration ends with one host wait on an event, never a device-wide synchronize."""

    class Recording(HostDevice):
        def __init__(self):
            super().__init__()
            self.ops, self.synchronized = [], 0

        def _run(self, op, args, stream, kwargs):
            self.ops.append((op.name, getattr(stream, "name", None)))
            super()._run(op, args, stream, kwargs)

        def _copy_to_host(self, src, dst, stream):
            self.ops.append(("copy_to_host", getattr(stream, "name", None)))
            super()._copy_to_host(src, dst, stream)

        def _copy_to_device(self, src, dst, stream):
            self.ops.append(("copy_to_device", getattr(stream, "name", None)))
            super()._copy_to_device(src, dst, stream)

        def _alloc(self, nbytes, pinned, stream):
            self.ops.append(("alloc", getattr(stream, "name", None)))
            return super()._alloc(nbytes, pinned, stream)

        def synchronize(self):
            self.synchronized += 1

    g = mixed_net()
    x, labels = data_for(g)
    for config in (MemoryConfig.superneurons(cache=False), MemoryConfig.superneurons(allocator="raw")):
        dev = Recording()
        model = Model(g, config, device=dev)
        dev.ops.clear()
        model.step(x, labels, **SGD)
        model.predict(x)
        streams = {s for _, s in dev.ops}
        assert streams <= set(STREAMS), \
            f"operations on streams {streams - set(STREAMS)} under {config.describe()}"
        assert {"sgd_update", "copy_to_host", "copy_to_device"} <= {op for op, _ in dev.ops}
        assert dev.synchronized == 0, "no device-wide synchronize inside an iteration"
        assert config.allocator == "pool" or ("alloc", "compute") in dev.ops, \
            "a raw buffer is filled on compute"


def test_many_iterations_leak_nothing_and_keep_the_planned_peak():
    """Regression: in-place handovers once leaked host slots and drifted the per-category bytes."""
    g = mixed_net(n=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    cfg = MemoryConfig(liveness=True, cache=True, recompute="cost_aware",
                       budget_bytes=relaxed.peak_bytes - 8 * 1024)
    planned = simulate(g, cfg)
    model = Model(g, cfg, device="host")
    persistent = set(model.executor.views)
    x, labels = data_for(g)
    for _ in range(12):
        model.step(x, labels, lr=0.05)
        assert set(model.executor.views) == persistent, "only the persistent tensors outlive an iteration"
        assert model.executor.in_use_bytes == sum(i.nbytes for i in model.programs[model.step_mode].setup)
        assert min(min(r.device_bytes.values()) for r in model.trace.steps) >= 0
        assert max(model.step_launch_bytes) == planned.peak_bytes
        assert model.trace.d2h_bytes == planned.d2h_bytes
        assert model.step_launch_bytes == [r.counted_bytes for r in planned.steps]


def test_forward_backward_returns_gradients_without_updating():
    g = mixed_net()
    x, labels = data_for(g)
    model = Model(g, MemoryConfig.superneurons(cache=False), device=AdversarialDevice("early"))
    before = model.params
    loss, grads = model.forward_backward(x, labels)
    assert np.isfinite(loss) and set(grads) == set(model.learnable)
    assert all(np.array_equal(model.params[n], v) for n, v in before.items()
               if not n.endswith(("running_mean", "running_var")))
    host = Model(g, MemoryConfig(), device="host")
    loss2, grads2 = host.forward_backward(x, labels)
    assert loss2 == loss and all(np.array_equal(grads2[n], grads[n]) for n in grads)


def test_predict_on_the_adversarial_device_matches_the_host():
    g = mixed_net()
    x, _ = data_for(g)
    for config in (MemoryConfig.superneurons(), MemoryConfig(liveness=True, offload=True)):
        a = Model(g, config, device=AdversarialDevice("late")).predict(x)
        b = Model(g, MemoryConfig(), device="host").predict(x)
        assert np.array_equal(a, b)


# ------------------------------------------------------------------------------ the CUDA simulator
@pytest.fixture(scope="module")
def sim_baseline():
    """One baseline step on the simulator (slow: the kernels run thread by thread), shared."""
    return _train(mixed_net(n=2, hw=4), MemoryConfig(), device=CudaDevice(), steps=1)


def test_simulator_matches_host_and_plan_and_allocates_nothing_outside_the_pool(sim_baseline):
    from kernels._check import no_device_allocation

    g = mixed_net(n=2, hw=4)
    host = _train(g, MemoryConfig(), device=HostDevice(), steps=1)
    config = MemoryConfig.superneurons(cache=False)
    dev = CudaDevice()
    model = Model(g, config, device=dev, seed=4)
    arenas, slabs = dev.arena_bytes, dev.pinned_bytes
    assert arenas == max(p.arena_bytes for p in model.programs.values())
    assert slabs == max(p.slab_bytes for p in model.programs.values())
    x, labels = data_for(g)
    with no_device_allocation():  # a launcher that allocates raises; every buffer comes from the pool
        loss = model.step(x, labels, **SGD)
    assert (dev.arena_bytes, dev.pinned_bytes) == (arenas, slabs), "nothing allocated during the iteration"
    assert [loss] == sim_baseline[0], "on the simulator too, optimizations change no bit"
    assert all(np.array_equal(model.params[n], v) for n, v in sim_baseline[1].items())
    np.testing.assert_allclose(sim_baseline[0], host[0], rtol=1e-5)
    assert model.step_launch_bytes == [r.counted_bytes for r in simulate(g, config).steps]


def test_lru_cache_on_the_simulator_moves_data_through_pinned_memory_bit_identically(sim_baseline):
    g = mixed_net(n=2, hw=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    cfg = MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024)
    base = sim_baseline
    cached = _train(g, cfg, device=CudaDevice(), steps=1)
    _same(cached, base, "the cache on the simulator")
    tr = cached[2].trace
    assert tr.d2h_bytes > 0 and tr.h2d_bytes > 0 and tr.cache_misses > 0
    assert tr.peak_bytes == simulate(g, cfg).peak_bytes <= cfg.budget_bytes


def test_profiling_times_every_kernel_and_copy_per_stream_on_cuda():
    g = mixed_net(n=2, hw=4)
    model = Model(g, MemoryConfig(liveness=True, offload=True), device=CudaDevice())
    model.profile = True
    x, labels = data_for(g)
    model.forward_backward(x, labels)
    events = model.stream_events
    streams = {e["stream"] for e in events}
    assert streams == {"compute", "copy_out", "copy_in"}
    assert sum(e["stream"] == "compute" for e in events) >= len(g.layers)
    assert all(e["end_ms"] >= e["start_ms"] >= 0 for e in events)
    host = Model(g, MemoryConfig(liveness=True, offload=True), device="host")
    host.forward_backward(x, labels)
    assert host.stream_events == []  # not profiled
    host.profile = True
    host.forward_backward(x, labels)
    timed = host.stream_events  # the same steps and copies, by the wall clock, one after another
    assert [(e["stream"], e["label"]) for e in timed] == [(e["stream"], e["label"]) for e in events]
    assert all(b["start_ms"] >= a["end_ms"] >= a["start_ms"] >= 0 for a, b in zip(timed, timed[1:]))


def test_measured_conv_costs_drive_the_choice_and_plan_the_same_on_meta():
    """On a real GPU the model times each candidate first; here the simulator runs the same code
    (its times mean nothing), and the measured table, given to simulate, plans the same choices."""
    from snlite import workspace

    g = Graph(input_shape=(1, 1, 4, 4), num_classes=2, name="tiny")
    g.softmax_loss(g.linear(g.flatten(g.conv2d(g.input(), 2, 3, padding=1, name="conv1")), 2))
    cfg = MemoryConfig(liveness=True, workspace="fastest")
    dev = CudaDevice()
    costs = workspace.measure_conv_costs(g, dev, reps=1)
    layer = g.layers["conv1"]
    assert {k[1] for k in costs.table} == {"forward", "backward_data", "backward_filter"}
    assert all(ms >= 0 for ms in costs.table.values())
    model = Model(g, cfg, device=dev, costs=costs)
    x, labels = data_for(g)
    model.forward_backward(x, labels)
    planned = simulate(g, cfg, costs=costs)
    assert [(c.op, c.algo, c.chunk) for c in model.trace.conv_choices] == \
           [(c.op, c.algo, c.chunk) for c in planned.conv_choices]
    for c in model.trace.conv_choices:
        assert (c.algo, c.chunk) == (lambda b: (b.algo, b.chunk))(workspace.candidates(layer, c.op, costs)[0])
    assert model.trace.peak_bytes == planned.peak_bytes


class _CarelessTanh(Layer):
    """A layer written carelessly: its backward reads x, which its declarations leave out."""

    kind = "careless_tanh"
    bwd_reads = ("y", "dy")
    bwd_inplace = True

    def forward(self, io):
        io.run("tanh_forward", io.x[0], io.y)

    def backward(self, io):
        io.x[0].shape  # the read its bwd_reads do not name
        io.run("tanh_backward", io.y, io.dy, io.dx[0])


@pytest.mark.parametrize("config", [MemoryConfig(), MemoryConfig.superneurons()],
                         ids=["baseline", "superneurons"])
def test_a_layer_using_a_tensor_it_does_not_declare_fails_naming_it_under_every_config(config, monkeypatch):
    """Such a read worked under the baseline (everything resident) and read a freed tensor, or a
    None, only where liveness planned by the declarations: a new layer passed its own tests."""
    monkeypatch.setitem(LAYER_TYPES, "careless_tanh", _CarelessTanh)
    g = Graph(input_shape=(2, 4), num_classes=3)
    h = g._add("careless_tanh", [g.linear(g.input(), 5)], "bad")
    g.softmax_loss(g.linear(h, 3))
    x, y = data_for(g)
    model = Model(g, config, device="host")
    with pytest.raises(UndeclaredRole, match=r"careless_tanh layer 'bad': its backward uses x, which its "
                                             r"declarations do not name, so the memory plan need not keep "
                                             r"it: add 'x' to _CarelessTanh.bwd_reads"):
        model.step(x, y)
