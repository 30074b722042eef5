"""The exact planner (snlite.optimal): its integer program counts memory as the trace does, launch by
launch; its optimum is the brute-force optimum on a chain; its plans run bit-identically."""
import itertools
import json
import random
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("scipy", reason="the exact planner needs scipy: pip install -e '.[optimal]'")

from nets import data_for, mixed_net  # noqa: E402
from snlite.pipeline import simulate
from snlite import Graph, MemoryConfig, Model, cli, gap, measure, optimal  # noqa: E402
from snlite import optimal_offload as oo  # noqa: E402
from snlite.checker import check  # noqa: E402
from snlite.errors import BudgetError  # noqa: E402
from snlite.models import cifar_resnet, get_model, lenet, mini_inception  # noqa: E402
from snlite.pipeline import place  # noqa: E402
from snlite.scheduler import Scheduler, validate_plan  # noqa: E402
from snlite.timing import estimate  # noqa: E402


def chain6(n=4, channels=(4, 6)):
    """Six layers a plan may drop, in a chain: conv, relu, conv, relu, pool, fc (and the loss)."""
    g = Graph(input_shape=(n, 2, 8, 8), num_classes=3, name="chain6")
    x = g.relu(g.conv2d(g.input(), channels[0], 3, padding=1, name="conv1"), name="relu1")
    x = g.relu(g.conv2d(x, channels[1], 3, padding=1, name="conv2"), name="relu2")
    g.softmax_loss(g.linear(g.flatten(g.maxpool(x, 2, name="pool1")), 3, name="fc1"))
    return g


def chain4(n=2):
    """Three layers a plan may drop (conv, relu, pool) before the fc: small enough to enumerate
    every plan of the program that re-runs a layer as often as it likes."""
    g = Graph(input_shape=(n, 2, 6, 6), num_classes=3, name="chain4")
    x = g.relu(g.conv2d(g.input(), 3, 3, padding=1, name="conv1"), name="relu1")
    g.softmax_loss(g.linear(g.flatten(g.maxpool(x, 2, name="pool1")), 3, name="fc1"))
    return g


def _needs(model, L, chosen):
    """Backward positions where L's outputs must exist: read by a backward step, or by a chosen re-run."""
    pos = {s: j for j, s in enumerate(model.bstages)}
    return ({j for u in model.outs[L] for j in model.bread.get(u, ())}
            | {pos[s] for M in model.cons[L] if M in chosen for s in chosen[M]})


def _random_reruns(model, rng):
    """A random plan of Model(reruns="any"): dropped layers re-run at their first need and at some
    later ones."""
    chosen = {}
    for L in reversed(model.cands):
        if rng.random() < 0.5:
            needs = sorted(_needs(model, L, chosen))
            pick = needs[:1] + [j for j in needs[1:] if rng.random() < 0.5]
            chosen[L] = tuple(model.bstages[j] for j in pick)
    return chosen


def _every_plan(model):
    """Every plan of Model(reruns="any"): each layer kept, or dropped and re-run before any subset of the
    steps it may be re-run at such that each read of its outputs finds an incarnation made by then."""
    def walk(i, chosen):
        if i < 0:
            yield dict(chosen)
            return
        L = model.cands[i]
        yield from walk(i - 1, chosen)
        S, needs = sorted(model.starts[L]), _needs(model, L, chosen)
        for sub in (c for r in range(len(S) + 1) for c in itertools.combinations(S, r)):
            if all(any(q <= t for q in sub) for t in needs):
                chosen[L] = tuple(model.bstages[j] for j in sub)
                yield from walk(i - 1, chosen)
                del chosen[L]
    yield from walk(len(model.cands) - 1, {})


