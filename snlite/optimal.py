"""Exact recomputation plans for small networks: how far from optimal are the heuristics?

SuperNeurons' recomputation is a rule (cheap layers dropped, segments chosen by a threshold), and
sqrt(N) checkpointing is another. This module answers, for one network and batch, what the *best*
plan of the same kind is, with an integer program solved by HiGHS (``scipy.optimize.milp``; scipy is
the optional extra ``snlite[optimal]``), and returns it as an ordinary :class:`~snlite.scheduler.Plan`
that the same placement pass and executor run.

The plans (:mod:`snlite.space`; the space the program searches, and the brute force of the tests enumerates):

- every layer that writes activations (not the data layer, the loss, or a flatten) is a candidate;
  a plan *drops* some of them: their outputs (and what their forward saves) are freed after their
  last forward use;
- in backward a dropped layer is re-run before backward steps that need its outputs (re-runs before
  one step in forward order, each reading the latest incarnation of its inputs); each incarnation is
  freed after its last use, as liveness frees everything (:func:`plan_for`, liveness on, nothing
  offloaded, no workspace);
- ``reruns="any"`` (the default): re-run a layer before any step where it, or a dropped consumer's
  re-run, needs it, as often as the solver likes, keeping each output between steps or not. This
  holds SuperNeurons' speed- and memory-centric plans, so none of them can beat its optimum.
  ``reruns="once"``: each dropped layer re-run once, just in time (:func:`recompute_stages`), and
  kept until its last use: a smaller program, a decision per layer only.

The program (:class:`snlite.milp.Model`): binaries ``d[L]`` (layer L dropped) and, per backward
position j, ``R[L, j]`` (L re-run there) and ``C[u, j]`` (the incarnation of its output u carried into
j; continuous, the constraints make its least value whole), or under "once" ``started[L, j]`` (L's one
re-run has happened by j); continuous ``alive``
variables say whether a tensor holds its block at each moment a launch can happen (every forward step,
and in every backward step each possible re-run, in forward order, then the step itself). The memory
at each such moment, counted as the trace counts it (the pool's blocks under count "all", the tensors'
own bytes under "paper"; weights, their gradients and momentum as the trace has them), is at most
``peak``. Each ``alive`` has only lower bounds, tight at the optimum (a tensor holds its block from its
allocation to its last use), so the program's optimum is the executed peak of its plan, byte for byte:
the tests run it. Only the pool's fragmentation is not modelled: the *arena* can exceed the peak.

Objectives: the least peak for an allowance of extra FLOPs (``objective="peak"``), or the fewest
extra FLOPs under a byte budget on that peak (``objective="flops"``). HiGHS stops at ``time_limit``
seconds; the result says whether the plan is proven optimal, and its MIP gap, never hidden.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from snlite.highs import STATUS
from snlite.measure import checkpoint_plan, format_size
from snlite.milp import OBJECTIVES, Model
from snlite.scheduler import Plan, Scheduler
from snlite.space import CONFIG, as_reruns, candidates, plan_for, recompute_stages, reruns_of

# the planner's interface: solving here, the plans from snlite.space, the program from snlite.milp
__all__ = ["CONFIG", "OBJECTIVES", "STATUS", "Model", "Result", "as_reruns", "candidates", "every_need",
           "plan_for", "recompute_stages", "reruns_of", "solve"]


@dataclass
class Result:
    """What :func:`solve` found: the plan, and how sure the solver is about it."""

    graph_name: str
    objective: str  # "peak" or "flops"
    dropped: tuple[str, ...]  # the layers the plan drops
    plan: Plan | None  # None when no feasible plan was found
    peak_bytes: int | None  # the plan's peak as the program counts it (the trace's, byte for byte)
    extra_flops: int | None
    bound: float | None  # the solver's proven bound on the objective (bytes or FLOPs)
    gap: float | None  # relative MIP gap (0.0: proven optimal)
    status: str  # "optimal", "time limit", "infeasible", ...
    solve_s: float
    size: dict = field(default_factory=dict)  # variables, binaries, constraints
    count: str = "all"
    reruns: dict = field(default_factory=dict)  # dropped layer -> the backward steps it is re-run before
    flops_proven: bool = True  # least peak: its fewest extra FLOPs proven too (not cut by the time limit)

    @property
    def optimal(self) -> bool:
        return self.status == "optimal"

    def summary(self) -> str:
        if self.plan is None:
            return (f"{self.graph_name}: no plan found ({self.status}) after {self.solve_s:.1f} s "
                    f"({self.size.get('binaries', 0)} binaries)")
        gap = "proven optimal" + ("" if self.flops_proven else " (its extra FLOPs not proven fewest)") \
            if self.optimal else (
            f"{self.status}, gap " + ("unknown (no bound)" if self.gap is None else f"{100 * self.gap:.1f}%"))
        runs = sum(map(len, self.reruns.values()))
        return (f"{self.graph_name}: drop {len(self.dropped)} layers ({runs} re-runs), "
                f"peak {format_size(self.peak_bytes)} "
                f"({self.count} count), +{self.extra_flops:,d} FLOPs; {gap}; {self.solve_s:.2f} s, "
                f"{self.size.get('binaries', 0)} binaries, {self.size.get('constraints', 0)} constraints")


def solve(graph, objective: str = "peak", allowance: int | None = None, budget: int | None = None,
          time_limit: float = 60.0, count: str = "all", model: Model | None = None,
          reruns: str = "any") -> Result:
    """The best plan of :func:`plan_for`'s kind for ``graph`` (``reruns``: "any" or "once", see the
    module docstring): the least peak (with at most
    ``allowance`` extra FLOPs, if given; among plans of that peak, the fewest extra FLOPs), or
    (``objective="flops"``) the fewest extra FLOPs with a peak of at most ``budget`` bytes.
    ``time_limit`` (seconds, per solver call) bounds the work: a graph too big to finish gets the
    best plan found, its proven bound and gap, and ``status`` "time limit"."""
    if objective == "peak" and budget is not None:
        raise ValueError("budget applies to objective 'flops'; for the least peak give an allowance")
    if allowance is not None and allowance < 0:
        raise ValueError(f"the extra-FLOP allowance must be >= 0, got {allowance}")
    t0 = time.perf_counter()
    model = model or Model(graph, count, reruns=reruns)
    flops_proven = True

    def value(c):
        return (model.peak_of(c), model.extra_flops_of(c)) if objective == "peak" else \
            (model.extra_flops_of(c), model.peak_of(c))

    # the best known plan within the limits bounds the objective from above: HiGHS prunes with it from
    # the start (ResNet-20: proven optimal in seconds instead of a 28% gap after 60 s)
    known = _fallback(model, objective, allowance, budget)
    res, choice = _solve_checked(model, objective, allowance, budget, time_limit,
                                 None if known is None else value(known)[0])
    status = STATUS.get(res.status, f"status {res.status}")
    gap = getattr(res, "mip_gap", None)
    bound = getattr(res, "mip_dual_bound", None)
    if choice is not None and objective == "peak" and res.status == 0:
        # among plans of the least peak, the fewest extra FLOPs (within the allowance)
        res2, choice2 = _solve_checked(model, "flops", None, model.peak_of(choice), time_limit,
                                       model.extra_flops_of(choice))
        if choice2 is not None and model.extra_flops_of(choice2) < model.extra_flops_of(choice):
            choice = choice2
        flops_proven = res2.status == 0
    scale = model.unit if objective == "peak" else model.fscale

    if res.status == 1:  # out of time: the solver's plan, or a known one where that is better
        if known is not None and (choice is None or value(known) < value(choice)):
            status = ("time limit: " + ("no plan from the solver, " if choice is None else "")
                      + "the best known plan")
            choice = known
        if choice is not None and bound is not None and np.isfinite(bound):
            v = value(choice)[0]
            gap = (v - bound * scale) / v if v else 0.0
        if choice is None:
            status = "time limit: no plan found"
    if choice is None:
        return Result(graph.name, objective, (), None, None, None, None, gap, status,
                      time.perf_counter() - t0, model.size_info, model.count)
    dropped = tuple(L for L in model.cands if L in choice)
    return Result(graph.name, objective, dropped, plan_for(graph, choice), model.peak_of(choice),
                  model.extra_flops_of(choice), None if bound is None else bound * scale,
                  gap if gap is not None else (0.0 if res.status == 0 else None), status,
                  time.perf_counter() - t0, model.size_info, model.count, choice, flops_proven)


TOLERANCE = 2e-6  # relative: what HiGHS's integrality tolerance can hide in a sum (see _solve_checked)


def _solve_checked(model, objective, allowance, budget, time_limit, cutoff=None, tries: int = 6):
    """HiGHS, then the answer checked exactly (:meth:`Model.slot_bytes`, :meth:`Model.extra_flops_of`).
    HiGHS takes a binary within 1e-6 of 0 or 1 as that value (its integrality tolerance, which scipy does
    not let us tighten), so a memory sum of B bytes can be off by about B * 1e-6, e.g. 60 bytes of a 60 MB
    budget. An answer over its budget (or allowance) is solved again under one tightened by the excess,
    at least by TOLERANCE of it, doubling: the plan returned always keeps within the limits, counted
    exactly, and is optimal up to that tolerance. ``cutoff``: the objective of a known plan (bytes or
    FLOPs), an upper bound the program may use."""
    for attempt in range(tries):
        res, choice, _ = model.solve(objective, allowance, budget, time_limit, cutoff=cutoff)
        if choice is None and cutoff is not None and res.status == 2:  # a known plan meets it: numerics
            cutoff = None
            continue
        if choice is None:
            return res, None
        over_b = model.peak_of(choice) - budget if budget is not None else 0
        over_a = model.extra_flops_of(choice) - allowance if allowance is not None else 0
        if over_b <= 0 and over_a <= 0:
            return res, choice
        if over_b > 0:
            budget -= max(over_b, int(budget * TOLERANCE * 2 ** attempt) + 1)
        if over_a > 0:
            allowance -= max(over_a, int(allowance * TOLERANCE * 2 ** attempt) + 1)
    res.status = 4
    return res, None


def _fallback(model, objective, allowance, budget):
    """The best plan that keeps within the limits among a few known ones, counted exactly: drop
    nothing, the cheap layers, every layer (each re-run once, just in time), and, where the program
    holds them, SuperNeurons' speed-, memory-centric and cost-aware plans and sqrt(N) checkpointing.
    What a solve that ran out of time before HiGHS found a plan returns, and the upper bound
    :func:`solve` gives HiGHS."""
    ok = []
    for choice in _known_plans(model):
        try:
            peak, flops = model.peak_of(choice), model.extra_flops_of(choice)
        except ValueError:  # a re-run where this program allows none
            continue
        if (allowance is None or flops <= allowance) and (budget is None or peak <= budget):
            ok.append(((peak, flops) if objective == "peak" else (flops, peak), len(ok), choice))
    return min(ok)[2] if ok else None


def _known_plans(model) -> list[dict]:
    """The plans :func:`_fallback` chooses among, built once per model. Under "any" they include the
    other extreme of memory-centric recomputation: every layer dropped and re-run before every step
    that needs it (the least memory for the most FLOPs; on ResNet-20 the optimum of the peak)."""
    if getattr(model, "_known", None) is None:
        cheap = tuple(L for L in model.cands if not model.graph.layers[L].checkpoint)
        known = [model.choice(d) for d in ((), cheap, tuple(model.cands))]
        if model.mode == "any":
            plans = [Scheduler(model.graph, CONFIG.replace(recompute=r)).plan()
                     for r in ("speed", "memory", "cost_aware")]
            for plan in plans + [checkpoint_plan(model.graph)]:
                choice = reruns_of(model.graph, plan)
                if choice is not None and set(choice) <= set(model.cands):
                    known.append(choice)
            known.append(every_need(model))
        model._known = known
    return model._known


def every_need(model) -> dict[str, tuple[int, ...]]:
    """Every layer of ``model`` (a :class:`Model` under "any") dropped and re-run before each backward
    step that reads its outputs or re-runs a consumer of them, so no incarnation outlives its step."""
    pos = {s: j for j, s in enumerate(model.bstages)}
    chosen: dict[str, tuple[int, ...]] = {}
    for L in reversed(model.cands):  # consumers first
        needs = ({j for u in model.outs[L] for j in model.bread.get(u, ())}
                 | {pos[s] for M in model.cons[L] if M in chosen for s in chosen[M]})
        chosen[L] = tuple(model.bstages[j] for j in sorted(needs))
    return chosen
