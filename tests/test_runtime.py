"""The memory runtime: optimizations never change numerics, plans are valid, the planned peak is
the executed peak, stages only ever lower the peak, budgets fail early and clearly, and nothing
allocates device memory outside the pool."""
import itertools

import numpy as np
import pytest

from snlite.config import MemoryConfig
from snlite.device import CudaDevice, HostDevice, MetaDevice
from snlite.graph import Graph
from snlite.runtime import BudgetError, Runtime, simulate, smallest_budget
from snlite.scheduler import PERSISTENT_KINDS, Scheduler, validate
from snlite.train import Model

FLAGS = dict(liveness=(False, True), offload=(False, True), cache=(False, True),
             recompute=("off", "speed", "memory", "cost_aware"), workspace=("none", "fastest", "dynamic"))
ALL_CONFIGS = [MemoryConfig(**dict(zip(FLAGS, values))) for values in itertools.product(*FLAGS.values())]


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


def _data(g, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(g.input_shape).astype(np.float32),
            rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32))


def _train(g, config, device="host", steps=3):
    x, labels = _data(g)
    model = Model(g, config, device=device, seed=4)
    losses = [model.step(x, labels, lr=0.1, momentum=0.9, weight_decay=1e-3) for _ in range(steps)]
    return losses, model.params, model


@pytest.fixture(scope="module")
def baseline_run():
    return _train(mixed_net(), MemoryConfig())


@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda c: c.describe())
def test_every_flag_combination_is_bit_identical_and_runs_as_planned(config, baseline_run):
    g = mixed_net()
    losses, params, model = _train(g, config)
    base_losses, base_params, _ = baseline_run
    assert losses == base_losses
    for name, value in base_params.items():
        assert np.array_equal(params[name], value), f"{name} differs from the baseline under {config.describe()}"
    assert model.trace.peak_bytes == simulate(g, config).peak_bytes, "planned peak != executed peak"
    if not config.cache:
        validate(model.runtime.plan, model.runtime.persistent_set)


@pytest.mark.parametrize("config", [MemoryConfig(allocator="raw"), MemoryConfig.superneurons(fit="best"),
                                    MemoryConfig.superneurons(allocator="raw", count="paper")],
                         ids=lambda c: f"{c.allocator}-{c.fit}-{c.count}")
def test_allocators_and_fits_are_bit_identical(config, baseline_run):
    losses, params, model = _train(mixed_net(), config)
    assert losses == baseline_run[0]
    assert all(np.array_equal(params[n], v) for n, v in baseline_run[1].items())
    assert model.trace.peak_bytes == simulate(mixed_net(), config).peak_bytes


def test_simulator_matches_host_and_plan_under_superneurons():
    g = mixed_net(n=2, hw=4)
    host = _train(g, MemoryConfig(), device=HostDevice(), steps=1)
    sim_base = _train(g, MemoryConfig(), device=CudaDevice(), steps=1)
    sim_sn = _train(g, MemoryConfig.superneurons(cache=False), device=CudaDevice(), steps=1)
    assert sim_sn[0] == sim_base[0], "on the simulator too, optimizations change no bit"
    assert all(np.array_equal(sim_sn[1][n], v) for n, v in sim_base[1].items())
    np.testing.assert_allclose(sim_base[0], host[0], rtol=1e-5)
    assert sim_sn[2].trace.peak_bytes == simulate(g, MemoryConfig.superneurons(cache=False)).peak_bytes


def test_offload_moves_conv_outputs_and_frees_device_memory():
    g = mixed_net()
    plan = Scheduler(g, MemoryConfig(liveness=True, offload=True)).plan()
    moved = {t.tensor for t in plan.transfers}
    assert moved and moved <= {"conv1", "conv2", "conv3", "conv4"}
    assert "conv4" not in moved, "the last CONV's output stays on the device"
    for tr in plan.transfers:
        assert tr.offload_after < tr.release_before < tr.prefetch_before
        assert plan.ops[tr.release_before].op.layer.startswith("conv")
    lv = simulate(g, MemoryConfig(liveness=True))
    off = simulate(g, MemoryConfig(liveness=True, offload=True))
    assert off.d2h_bytes == off.h2d_bytes == sum(g.tensors()[t].nbytes for t in moved)
    assert off.peak_bytes <= lv.peak_bytes


def test_lru_cache_evicts_only_under_pressure_and_counts():
    g = mixed_net(n=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    assert relaxed.d2h_bytes == 0 and relaxed.cache_misses == 0 and relaxed.cache_hits > 0
    tight = MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024)
    base_losses, base_params, _ = _train(g, MemoryConfig())
    losses, params, model = _train(g, tight)
    tr = model.trace
    assert tr.d2h_bytes > 0 and tr.cache_misses > 0, "a tighter budget must make the cache move data"
    assert tr.peak_bytes <= tight.budget_bytes
    assert losses == base_losses and all(np.array_equal(params[n], v) for n, v in base_params.items())


