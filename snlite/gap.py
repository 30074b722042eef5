"""How far from optimal: SuperNeurons' recomputation and sqrt(N) checkpointing against the exact planner.

Plain data for ``snlite optimal`` and tutorial 08:

    rows = gap_rows(get_model("alexnet", 8), count="paper")   # one Row per strategy, and the optimum
    points = frontier(graph, count="paper")                   # the exact peak vs extra-FLOP frontier

Every strategy runs with liveness on and nothing offloaded, so the rows differ only in what they
recompute. For each heuristic, the exact planner answers two questions: what is the least peak for
the extra FLOPs this heuristic spends (``best_peak_bytes``; the gap is how far above it the heuristic
is), and what are the fewest extra FLOPs for the peak it reaches (``fewest_flops``). The exact planner
(:mod:`snlite.optimal`) by default searches plans that re-run a layer as often as they like (they
hold SuperNeurons' speed- and memory-centric plans); under ``reruns="once"`` it re-runs each dropped
layer once, and memory-centric recomputation, which re-runs layers several times, can land below that
space's frontier (a negative gap): the table says so rather than hide it.
"""
from __future__ import annotations

from dataclasses import dataclass

from snlite import measure, optimal
from snlite import optimal_offload as oo
from snlite.config import MemoryConfig
from snlite.errors import BudgetError

HEURISTICS = {"liveness only": MemoryConfig(liveness=True),
              "speed-centric": MemoryConfig(liveness=True, recompute="speed"),
              "memory-centric": MemoryConfig(liveness=True, recompute="memory"),
              "cost-aware (SuperNeurons)": MemoryConfig(liveness=True, recompute="cost_aware")}
SQRT = "sqrt(N) checkpoints"
OPTIMAL = "optimal"


@dataclass
class Row:
    label: str
    peak_bytes: int
    extra_flops: int
    moved_bytes: int
    best_peak_bytes: int | None = None  # the least peak for at most these extra FLOPs
    fewest_flops: int | None = None  # the fewest extra FLOPs for at most this peak
    status: str = "optimal"  # the solver's, for the two answers above
    gap: float | None = None  # the solver's MIP gap (0: proven)
    solve_s: float = 0.0  # seconds the solver took for this row

    @property
    def gap_pct(self) -> float | None:
        """How far the peak is above the least peak for the same extra FLOPs, in percent."""
        if self.best_peak_bytes is None:
            return None
        return 100.0 * (self.peak_bytes - self.best_peak_bytes) / self.best_peak_bytes


def _worst(a: optimal.Result, b: optimal.Result | None = None) -> tuple[str, float | None]:
    """The status and gap of the least sure of two solver results."""
    rs = [r for r in (a, b) if r is not None]
    bad = [r for r in rs if not r.optimal]
    r = bad[0] if bad else rs[0]
    return r.status, r.gap


def gap_rows(graph, count: str = "all", budget: int | None = None, time_limit: float = 60.0,
             progress=measure.no_progress, reruns: str = "any") -> list[Row]:
    """One row per heuristic (liveness only, speed-, memory-centric, cost-aware, sqrt(N)), each
    with the exact planner's answers for its FLOPs and its peak, then the optimum: the least peak
    (or, under ``budget``, the fewest extra FLOPs with a peak of at most ``budget``)."""
    model = optimal.Model(graph, count, reruns=reruns)
    plans = [(label, cfg, None) for label, cfg in HEURISTICS.items()]
    plans.append((SQRT, optimal.CONFIG, measure.checkpoint_plan(graph)))
    # the optimum first: a --budget no plan meets is said before the heuristics' solves, not after
    progress(f"{graph.name}: {OPTIMAL} (1/{len(plans) + 1})")
    best = optimal.solve(graph, "flops" if budget else "peak", budget=budget, time_limit=time_limit,
                         model=model)
    if best.plan is None:
        least = optimal.solve(graph, model=model).peak_bytes
        error = BudgetError if best.status == "infeasible" else ValueError  # proven, or the solver gave up
        e = error(f"no plan of {graph.name} has a peak of at most {measure.format_size(budget)} "
                  f"({best.status}); the least peak is {measure.format_size(least)}")
        e.least_peak_bytes = least  # for snlite optimal --json
        raise e
    rows = []
    for i, (label, cfg, plan) in enumerate(plans, 2):
        progress(f"{graph.name}: {label} ({i}/{len(plans) + 1})")
        m = measure.measure(graph, cfg, label, plan)
        trace = m.trace if count == "all" else m.paper
        same_flops = optimal.solve(graph, allowance=trace.extra_flops, time_limit=time_limit, model=model)
        same_peak = optimal.solve(graph, "flops", budget=trace.peak_bytes, time_limit=time_limit, model=model)
        status, gap = _worst(same_flops, same_peak)
        rows.append(Row(label, trace.peak_bytes, trace.extra_flops, m.moved_bytes, same_flops.peak_bytes,
                        same_peak.extra_flops, status, gap, same_flops.solve_s + same_peak.solve_s))
    if budget:  # the frontier's corner: the least peak for those fewest FLOPs
        corner = optimal.solve(graph, allowance=best.extra_flops, time_limit=time_limit, model=model)
        if corner.plan is not None and corner.peak_bytes <= best.peak_bytes:
            corner.solve_s += best.solve_s
            best = corner
    label = OPTIMAL + (f" (under {measure.format_size(budget)})" if budget else "")
    status = best.status if best.flops_proven else f"{best.status}; its FLOPs: time limit"
    rows.append(Row(label, best.peak_bytes, best.extra_flops, 0, best.peak_bytes, best.extra_flops, status,
                    best.gap, best.solve_s))
    return rows