def _count_every_plan(model):
    """Every plan of Model(reruns="any") (as :func:`_every_plan` walks them) with its peak and extra FLOPs,
    counted by the program's own sums (:meth:`Model.slot_bytes`, checked against the trace launch by
    launch above) but for all plans at once: the walk sets each layer's decision variables once per
    choice (:meth:`Model._assign`, memoized: they depend only on its re-runs and its consumers'), then
    each ``alive`` is its largest reason and each slot its sum, as matrix products. 78,332 plans of
    chain6 take about a second this way, against about 30 s through plan_for and the trace (the test
    runs the frontier's plans and a sample of the others through the trace)."""
    n = len(model.names)

    def columns(L):
        return [model.d[L], *model.rv.get(L, {}).values(), *model.fv.get(L, {}).values(),
                *(v for u in model.outs[L] for v in model.cv.get(u, {}).values())]

    memo, rows, plans = {}, [], []
    x = np.zeros(n)

    def options(L, chosen):
        """L's choices (kept, or re-run before these steps) and its variables under each, given its
        consumers' choices: what :func:`_every_plan` walks."""
        theirs = {M: chosen[M] for M in model.cons[L] if M in chosen}
        key = (L, tuple(theirs.items()))
        if key not in memo:
            S, needs = sorted(model.starts[L]), _needs(model, L, theirs)
            memo[key] = [(None, np.zeros(len(columns(L))))] + [
                (when, model._assign({L: when, **theirs})[columns(L)])
                for sub in (c for r in range(len(S) + 1) for c in itertools.combinations(S, r))
                if all(any(q <= t for q in sub) for t in needs)
                for when in [tuple(model.bstages[j] for j in sub)]]
        return memo[key]

    def walk(i, chosen):
        if i < 0:
            rows.append(x.copy()), plans.append(dict(chosen))
            return
        L = model.cands[i]
        cols = columns(L)
        for when, values in options(L, chosen):
            x[cols] = values
            if when is not None:
                chosen[L] = when
            walk(i - 1, chosen)
            chosen.pop(L, None)
        x[cols] = 0.0

    walk(len(model.cands) - 1, {})
    X = np.array(rows)

    def matrix(exprs):  # dense: chain6's program has 168 variables
        A = np.zeros((len(exprs), n))
        for r, e in enumerate(exprs):
            for v, c in e.items():
                if v != -1:
                    A[r, v] = c
        return A.T, np.array([e.get(-1, 0.0) for e in exprs])

    alive = list(model.reasons)
    reasons = [r for v in alive for r in model.reasons[v]]
    starts = np.cumsum([0] + [len(model.reasons[v]) for v in alive])[:-1]
    A, a0 = matrix(reasons)
    X[:, alive] = np.maximum(np.maximum.reduceat(X @ A + a0, starts, axis=1), 0.0)
    M, m0 = matrix(model.memory)
    peaks = (X @ M + m0).max(axis=1).round().astype(np.int64)
    E, e0 = matrix([model.extra])
    flops = (X @ E + e0)[:, 0].round().astype(np.int64)
    return plans, peaks, flops


def _launch_slots(model, trace):
    """The program's slot for every launch the trace recorded."""
    bpos = {s: j for j, s in enumerate(model.bstages)}
    index = {s: i for i, s in enumerate(model.slots)}
    out = []
    for r in trace.op_steps:
        kind = {"forward": "f", "recompute": "r"}.get(r.phase, "b")
        out.append(index[(kind, r.step if kind == "f" else bpos[r.step], r.layer if kind == "r" else None)])
    return out


@pytest.mark.parametrize("count", ["all", "paper"])
@pytest.mark.parametrize("build", [mixed_net, chain6, lambda: lenet(8), lambda: cifar_resnet(8, 1),
                                   lambda: mini_inception(2)],
                         ids=["mixed", "chain6", "lenet", "resnet8", "inception"])
def test_the_program_counts_every_launch_as_the_trace_does(build, count):
    g = build()
    model = optimal.Model(g, count, reruns="once")
    rng = random.Random(7)
    for _ in range(4):
        dropped = tuple(L for L in model.cands if rng.random() < 0.5)
        plan = optimal.plan_for(g, dropped)
        m = measure.measure(g, plan.config, plan=plan)
        trace = m.trace if count == "all" else m.paper
        held = model.slot_bytes(dropped)
        counted = [r.counted_bytes for r in trace.op_steps]
        assert [held[i] for i in _launch_slots(model, trace)] == counted, dropped
        assert model.peak_of(dropped) == trace.peak_bytes
        assert model.extra_flops_of(dropped) == trace.extra_flops


@pytest.fixture(scope="module")
def brute():
    """Every drop set of chain6, executed on the meta device: (dropped, peak, extra FLOPs)."""
    g = chain6()
    out = []
    for k in range(len(optimal.candidates(g)) + 1):
        for dropped in itertools.combinations(optimal.candidates(g), k):
            trace = simulate(g, optimal.CONFIG, plan=optimal.plan_for(g, dropped))
            out.append((dropped, trace.peak_bytes, trace.extra_flops))
    return g, out