def test_recompute_strategies_trade_compute_for_memory():
    g = mixed_net(n=4)
    lv = simulate(g, MemoryConfig(liveness=True))
    traces = {s: simulate(g, MemoryConfig(liveness=True, recompute=s)) for s in ("speed", "memory", "cost_aware")}
    assert traces["memory"].recompute_count >= traces["cost_aware"].recompute_count >= traces["speed"].recompute_count > 0
    assert traces["memory"].peak_bytes <= traces["speed"].peak_bytes <= lv.peak_bytes
    assert traces["cost_aware"].peak_bytes <= traces["speed"].peak_bytes
    for t in traces.values():
        assert t.extra_flops > 0


def test_workspace_modes():
    from snlite import workspace
    from snlite.models import alexnet

    g = alexnet(batch=8)  # large convs: im2col's speed outweighs its launches
    none = simulate(g, MemoryConfig(liveness=True))
    fastest = simulate(g, MemoryConfig(liveness=True, workspace="fastest"))
    assert {c.algo for c in none.conv_choices} == {"direct"} and none.peak_bytes <= fastest.peak_bytes
    for c in fastest.conv_choices:
        best = workspace.candidates(g.layers[c.layer], c.op)[0]
        assert (c.algo, c.chunk) == (best.algo, best.chunk)
    assert "im2col" in {c.algo for c in fastest.conv_choices}
    tight = MemoryConfig(liveness=True, workspace="dynamic", budget_bytes=none.peak_bytes + 16 * 1024)
    dyn = simulate(g, tight)
    assert dyn.peak_bytes <= tight.budget_bytes
    chosen = {(c.step, c.op): (c.algo, c.chunk) for c in dyn.conv_choices}
    best = {(c.step, c.op): (c.algo, c.chunk) for c in fastest.conv_choices}
    assert chosen != best, "a tight pool must force a smaller workspace somewhere"


@pytest.mark.parametrize("name", ["lenet", "alexnet", "vgg16", "resnet50", "resnet101", "resnet152", "inception_v4",
                                  "densenet121", "cifar_resnet20"])
def test_peaks_never_rise_as_stages_are_added(name):
    from snlite.models import get_model

    g = get_model(name, batch=8)
    ladder = [MemoryConfig(), MemoryConfig(liveness=True), MemoryConfig(liveness=True, offload=True),
              MemoryConfig(liveness=True, offload=True, recompute="cost_aware")]
    peaks = []
    for cfg in ladder:
        rt = Runtime(g, cfg, MetaDevice())
        if not cfg.cache:
            validate(rt.plan, rt.persistent_set)
        rt.run()
        peaks.append(rt.trace.peak_bytes)
        assert rt.trace.l_peak_bytes <= rt.trace.peak_bytes
    assert peaks == sorted(peaks, reverse=True), f"{name}: peaks {peaks} rose as a stage was added"


def test_a_budget_too_small_fails_before_running_and_names_the_fix():
    from snlite.runtime import optimizer_specs

    g = mixed_net()
    cfg = MemoryConfig(liveness=True)
    need = smallest_budget(g, cfg, extra=optimizer_specs(g))
    assert need >= simulate(g, cfg).peak_bytes
    Model(g, cfg.replace(budget_bytes=need), device="host")  # fits exactly
    with pytest.raises(BudgetError, match=r"at step \d+ \(\w+ \w+\), .* needs [\d,]+ bytes .* Live there: .*The "
                                          rf"smallest budget that works under this configuration is {need:,d} bytes"):
        Model(g, cfg.replace(budget_bytes=need - 1024), device="host")
    with pytest.raises(BudgetError, match="while placing the weights"):
        Model(g, cfg.replace(budget_bytes=4096), device="host")


def test_nothing_allocates_device_memory_outside_the_pool():
    from kernels._check import no_device_allocation

    g = mixed_net(n=2, hw=4)
    for cfg in (MemoryConfig(), MemoryConfig.superneurons(cache=False)):
        dev = CudaDevice()
        model = Model(g, cfg, device=dev, seed=0)
        arenas, slabs = dev.arena_bytes, dev.pinned_bytes
        x, labels = _data(g)
        with no_device_allocation():
            model.forward_backward(x, labels)
        assert (dev.arena_bytes, dev.pinned_bytes) == (arenas, slabs)
        assert dev.arena_bytes == model.runtime.pool.capacity_bytes


