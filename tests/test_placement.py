"""The placement pass: plans become programs whose memory is exactly what the stages promise; stages
only ever lower the peak; budgets (device and pinned host) fail before anything runs and say why;
the arena and the pinned slab are the programs' high-water marks."""
import numpy as np
import pytest

from nets import grouped_net, mixed_net
from snlite.config import MemoryConfig
from snlite.device import MetaDevice
from snlite.models import get_model
from snlite.budget import smallest_budget
from snlite.errors import BudgetError, HostBudgetError
from snlite.pipeline import place, simulate
from snlite.scheduler import optimizer_specs
from snlite.program import Alloc, Copy, Launch, Wait
from snlite.scheduler import PERSISTENT_KINDS, Scheduler, validate_plan
from snlite.train import Model


def high_water(program, space: str) -> int:
    """The highest end offset any allocation of ``space`` reaches, recomputed from the instructions."""
    return max((i.offset + i.nbytes for i in (*program.setup, *program.body)
                if type(i) is Alloc and i.space == space), default=0)


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
    program = place(g, MemoryConfig(liveness=True, offload=True))
    copies = [i for i in program.body if type(i) is Copy and i.why in ("offload", "prefetch")]
    assert sorted(c.tensor for c in copies) == sorted(moved) * 2
    assert {c.stream for c in copies} == {"copy_out", "copy_in"}, "copies never run on the compute stream"


def test_recompute_strategies_trade_compute_for_memory():
    g = mixed_net(n=4)
    lv = simulate(g, MemoryConfig(liveness=True))
    traces = {s: simulate(g, MemoryConfig(liveness=True, recompute=s))
              for s in ("speed", "memory", "cost_aware")}
    assert traces["memory"].recompute_count >= traces["cost_aware"].recompute_count >= \
        traces["speed"].recompute_count > 0
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
    arena = place(g, MemoryConfig(liveness=True)).arena_bytes  # the pool it needs (its peak + fragmentation)
    tight = MemoryConfig(liveness=True, workspace="dynamic", budget_bytes=arena + 16 * 1024)
    dyn = simulate(g, tight)
    assert dyn.peak_bytes <= tight.budget_bytes
    chosen = {(c.step, c.op): (c.algo, c.chunk) for c in dyn.conv_choices}
    best = {(c.step, c.op): (c.algo, c.chunk) for c in fastest.conv_choices}
    assert chosen != best, "a tight pool must force a smaller workspace somewhere"
    launches = [i for i in place(g, tight).body if type(i) is Launch and i.convs]
    assert all(i.workspace is None or i.workspace.endswith(".workspace") for i in launches)


@pytest.mark.parametrize("name", ["alexnet", "inception_v4", "grouped"])
def test_mode_none_and_the_arena_bound_rank_nothing_and_agree_with_the_ranking(name):
    """Mode "none" runs the direct algorithm without ranking the candidates, and the arena's upper
    bound takes the largest workspace without estimating a time: both must be what the full ranking
    says (the direct candidate without workspace; the largest workspace of any candidate)."""
    from snlite import workspace as ws

    g = grouped_net(n=6) if name == "grouped" else get_model(name, batch=6)
    convs = [layer for layer in g.layers.values() if layer.kind == "conv2d"]
    assert any(layer.groups > 1 for layer in convs) == (name == "grouped")
    ranked = ws.Ranked(ws.CostModel())
    for layer in convs:
        for op in ws.CONV_OPS:
            every = ws.candidates(layer, op)
            direct = next(c for c in every if c.algo == "direct" and c.workspace_bytes == 0)
            assert ws.choose(layer, op, "none", 123) == direct
            assert ranked.step(layer, "backward" if op != "forward" else "forward", "none", 0)[0] == tuple(
                (o, "direct", 1, 0) for o in (("forward",) if op == "forward" else
                                              ("backward_filter", "backward_data")))
            assert ws._largest_workspace(ws.conv_key(layer), op) == max(c.workspace_bytes for c in every)
    assert ranked.largest_workspace(g) == max(c.workspace_bytes for layer in convs for op in ws.CONV_OPS
                                              for c in ws.candidates(layer, op)) > 0