def test_brute_force_on_a_chain_agrees_with_the_solver(brute):
    g, plans = brute
    assert len(plans) == 2 ** 6
    model = optimal.Model(g, reruns="once")
    flops = sorted({f for _, _, f in plans})
    for allowance in (None, 0, *flops[1:-1:max(1, len(flops) // 5)]):
        best = min(p for _, p, f in plans if allowance is None or f <= allowance)
        r = optimal.solve(g, allowance=allowance, model=model)
        assert r.optimal and r.gap == 0.0
        assert r.peak_bytes == best, allowance
        assert simulate(g, r.plan.config, plan=r.plan).peak_bytes == best
        # among the plans of that peak, the fewest extra FLOPs
        assert r.extra_flops == min(f for _, p, f in plans
                                    if p == best and (allowance is None or f <= allowance))
    peaks = sorted({p for _, p, _ in plans})
    assert peaks[0] < peaks[-1]  # recomputation matters on this chain
    for budget in peaks[::3]:
        fewest = min(f for _, p, f in plans if p <= budget)
        r = optimal.solve(g, "flops", budget=budget, model=model)
        assert r.optimal and r.extra_flops == fewest and r.peak_bytes <= budget, budget
    r = optimal.solve(g, "flops", budget=peaks[0] - 1024, model=model)
    assert r.plan is None and r.status == "infeasible"
    assert "no plan" in r.summary()


@pytest.mark.parametrize("build", [chain6, mixed_net, lambda: lenet(16), lambda: mini_inception(2)],
                         ids=["chain6", "mixed", "lenet", "inception"])
def test_the_optimal_plan_runs_bit_identically_with_the_planned_peak(build):
    g = build()
    r = optimal.solve(g, count="paper", reruns="once")
    assert r.optimal
    dropped = r.dropped or tuple(optimal.candidates(g))  # LeNet: no drop lowers its peak; drop them all then
    plan, peak = optimal.plan_for(g, dropped), optimal.Model(g, "paper", reruns="once").peak_of(dropped)
    validate_plan(plan, optimal.Scheduler(g, optimal.CONFIG).persistent())
    x, labels = data_for(g)
    base = Model(g, MemoryConfig(), device="host")
    model = Model(g, plan.config, device="host", plan=plan)
    for program in model.programs.values():
        check(program)
    for _ in range(2):
        loss0, loss1 = base.step(x, labels, lr=0.1, momentum=0.9), model.step(x, labels, lr=0.1, momentum=0.9)
        assert loss0 == loss1
    p0, p1 = base.params, model.params
    assert all(np.array_equal(p0[k], p1[k]) for k in p0)
    assert model.trace.recompute_count > 0
    assert simulate(g, plan.config.replace(count="paper"), plan=plan).peak_bytes == peak


def test_a_graph_too_big_for_the_time_limit_says_so():
    g = cifar_resnet(8, 2)
    r = optimal.solve(g, time_limit=0.05)
    assert not r.optimal and r.status.startswith("time limit") and "time limit" in r.summary()
    # the best plan found (by the solver, or the best simple one), with its gap where there is a bound
    assert r.plan is not None and (r.gap is None or r.gap >= 0)
    assert r.gap is None or r.bound <= r.peak_bytes
    assert simulate(g, r.plan.config, plan=r.plan).peak_bytes == r.peak_bytes


def test_bad_requests_say_what_to_do():
    g = chain6()
    with pytest.raises(ValueError, match="needs a byte budget"):
        optimal.solve(g, "flops")
    with pytest.raises(ValueError, match="choose among"):
        optimal.plan_for(g, ["softmax"])
    with pytest.raises(ValueError, match="unknown objective"):
        optimal.solve(g, "speed")


# ---------------------------------------------------------------- re-runs as often as the solver likes
@pytest.mark.parametrize("build", [mixed_net, lambda: cifar_resnet(8, 1), lambda: mini_inception(2)],
                         ids=["mixed", "resnet8", "inception"])
def test_the_any_program_counts_every_launch_as_the_trace_does(build):
    g = build()
    rng = random.Random(3)
    for count in ("all", "paper"):
        model = optimal.Model(g, count, reruns="any")
        for _ in range(3):
            chosen = _random_reruns(model, rng)
            plan = optimal.plan_for(g, chosen)
            validate_plan(plan, optimal.Scheduler(g, optimal.CONFIG).persistent())
            m = measure.measure(g, plan.config, plan=plan)
            trace = m.trace if count == "all" else m.paper
            held = model.slot_bytes(chosen)
            counted = [r.counted_bytes for r in trace.op_steps]
            assert [held[i] for i in _launch_slots(model, trace)] == counted, chosen
            assert model.extra_flops_of(chosen) == trace.extra_flops


def test_brute_force_over_every_any_plan_of_a_chain_agrees_with_the_solver():
    g = chain4()
    model = optimal.Model(g, "paper", reruns="any")
    plans = []
    for chosen in _every_plan(model):
        trace = simulate(g, optimal.CONFIG.replace(count="paper"), plan=optimal.plan_for(g, chosen))
        plans.append((chosen, trace.peak_bytes, trace.extra_flops))
    assert len(plans) == 196 and any(len(s) > 1 for c, _, _ in plans for s in c.values())  # docs/optimal.md
    for allowance in (None, *sorted({f for _, _, f in plans})):
        best = min(p for _, p, f in plans if allowance is None or f <= allowance)
        r = optimal.solve(g, allowance=allowance, model=model)
        assert r.optimal and r.peak_bytes == best, allowance
        assert simulate(g, r.plan.config.replace(count="paper"), plan=r.plan).peak_bytes == best
    for budget in sorted({p for _, p, _ in plans}):
        r = optimal.solve(g, "flops", budget=budget, model=model)
        assert r.extra_flops == min(f for _, p, f in plans if p <= budget), budget


def test_brute_force_over_every_any_plan_of_a_six_layer_chain_agrees_with_the_solver():
    g = chain6()
    model = optimal.Model(g, "paper")
    plans, peaks, flops = _count_every_plan(model)
    assert len(plans) == 78_332 and max(len(w) for c in plans for w in c.values()) == 5
    # the frontier: the least peak for each FLOP allowance; each corner plan, and a sample of the others,
    # executed on the meta device with the peak and FLOPs the sums gave
    order = np.lexsort((peaks, flops))  # by FLOPs, then peak
    least = np.minimum.accumulate(peaks[order])
    corners = [int(order[0])] + [int(i) for i, a, b in zip(order[1:], least, least[1:]) if b < a]
    assert len(corners) >= 5
    cfg = optimal.CONFIG.replace(count="paper")
    for i in corners + random.Random(5).sample(range(len(plans)), 40):
        trace = simulate(g, cfg, plan=optimal.plan_for(g, plans[i]))
        assert (trace.peak_bytes, trace.extra_flops) == (peaks[i], flops[i]), plans[i]
    # the solver just below three corners' FLOPs, and at budgets of three corners' peaks
    for i in corners[1:4]:
        r = optimal.solve(g, allowance=int(flops[i]) - 1, model=model)
        assert r.optimal and r.peak_bytes == peaks[flops < flops[i]].min() and r.extra_flops < flops[i], i
    for i in corners[:-1:2]:
        r = optimal.solve(g, "flops", budget=int(peaks[i]), model=model)
        assert r.optimal and r.extra_flops == flops[peaks <= peaks[i]].min() and r.peak_bytes <= peaks[i], i
    r = optimal.solve(g, model=model)
    assert r.peak_bytes == peaks.min() and r.extra_flops == flops[peaks == peaks.min()].min()
    assert simulate(g, cfg, plan=r.plan).peak_bytes == peaks.min()


@pytest.mark.parametrize("build", [mixed_net, lambda: cifar_resnet(8, 1)], ids=["mixed", "resnet8"])
def test_superneurons_plans_are_plans_of_the_any_program_with_the_same_peak(build):
    g = build()
    model = optimal.Model(g, "paper")
    for strategy in ("speed", "memory", "cost_aware"):
        plan = Scheduler(g, optimal.CONFIG.replace(recompute=strategy)).plan()
        chosen = optimal.reruns_of(g, plan)
        trace = simulate(g, optimal.CONFIG.replace(count="paper"), plan=plan)
        assert model.peak_of(chosen) == trace.peak_bytes and model.extra_flops_of(chosen) == trace.extra_flops


def test_the_any_optimum_runs_with_its_peak_and_no_heuristic_beats_it():
    g = mixed_net()
    rows = gap.gap_rows(g, "paper", reruns="any")
    assert all(r.gap_pct >= 0 for r in rows)  # memory-centric's plans are in this program's space
    once = optimal.solve(g, count="paper", reruns="once")
    best = optimal.solve(g, count="paper")
    assert best.optimal and best.peak_bytes <= once.peak_bytes
    assert simulate(g, best.plan.config.replace(count="paper"), plan=best.plan).peak_bytes == best.peak_bytes
    x, labels = data_for(g)
    base = Model(g, MemoryConfig(), device="host")
    model = Model(g, best.plan.config, device="host", plan=best.plan)
    assert base.step(x, labels, lr=0.1) == model.step(x, labels, lr=0.1)
    assert all(np.array_equal(base.params[k], model.params[k]) for k in base.params)


# ---------------------------------------------------------------- the offload model
def _every_offload(model):
    """Every choice of the offload program: each candidate stays, or comes back before one of its ops."""
    options = [[None, *model.p[u]] for u in model.cands]
    for pick in itertools.product(*options):
        yield {u: k for u, k in zip(model.cands, pick) if k is not None}


@pytest.mark.parametrize("count", ["all", "paper"])
def test_the_offload_program_counts_every_launch_and_runs_bit_identically(count):
    g = mixed_net()
    model = oo.OffloadModel(g, count)
    rng = random.Random(4)
    for _ in range(4):
        chosen = {u: rng.choice(list(model.p[u])) for u in model.cands if rng.random() < 0.5}
        plan = oo.plan_for(g, chosen, model.base_plan)
        m = measure.measure(g, plan.config, plan=plan)
        trace = m.trace if count == "all" else m.paper
        assert model.bytes_at(chosen) == [r.counted_bytes for r in trace.op_steps], chosen
        assert m.moved_bytes == sum(2 * g.tensors()[u].nbytes for u in chosen)
    r = oo.solve(g, count=count, model=model)
    assert r.optimal and r.prefetch
    x, labels = data_for(g)
    base, run = Model(g, MemoryConfig(), device="host"), Model(g, r.plan.config, device="host", plan=r.plan)
    for program in run.programs.values():
        check(program)
    assert base.step(x, labels, lr=0.1) == run.step(x, labels, lr=0.1)
    assert all(np.array_equal(base.params[k], run.params[k]) for k in base.params)
    trace = simulate(g, r.plan.config.replace(count=count), plan=r.plan)
    assert trace.peak_bytes == r.peak_bytes and trace.d2h_bytes + trace.h2d_bytes == r.moved_bytes


def test_brute_force_over_every_offload_plan_agrees_with_the_solver():
    g = chain4()  # every plan executed
    model = oo.OffloadModel(g, "paper")
    plans = []
    for chosen in _every_offload(model):
        m = measure.measure(g, oo.CONFIG, plan=oo.plan_for(g, chosen, model.base_plan))
        plans.append((m.paper.peak_bytes, m.moved_bytes))
    assert len(plans) == 90
    for allowance in sorted({b for _, b in plans}):
        r = oo.solve(g, allowance=allowance, count="paper", model=model)
        assert r.peak_bytes == min(p for p, b in plans if b <= allowance), allowance
    for budget in sorted({p for p, _ in plans}):
        r = oo.solve(g, "moved", budget=budget, count="paper", model=model)
        assert r.moved_bytes == min(b for p, b in plans if p <= budget), budget
    g = chain6()  # its 5,040 plans counted by the program's own sums (checked against the trace above)
    model = oo.OffloadModel(g, "all")
    plans = [(max(model.bytes_at(c)), sum(2 * g.tensors()[u].nbytes for u in c))
             for c in _every_offload(model)]
    assert len(plans) == 5040
    for allowance in sorted({b for _, b in plans})[::7]:
        r = oo.solve(g, allowance=allowance, model=model)
        assert r.peak_bytes == min(p for p, b in plans if b <= allowance), allowance


# ---------------------------------------------------------------- the gap table and the command
def test_the_gap_rows_put_each_heuristic_against_the_exact_frontier():
    g = chain6()
    rows = gap.gap_rows(g, "paper")
    assert [r.label for r in rows] == [*gap.HEURISTICS, gap.SQRT, gap.OPTIMAL]
    best = rows[-1]
    assert best.status == "optimal" and best.gap_pct == 0.0
    for r in rows:
        # nothing that re-runs each layer once beats the least peak for the same FLOPs
        assert r.best_peak_bytes <= r.peak_bytes or r.label in ("memory-centric", "cost-aware (SuperNeurons)")
        assert best.peak_bytes <= r.best_peak_bytes
        assert r.moved_bytes == 0
    points = gap.frontier(g, "paper")
    assert points[0].extra_flops == 0 and points[-1].peak_bytes == best.peak_bytes
    assert all(a.peak_bytes > b.peak_bytes and a.extra_flops < b.extra_flops
               for a, b in zip(points, points[1:]))


def test_a_budget_no_plan_meets_is_said_before_any_heuristic_is_solved():
    """gap_rows solved every heuristic's two problems (minutes on a large net) before it found that the
    optimum under --budget was infeasible."""
    said = []
    with pytest.raises(BudgetError, match=r"at most 1.0 KiB \(infeasible\); the least peak is") as e:
        gap.gap_rows(lenet(batch=2), budget=1024, progress=said.append)
    assert said == ["lenet: optimal (1/6)"] and e.value.least_peak_bytes > 1024
    said.clear()
    rows = gap.gap_rows(lenet(batch=2), "paper", progress=said.append)
    assert [r.label for r in rows][-1] == "optimal" and len(said) == len(rows) == 6
    assert said[0] == "lenet: optimal (1/6)" and said[-1].endswith("(6/6)")


def test_snlite_optimal_prints_the_table(capsys):
    code = cli.main(["optimal", "lenet", "--batch", "2", "--count", "paper"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "cost-aware (SuperNeurons)" in out and "sqrt(N) checkpoints" in out and "optimal" in out
    assert "least peak, same FLOPs" in out and "proven" in out
    code = cli.main(["optimal", "lenet", "--batch", "2", "--budget", "1KiB"])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_DOES_NOT_FIT  # as every command that does not fit (it was 1)
    assert "no plan of lenet has a peak of at most 1.0 KiB (infeasible)" in err
    assert "the least peak is" in err
    # with --json the file says so too (it wrote nothing), and the least peak is the optimum's
    code = cli.main(["optimal", "lenet", "--batch", "2", "--budget", "1KiB", "--json"])
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert code == cli.EXIT_DOES_NOT_FIT and data["fits"] is False and data["budget_bytes"] == 1024
    assert data["error"] in err and data["least_peak_bytes"] == \
        optimal.solve(lenet(batch=2)).peak_bytes
    code = cli.main(["optimal", "lenet", "--batch", "2", "--reruns", "once", "--budget", "8MiB", "--json"])
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert code == 0 and data["reruns"] == "once" and data["fits"] is True, err
    assert data["rows"][-1]["label"] == "optimal (under 8.0 MiB)"
    assert data["rows"][-1]["peak_bytes"] <= 8 * 2**20
    code = cli.main(["optimal", "lenet", "--batch", "2", "--count", "paper", "--offload"])
    out, err = capsys.readouterr()
    assert code == 0 and "+ offload (SuperNeurons: CONV outputs)" in out and "\noptimal offload " in out, err
    code = cli.main(["compare", "lenet", "--batch", "2", "--optimal", "--fit", "first", "offline"])
    out, err = capsys.readouterr()
    assert code == 0 and "\noptimal recompute " in out and "arena by fit:" in out, err


@pytest.mark.parametrize("build", [lambda: mini_inception(2), lambda: cifar_resnet(8, 1),
                                   lambda: get_model("alexnet", 1), lambda: get_model("vgg11", 1)],
                         ids=["inception", "resnet8", "alexnet", "vgg11"])
def test_the_any_optimum_of_a_fork_and_concat_net_runs_with_the_solvers_objective(build):
    g = build()  # four branches read each block's input and a concat joins them; or residual forks and adds;
    # AlexNet and VGG-11 at batch 1: the table's chains, placed on the meta device (on the host: 10 s)
    model = optimal.Model(g, "paper")
    res, chosen, _ = model.solve("peak")
    assert res.status == 0 and 0 < len(chosen) < len(model.cands)
    trace = simulate(g, optimal.CONFIG.replace(count="paper"), plan=optimal.plan_for(g, chosen))
    assert trace.peak_bytes == model.peak_of(chosen)
    assert abs(res.fun * model.unit - trace.peak_bytes) < model.grain / 2  # the objective: the executed peak
    assert trace.peak_bytes < simulate(g, optimal.CONFIG.replace(count="paper")).peak_bytes


@pytest.mark.parametrize("build", [mixed_net, lambda: cifar_resnet(8, 1)], ids=["mixed", "resnet8"])
def test_every_layer_re_run_at_every_need_is_a_plan_counted_as_the_trace_does(build):
    g = build()
    model = optimal.Model(g, "paper")
    chosen = optimal.every_need(model)
    assert set(chosen) == set(model.cands) and any(len(w) > 1 for w in chosen.values())
    plan = optimal.plan_for(g, chosen)
    validate_plan(plan, optimal.Scheduler(g, optimal.CONFIG).persistent())
    trace = measure.measure(g, plan.config, plan=plan).paper
    held = model.slot_bytes(chosen)
    assert [held[i] for i in _launch_slots(model, trace)] == [r.counted_bytes for r in trace.op_steps]
    assert chosen in optimal._known_plans(model)  # what the solver is given as an upper bound


def test_a_known_plan_bounds_the_solver_and_a_cutoff_too_low_is_dropped():
    g = chain6()
    model = optimal.Model(g, "paper")
    best = optimal.solve(g, model=model)
    res, chosen, _ = model.solve("peak", cutoff=best.peak_bytes)  # the optimum itself: still found
    assert res.status == 0 and model.peak_of(chosen) == best.peak_bytes
    res, chosen, _ = model.solve("peak", cutoff=best.peak_bytes - model.grain)  # below it: no plan
    assert res.status == 2 and chosen is None
    res, chosen = optimal._solve_checked(model, "peak", None, None, 60.0,
                                         cutoff=best.peak_bytes - model.grain)
    assert res.status == 0 and model.peak_of(chosen) == best.peak_bytes  # solved again without it
    fewest = optimal.solve(g, "flops", budget=best.peak_bytes, model=model)
    res, chosen, _ = model.solve("flops", budget=best.peak_bytes, cutoff=fewest.extra_flops - 1)
    assert res.status == 2


@pytest.mark.parametrize("channels", [(4, 6), (1, 8)])
def test_the_least_transfer_time_under_a_budget_is_the_brute_force_one_and_the_time_models(channels):
    """On chain6 least time and least bytes pick the same plans; with a thin first conv they part:
    under some budget the fewest bytes take more copies, each with its fixed latency, than the
    fastest plan (which a solver that counted bytes would miss)."""
    g = chain6(channels=channels)
    model = oo.OffloadModel(g, "all")
    plans = [(max(model.bytes_at(c)), model.transfer_ms(c, "K40")) for c in _every_offload(model)]
    moved, parted = 0, 0
    for budget in sorted({p for p, _ in plans}):
        fastest = min(ms for p, ms in plans if p <= budget)
        r = oo.solve(g, "time", budget=budget, model=model, gpu="K40")
        assert r.peak_bytes <= budget, budget
        assert fastest <= r.transfer_ms <= fastest * (1 + 1e-4), budget  # HiGHS's gap: 0.01%
        program = place(g, r.plan.config, plan=r.plan)  # the copies' time as the time model replays it
        assert estimate(program, g, "K40").transfer_ms == pytest.approx(r.transfer_ms, rel=1e-12)
        moved += len(r.prefetch)
        fewest_bytes = oo.solve(g, "moved", budget=budget, model=model)
        parted += model.transfer_ms(fewest_bytes.prefetch, "K40") > r.transfer_ms * (1 + 1e-3)
    assert moved > 0
    assert (parted > 0) == (channels == (1, 8)), parted
    with pytest.raises(ValueError, match="needs a byte budget"):
        oo.solve(g, "time", model=model)


def test_the_integer_program_imports_on_its_own():
    """``from snlite.milp import Model`` first (not through snlite.optimal) works, and optimal.Model is
    that class: the imports go one way, space <- milp <- optimal, with no cycle to resolve."""
    code = "from snlite.milp import Model; from snlite import optimal; assert optimal.Model is Model"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