def test_trace_and_plan_are_readable():
    g = mixed_net()
    cfg = MemoryConfig.superneurons(cache=False)
    sched = Scheduler(g, cfg)
    text = str(sched)
    for stage in ("recompute", "liveness", "offload", "cache", "workspace"):
        assert stage in text
    table = sched.plan().table()
    assert "offload conv2" in table and "release conv2" in table and "prefetch conv2" in table and "recompute" in table
    tr = simulate(g, cfg)
    assert tr.steps and tr.peak_step >= 0 and tr.peak_tensors and tr.ratio >= 1.0
    assert sum(b for _, b in tr.peak_tensors) <= tr.peak_bytes
    assert "peak" in tr.summary() and "act" in tr.table(limit=5)
    assert {KIND for KIND in PERSISTENT_KINDS} <= {"weight", "weight_grad", "buffer", "optimizer"}


def test_measured_conv_costs_drive_the_choice_and_plan_the_same_on_meta():
    """On a real GPU the runtime times each candidate; here the simulator runs the same code
    (its times mean nothing), and the measured table, given to simulate, plans the same choices."""
    from snlite import workspace

    g = Graph(input_shape=(2, 1, 5, 5), num_classes=2, name="tiny")
    g.softmax_loss(g.linear(g.flatten(g.conv2d(g.input(), 2, 3, padding=1, name="conv1")), 2))
    cfg = MemoryConfig(liveness=True, workspace="fastest")
    model = Model(g, cfg, device=CudaDevice())
    costs = workspace.measure_conv_costs(model.runtime, reps=1)
    layer = g.layers["conv1"]
    assert {k[1] for k in costs.table} == {"forward", "backward_data", "backward_filter"}
    assert all(ms >= 0 for ms in costs.table.values())
    model.runtime.costs = costs
    x, labels = _data(g)
    model.forward_backward(x, labels)
    planned = simulate(g, cfg, costs=costs)
    assert [(c.op, c.algo, c.chunk) for c in model.trace.conv_choices] == \
           [(c.op, c.algo, c.chunk) for c in planned.conv_choices]
    for c in model.trace.conv_choices:
        assert (c.algo, c.chunk) == (lambda b: (b.algo, b.chunk))(workspace.candidates(layer, c.op, costs)[0])
    assert model.trace.peak_bytes == planned.peak_bytes
    assert model.runtime.pool.stats().in_use_bytes == sum(
        model.runtime.reserved(t.nbytes) for t in model.runtime.tensors.values() if t.resident)


def test_lru_cache_on_the_simulator_moves_data_through_pinned_memory_bit_identically():
    g = mixed_net(n=2, hw=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    cfg = MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024)
    base = _train(g, MemoryConfig(), device=CudaDevice(), steps=1)
    cached = _train(g, cfg, device=CudaDevice(), steps=1)
    assert cached[0] == base[0] and all(np.array_equal(cached[1][n], v) for n, v in base[1].items())
    tr = cached[2].trace
    assert tr.d2h_bytes > 0 and tr.h2d_bytes > 0 and tr.cache_misses > 0
    assert tr.peak_bytes == simulate(g, cfg).peak_bytes <= cfg.budget_bytes


def test_many_iterations_leak_nothing_and_keep_the_planned_peak():
    """Regression: in-place handovers once leaked host slots and drifted the per-category bytes."""
    g = mixed_net(n=4)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    cfg = MemoryConfig(liveness=True, cache=True, recompute="cost_aware", budget_bytes=relaxed.peak_bytes - 8 * 1024)
    planned = simulate(g, cfg)
    model = Model(g, cfg, device="host")
    x, labels = _data(g)
    for _ in range(12):
        model.step(x, labels, lr=0.05)
        rt = model.runtime
        assert rt.host_pool.stats().in_use_bytes == 0, "host slots must all be free between iterations"
        assert min(min(r.device_bytes.values()) for r in model.trace.steps) >= 0
        assert model.trace.peak_bytes == planned.peak_bytes and model.trace.d2h_bytes == planned.d2h_bytes
    persistent = sum(rt.reserved(t.nbytes) for n, t in rt.tensors.items() if n in rt.persistent_set)
    assert rt.pool.stats().in_use_bytes == persistent


def test_profiling_times_every_kernel_and_copy_per_stream_on_cuda():
    g = mixed_net(n=2, hw=4)
    model = Model(g, MemoryConfig(liveness=True, offload=True), device=CudaDevice())
    model.runtime.profile = True
    x, labels = _data(g)
    model.forward_backward(x, labels)
    events = model.runtime.stream_events
    streams = {e["stream"] for e in events}
    assert streams == {"compute", "copy_out", "copy_in"}
    assert sum(e["stream"] == "compute" for e in events) >= len(g.layers)
    assert all(e["end_ms"] >= e["start_ms"] >= 0 for e in events)
    host = Model(g, MemoryConfig(liveness=True, offload=True), device="host")
    host.runtime.profile = True
    host.forward_backward(x, labels)
    assert host.runtime.stream_events == []  # the host has no streams to time