@pytest.mark.parametrize("name", ["lenet", "alexnet", "vgg16", "resnet50", "resnet101", "resnet152",
                                  "inception_v4", "densenet121", "cifar_resnet20"])
def test_peaks_never_rise_as_stages_are_added(name):
    g = get_model(name, batch=8)
    ladder = [MemoryConfig(), MemoryConfig(liveness=True), MemoryConfig(liveness=True, offload=True),
              MemoryConfig(liveness=True, offload=True, recompute="cost_aware")]
    peaks = []
    for cfg in ladder:
        persistent = {n for n, t in g.tensors().items() if t.kind in PERSISTENT_KINDS}
        validate_plan(Scheduler(g, cfg).plan(), persistent)
        trace = simulate(g, cfg)
        peaks.append(trace.peak_bytes)
        assert trace.l_peak_bytes <= trace.peak_bytes
    assert peaks == sorted(peaks, reverse=True), f"{name}: peaks {peaks} rose as a stage was added"


@pytest.mark.parametrize("name,config", [
    ("lenet", MemoryConfig()), ("alexnet", MemoryConfig(liveness=True, offload=True)),
    ("resnet50", MemoryConfig.superneurons()),
    ("inception_v4", MemoryConfig.superneurons(recompute="memory")),
    ("densenet121", MemoryConfig(liveness=True, allocator="raw"))])