FRACTIONS = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # of a forward pass's FLOPs


def frontier(graph, count: str = "all", fractions=FRACTIONS, time_limit: float = 60.0,
             reruns: str = "any") -> list[optimal.Result]:
    """The exact trade-off, sampled: the least peak for at most each fraction of a forward pass in
    extra FLOPs, then with no limit, each with the fewest extra FLOPs for that peak; a point that
    does no better than the one before is left out, so peaks fall and FLOPs rise along the list.
    Each point is a proven optimum unless its ``status`` says otherwise."""
    model = optimal.Model(graph, count, reruns=reruns)
    fwd = graph.flops()
    points: list[optimal.Result] = []
    for allowance in [int(f * fwd) for f in sorted(fractions)] + [None]:
        p = optimal.solve(graph, allowance=allowance, time_limit=time_limit, model=model)
        if p.plan is not None and (not points or p.peak_bytes < points[-1].peak_bytes):
            points.append(p)
    return points


@dataclass
class OffloadRow:
    label: str
    peak_bytes: int
    moved_bytes: int
    best_peak_bytes: int | None  # the least peak moving at most these bytes
    fewest_moved: int | None  # the fewest bytes moved for at most this peak
    status: str

    @property
    def gap_pct(self) -> float | None:
        if self.best_peak_bytes is None:
            return None
        return 100.0 * (self.peak_bytes - self.best_peak_bytes) / self.best_peak_bytes


def offload_rows(graph, count: str = "all", time_limit: float = 60.0) -> list[OffloadRow]:
    """SuperNeurons' offload (CONV outputs, liveness on, nothing recomputed) against the exact
    offload program (:mod:`snlite.optimal_offload`), then the offload optimum: least peak, and
    among plans of that peak the fewest bytes moved."""
    model = oo.OffloadModel(graph, count)
    m = measure.measure(graph, oo.CONFIG, "+ offload (SuperNeurons: CONV outputs)")
    trace = m.trace if count == "all" else m.paper
    same_moved = oo.solve(graph, allowance=m.moved_bytes, count=count, time_limit=time_limit, model=model)
    same_peak = oo.solve(graph, "moved", budget=trace.peak_bytes, count=count, time_limit=time_limit,
                         model=model)
    rows = [OffloadRow(m.label, trace.peak_bytes, m.moved_bytes, same_moved.peak_bytes, same_peak.moved_bytes,
                       _worst_status(same_moved, same_peak))]
    best = oo.solve(graph, count=count, time_limit=time_limit, model=model)
    if best.plan is not None:
        tidy = oo.solve(graph, "moved", budget=best.peak_bytes, count=count, time_limit=time_limit,
                        model=model)
        best = tidy if tidy.plan is not None and tidy.moved_bytes <= best.moved_bytes else best
        rows.append(OffloadRow("optimal offload", best.peak_bytes, best.moved_bytes, best.peak_bytes,
                               best.moved_bytes, best.status))
    return rows


def _worst_status(*results) -> str:
    return next((r.status for r in results if not r.optimal), "optimal")