def test_arena_and_slab_are_the_programs_high_water_marks(name, config):
    g = get_model(name, batch=4)
    model = Model(g, config, device=MetaDevice())
    programs = model.programs.values()
    for p in programs:
        assert p.arena_bytes == (0 if config.allocator == "raw" else high_water(p, "arena"))
        assert p.slab_bytes == high_water(p, "slab")
    arena = max(p.arena_bytes for p in programs)
    if config.allocator == "raw":  # no arena: one device buffer per tensor, the weights' so far
        arena = sum(i.nbytes for i in model.programs[model.step_mode].setup)
    assert model.device.arena_bytes == arena \
        and model.device.pinned_bytes == max(p.slab_bytes for p in programs)
    if config.allocator == "pool":  # the arena is what the placement reached, not "every tensor at once"
        tensors = [*g.tensors().values(), *optimizer_specs(g).values()]
        everything = sum(-(-max(t.nbytes, 1) // 1024) * 1024 for t in tensors)
        assert arena < everything or config == MemoryConfig()


def test_pinned_slab_is_what_the_plan_moves_not_everything_that_could_move():
    """ResNet-50 at batch 384 in 12 GiB under superneurons(): the cache moves some activations, and
    the slab holds those (and the staged batch), not every evictable tensor at once (~159 GiB)."""
    g = get_model("resnet50", batch=384)
    config = MemoryConfig.superneurons(budget_bytes=12 * 2**30)
    program = place(g, config)
    trace = simulate(g, config)
    assert program.arena_bytes == high_water(program, "arena") <= config.budget_bytes
    assert program.slab_bytes == high_water(program, "slab") >= trace.host_peak_bytes > 0
    assert program.slab_bytes < 2 * trace.host_peak_bytes < 40 * 2**30


def test_a_budget_too_small_fails_before_running_and_names_the_fix():
    g = mixed_net()
    cfg = MemoryConfig(liveness=True)
    need = smallest_budget(g, cfg)
    assert need >= simulate(g, cfg).peak_bytes
    # a lo that fits is the answer (it was skipped: lo is where the search starts, and it came back a
    # block above the answer, unless hi was given too)
    assert smallest_budget(g, cfg, lo=need) == smallest_budget(g, cfg, lo=need - 1000) == need
    assert smallest_budget(g, cfg, lo=need, hi=need) == need
    Model(g, cfg.replace(budget_bytes=need), device="host")  # fits exactly
    with pytest.raises(BudgetError, match=r"at step \d+ \(\w+ \w+\), .* needs [\d,]+ bytes .* Live there: "
                                          r".*The smallest budget that works under this configuration is "
                                          rf"{need:,d} bytes"):
        Model(g, cfg.replace(budget_bytes=need - 1024), device="host")
    with pytest.raises(BudgetError, match="while placing the weights"):
        Model(g, cfg.replace(budget_bytes=4096), device="host")


def test_a_host_budget_too_small_fails_early_and_names_the_pinned_memory():
    g = mixed_net(n=4)
    cfg = MemoryConfig(liveness=True, offload=True)
    slab = place(g, cfg).slab_bytes
    Model(g, cfg.replace(host_budget_bytes=slab), device="host")  # exactly the slab: fits
    pinned = (r"does not fit a host budget of [\d,]+ bytes of pinned memory .* at step \d+ \(\w+ \w+\), "
              r"[\w.:]+ needs [\d,]+ bytes .* On the host there: "
              r".*The smallest host budget that works .* is ")
    with pytest.raises(HostBudgetError, match=pinned):
        Model(g, cfg.replace(host_budget_bytes=slab - 256), device="host")
    with pytest.raises(HostBudgetError, match="while staging the batch"):
        place(g, cfg.replace(host_budget_bytes=256))
    with pytest.raises(HostBudgetError, match=r"the results need [\d,]+ bytes\. The smallest host budget"):
        Model(g, cfg.replace(host_budget_bytes=256), device="host")


def test_a_budget_error_names_the_moment_it_failed_even_off_the_route():
    """Not the route's last step for the SGD updates after backward (step -1), nor "at evict" for an
    eviction the host cannot take: the updates, and the step the eviction made room for."""
    g = get_model("lenet", batch=2)
    host_state = MemoryConfig(liveness=True, optimizer_state="host")
    arena = place(g, host_state).arena_bytes
    with pytest.raises(BudgetError, match=r"in the SGD updates after backward, \S+\.momentum needs"):
        place(g, host_state.replace(budget_bytes=arena - 1024))
    g = get_model("cifar_resnet20", batch=8)
    cache = MemoryConfig(liveness=True, cache=True, budget_bytes=6_000_000, host_budget_bytes=200_000)
    with pytest.raises(HostBudgetError, match=r"at step \d+ \([\w.]+ (forward|backward)\), conv1 needs"):
        place(g, cache)


def test_inference_frees_each_activation_after_its_last_forward_use():
    """Under liveness an inference pass frees what its forward no longer reads (the training plan
    frees it after backward, which inference skips: the pass held every activation)."""
    from snlite.program import Free
    from snlite.trace import trace_program

    g = get_model("alexnet", batch=4)
    program = place(g, MemoryConfig(liveness=True), "infer")
    logits = g.output_tensor(g.inputs[g.loss_layer][0])
    launches = [i for i, ins in enumerate(program.body) if type(ins) is Launch]
    last = {}
    for i in launches:
        for t in (*program.body[i].reads, *program.body[i].writes):
            last[t] = i
    freed = {ins.tensor: i for i, ins in enumerate(program.body)
             if type(ins) is Free and ins.space == "arena"}
    kinds = {n: t.kind for n, t in g.tensors().items()}
    for t, i in last.items():
        if kinds.get(t) == "activation" and t != logits:
            after = next((j for j in launches if j > i), len(program.body))
            assert freed[t] < after, f"{t}, last used by body #{i}, still held at the next launch"
    baseline = trace_program(place(g, MemoryConfig(), "infer"), "paper").peak_bytes
    assert trace_program(program, "paper").peak_bytes < baseline / 3


def test_trace_and_plan_are_readable():
    g = mixed_net()
    cfg = MemoryConfig.superneurons(cache=False)
    sched = Scheduler(g, cfg)
    text = str(sched)
    for stage in ("recompute", "liveness", "offload", "cache", "workspace"):
        assert stage in text
    table = sched.plan().table()
    assert "offload conv2" in table and "release conv2" in table and "prefetch conv2" in table \
        and "recompute" in table
    tr = simulate(g, cfg)
    assert tr.steps and tr.peak_step >= 0 and tr.peak_tensors and tr.ratio >= 1.0
    assert sum(b for _, b in tr.peak_tensors) <= tr.peak_bytes
    assert "peak" in tr.summary() and "act" in tr.table(limit=5)


def test_every_wait_says_why_and_copies_wait_for_their_producers():
    program = place(mixed_net(), MemoryConfig.superneurons(cache=False))
    whys = {i.why for i in program.body if type(i) is Wait}
    assert whys == {"ready", "reuse", "release", "landed", "end"}
    for k, ins in enumerate(program.body):
        if type(ins) is Copy and ins.stream == "copy_out":
            assert type(program.body[k - 1]) is Wait and program.body[k - 1].why == "ready", \
                program.table(start=k - 3, limit=5)


def test_inference_program_reads_the_logits_and_moves_nothing_eagerly():
    g = mixed_net()
    program = place(g, MemoryConfig(liveness=True, offload=True), "infer")
    assert {i.phase for i in program.launches()} == {"forward"}
    assert not [i for i in program.body if type(i) is Copy and i.why not in ("input", "result")]
    assert [i.tensor for i in program.body if type(i) is Copy and i.why == "result"] == ["fc1"]
    assert "labels" not in {i.tensor for i in program.body if type(i) is Copy}


def test_simulate_without_optimizer_has_no_updates():
    g = mixed_net()
    with_sgd, without = place(g, MemoryConfig()), place(g, MemoryConfig(), "grads", optimizer=False)
    assert any(i.phase == "update" for i in with_sgd.launches())
    assert not any(i.phase == "update" for i in without.launches())
    assert sum(t.nbytes for t in optimizer_specs(g).values()) > 0
    assert simulate(g, optimizer=False).peak_bytes < simulate(g).peak_bytes
    with pytest.raises(ValueError, match="needs the optimizer state"):
        place(g, MemoryConfig(), "train", optimizer=False)
    with pytest.raises(ValueError, match="unknown mode"):
        place(g, MemoryConfig(), "eval")


def test_a_probe_answers_as_place_does_and_finishes_to_its_program():
    """pipeline.probe (what a search asks: does it fit?) agrees with place() at every budget around
    the edge, and its final() is place()'s program byte for byte (auto state, cache refinement)."""
    import json

    from snlite.pipeline import probe

    for g in (mixed_net(), get_model("lenet", batch=8)):
        full = place(g, MemoryConfig.superneurons()).arena_bytes
        for tenth in range(3, 12):
            config = MemoryConfig.superneurons(budget_bytes=max(1024, full * tenth // 10 // 1024 * 1024))
            try:
                expected = json.dumps(place(g, config).to_json(), sort_keys=True)
            except BudgetError:
                expected = None
            found = probe(g, config)
            assert (found is None) == (expected is None), (g.name, tenth)
            if found is not None:
                assert json.dumps(found.final().to_json(), sort_keys=True) == expected, (g.name, tenth)


def test_the_smallest_host_budget_of_a_plan_that_offloads_nothing_is_its_staging():
    """With nothing offloaded the unlimited placement's host pool is empty, and the search took that, 0,
    as its ceiling: Model(g, MemoryConfig(host_budget_bytes=256)) said "host_budget_bytes must be at least
    256, got 0" instead of how much pinned memory the batch needs."""
    from snlite.train import Model

    g = get_model("lenet", 8)
    need = smallest_budget(g, MemoryConfig(), host=True)
    assert need > 256 and simulate(g, MemoryConfig(host_budget_bytes=need)).peak_bytes
    with pytest.raises(HostBudgetError):
        simulate(g, MemoryConfig(host_budget_bytes=need - 256))
    with pytest.raises(HostBudgetError, match=f"The smallest host budget that works under this configuration "
                                              f"is {need:,d} bytes"):
        Model(g, MemoryConfig(host_budget_bytes=256), device="meta")


def test_a_plan_given_must_be_of_this_graph_and_of_the_configs_switches():
    """A superneurons() plan placed under MemoryConfig() ran its recomputation, offload and updates in
    backward labelled "baseline"; a plan of another graph raised a bare KeyError, a str AttributeError."""
    from snlite import Scheduler
    from snlite.train import Model

    g = get_model("lenet", 8)
    sn = Scheduler(g, MemoryConfig.superneurons()).plan()
    with pytest.raises(ValueError, match=r"the plan was made under liveness=True, offload=True, cache=True, "
                                         r"update_in_backward=True, the config says liveness=False"):
        simulate(g, MemoryConfig(), plan=sn)
    with pytest.raises(ValueError, match="the plan was made under"):
        Model(g, MemoryConfig(), device="meta", plan=sn)
    with pytest.raises(ValueError, match=r"the plan is of another graph: alexnet has no layer '\w+'"):
        place(get_model("alexnet", 2), MemoryConfig.superneurons(), plan=sn)
    with pytest.raises(ValueError, match=r"plan must be a Plan \(Scheduler\(graph, config\)\.plan\(\)\), "
                                         r"got str"):
        place(g, plan="x")
    # the same switches with other budgets, fit or schedule: the plan is the config's
    assert place(g, MemoryConfig.superneurons(budget_bytes=1 << 30, fit="best"), plan=sn).arena_bytes
    # a plan's own recomputation runs under liveness alone (the exact planner's, sqrt(N)'s)
    speed = Scheduler(g, MemoryConfig(liveness=True, recompute="speed")).plan()
    assert simulate(g, MemoryConfig(liveness=True), plan=speed).recompute_count > 0


@pytest.mark.parametrize("call", ["simulate", "place", "refine", "anomaly", "return_logits"])
def test_a_switch_outside_memory_config_is_true_or_false_not_anything_truthy(call):
    """anomaly="no" switched the anomaly checks on; optimizer="no" counted the momentum."""
    from snlite.train import Model

    g = get_model("lenet", 2)
    with pytest.raises(ValueError, match=r"must be True or False, got 'no'"):
        {"simulate": lambda: simulate(g, optimizer="no"), "place": lambda: place(g, optimizer="no"),
         "refine": lambda: place(g, refine="no"),
         "anomaly": lambda: Model(g, device="meta", anomaly="no"),
         "return_logits": lambda: Model(g, device="host").step(
             np.zeros((2, 1, 28, 28), np.float32), np.zeros(2, np.int32), return_logits="no")}[call]()


@pytest.mark.parametrize("kwargs,match", [
    (dict(block=-1), r"smallest_budget's block \(bytes\) must be an integer >= 1, got -1"),  # answered 5.7 MB
    (dict(block=0), r"block \(bytes\) must be an integer >= 1, got 0"),
    (dict(lo="1KiB"), r"smallest_budget's lo \(bytes\) must be an integer >= 0, got '1KiB'"),  # a TypeError
    (dict(lo=10**9, hi=10), r"smallest_budget's hi \(10 bytes\) is below its lo \(1,000,000,000\)"),
    (dict(host="yes"), r"smallest_budget's host must be True or False"),
])
def test_smallest_budget_refuses_arguments_that_are_no_bytes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        smallest_budget(get_model("lenet", batch=2), MemoryConfig(liveness=True), **kwargs)
