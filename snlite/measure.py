"""Measurements on the meta device: what one plan costs, in both counts, and the strategies side by side.

Pure functions that return plain data; :mod:`snlite.cli` prints them (``snlite plan``, ``compare``).

    parse_size("12GiB")                                  # 12884901888 (binary and decimal units)
    measure(graph, MemoryConfig(liveness=True))          # a Measurement: both counts, costs
    compare(graph)                                       # one Measurement per strategy
    checkpoint_plan(graph)                               # sqrt(N) checkpointing, as a plan to run

How far a configuration goes (the largest batch, the deepest ResNet, the smallest budget, why a
plan does not fit) is :mod:`snlite.search`. Every number comes from a program
(:func:`snlite.place`, read by :func:`snlite.trace.trace_program`), so it is what a
:class:`~snlite.train.Model` then allocates, byte for byte.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from snlite import timing
from snlite.program import format_size as format_size  # one size format for the package: measure.format_size
from snlite.config import MemoryConfig
from snlite.errors import BudgetError, HostBudgetError
from snlite.pipeline import place
from snlite.recompute import Op, RecomputeInfo
from snlite.scheduler import LivenessStage, Plan, PlannedOp, Scheduler
from snlite.trace import Trace, trace_program

# ---------------------------------------------------------------------------- sizes
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, exact: bool = False) -> int:
    """Bytes in ``text``: ``4096``, ``64KiB``, ``500MB``, ``1.5GB``, ``12 GiB`` (case-insensitive;
    KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024; with a unit, a fraction of a byte is
    dropped: ``2.1GiB`` is 2,254,857,830 bytes; with ``exact`` (the command line) it is refused, naming
    the whole numbers either side). Raises ValueError otherwise, and for a size that is not positive
    or, without a unit, not a whole number of bytes (``1.5`` is 1.5 bytes: a unit is missing)."""
    m = re.fullmatch(r"\s*([-+]?)([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m[3].lower() if m else None
    if m is None or unit not in UNITS:
        raise ValueError(f"not a size: {text!r}; expected a number of bytes with an optional unit, "
                         f"e.g. 4096, 64KiB, 500MB, 1.5GB, 12GiB "
                         f"(units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    try:
        nbytes = Decimal(m[1] + m[2]) * UNITS[unit]
    except InvalidOperation:
        raise ValueError(f"not a size: {text!r}") from None
    if nbytes <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    if exact and unit not in ("", "b") and nbytes != nbytes.to_integral_value():
        low = int(nbytes.to_integral_value(rounding="ROUND_FLOOR"))
        raise ValueError(f"{text!r} is {nbytes.normalize():,f} bytes, not a whole number of bytes; "
                         "give whole bytes, " + (f"e.g. {low} or {low + 1}" if low else "at least 1"))
    if unit not in ("", "b"):
        nbytes = nbytes.to_integral_value(rounding="ROUND_FLOOR")
        if nbytes <= 0:
            raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    if nbytes != nbytes.to_integral_value():
        raise ValueError(f"{text!r} is not a size in whole bytes ({nbytes} B); a unit is missing, "
                         f"e.g. {m[2]}GiB or {m[2]}MB")
    return int(nbytes)


# ---------------------------------------------------------------------------- one measurement
@dataclass
class Measurement:
    """One configuration simulated: ``trace`` counts everything on the device (count "all"),
    ``paper`` is the same run counted the paper's way (activations + gradients). Under a budget
    ``fits`` says whether it ran, and where it did not, ``ran_out`` which memory ran out first
    ("device" or "host") and the traces are of the run without a budget."""

    label: str
    config: MemoryConfig
    trace: Trace
    paper: Trace
    forward_flops: int
    fits: bool | None = None  # None: no budget given
    program: object = None  # the snlite.program.Program both traces were read off
    graph: object = None
    ran_out: str | None = None  # "device" or "host": which budget the placement ran out of, if any

    def timeline(self, gpu: str = "H200"):
        """The program replayed on a GPU profile (:func:`snlite.timing.estimate`)."""
        return timing.estimate(self.program, self.graph, gpu)

    @property
    def arena_bytes(self) -> int:
        """Device memory the program needs: its arena (the placement's high-water mark)."""
        return self.program.arena_bytes

    @property
    def slab_bytes(self) -> int:
        """Pinned host memory the program needs: its slab (offloaded tensors, the staged batch, results)."""
        return self.program.slab_bytes

    @property
    def peak_bytes(self) -> int:
        return self.trace.peak_bytes

    @property
    def paper_peak_bytes(self) -> int:
        return self.paper.peak_bytes

    @property
    def moved_bytes(self) -> int:
        return self.trace.d2h_bytes + self.trace.h2d_bytes

    @property
    def extra_pct(self) -> float:
        """Extra (recomputed) FLOPs, in percent of one forward pass."""
        return 100.0 * self.trace.extra_flops / self.forward_flops if self.forward_flops else 0.0

    def totals(self) -> dict:
        """The numbers people ask about, as plain data (for JSON)."""
        t, p = self.trace, self.paper
        return {"label": self.label, "config": self.config.describe(), "fits": self.fits,
                "ran_out": self.ran_out, "peak_bytes": t.peak_bytes, "paper_peak_bytes": p.peak_bytes,
                "l_peak_bytes": t.l_peak_bytes, "paper_l_peak_bytes": p.l_peak_bytes,
                "ratio": t.ratio, "paper_ratio": p.ratio, "peak_step": t.peak_step,
                "peak_layer": t.steps[t.peak_op].layer if t.steps else None,
                "peak_phase": t.steps[t.peak_op].phase if t.steps else None,  # "update": SGD after backward
                "recompute_count": t.recompute_count, "extra_flops": t.extra_flops,
                "forward_flops": self.forward_flops, "d2h_bytes": t.d2h_bytes, "h2d_bytes": t.h2d_bytes,
                "cache_hits": t.cache_hits, "cache_misses": t.cache_misses,
                "host_peak_bytes": t.host_peak_bytes, "arena_bytes": self.arena_bytes,
                "slab_bytes": self.slab_bytes, "by_kind": by_kind_json(t)}


def by_kind_json(trace) -> dict | None:
    """:meth:`Trace.by_kind` as plain data: ``{kind: {"device_bytes": .., "host_bytes": ..}}``."""
    if trace is None:
        return None
    return {k: {"device_bytes": d, "host_bytes": h} for k, (d, h) in trace.by_kind().items()}


def measure(graph, config: MemoryConfig, label: str | None = None, plan: Plan | None = None) -> Measurement:
    """Simulate ``config`` with both counts. Under a budget that is too small, the numbers are of
    the run without it (what it would need), ``fits`` is False and ``ran_out`` says which budget
    (device or host) the placement ran out of first."""
    budgeted = config.budget_bytes is not None or config.host_budget_bytes is not None
    ran_out = None
    try:
        program, ok = place(graph, config, plan=plan), (True if budgeted else None)
    except BudgetError as e:
        ran_out = "host" if isinstance(e, HostBudgetError) else "device"
        config = config.replace(budget_bytes=None, host_budget_bytes=None)
        program, ok = place(graph, config, plan=plan), False
    t_all, t_paper = trace_program(program, "all"), trace_program(program, "paper")
    return Measurement(label or config.describe(), config, t_all, t_paper, graph.flops(), ok, program, graph,
                       ran_out)


# ---------------------------------------------------------------------------- sqrt(N) checkpoints
def checkpoint_plan(graph, every: int | None = None) -> Plan:
    """Classic sqrt(N) checkpointing (Chen et al. 2016, "Training deep nets with sublinear memory
    cost"), as a plan the runtime executes: keep the outputs of every ``every``-th layer of the
    forward route (default round(sqrt(N)), whatever their kind) and of the loss layer; drop every
    other layer's activations after their last forward use; in backward, at the first step that
    needs a dropped tensor, re-run that tensor's whole segment once (speed-centric) and keep it
    until its last use. A dropped input from an earlier segment (a skip connection) is rebuilt
    layer by layer. Liveness on, no offload. Unlike SuperNeurons' checkpoints this ignores how
    expensive each layer is, which is the point of the comparison."""
    steps, tensors = graph.steps(), graph.tensors()
    order = graph.route()[0]
    every = every or max(1, round(math.sqrt(len(order))))
    kept = {name for i, name in enumerate(order) if (i + 1) % every == 0} | {graph.loss_layer}
    fwd = {s.layer: s for s in steps if s.phase == "forward"}
    drop = {t: name for name in order if name not in kept and not graph.layers[name].alias_input
            for t in fwd[name].writes if tensors[t].kind == "activation"}
    segment = {name: i // every for i, name in enumerate(order)}
    members: dict[int, list[str]] = {}
    for name in order:
        members.setdefault(segment[name], []).append(name)
    info = RecomputeInfo("sqrt_n", dropped=tuple(drop))
    ops: list[Op] = []
    current: dict[str, str] = {}  # dropped tensor -> its recomputed incarnation

    def rerun(layer: str, step: int) -> None:
        s = fwd[layer]
        for t in s.reads:
            if t in drop and t not in current:
                rerun(drop[t], step)
        writes = [t for t in s.writes if t in drop]
        for t in writes:
            current[t] = f"{t}#r{len(current) + 1}"
        names = tuple((t, current[t]) for t in (*s.reads, *writes) if t in current)
        ops.append(Op(len(ops), step, layer, "recompute", tuple(current.get(t, t) for t in s.reads),
                      tuple(current[t] for t in writes), names=names))
        info.count += 1
        info.extra_flops += graph.layers[layer].flops()

    for s in steps:
        if s.phase == "backward":
            for t in s.reads:
                if t in drop and t not in current:
                    for layer in members[segment[drop[t]]]:
                        if any(w in drop and w not in current for w in fwd[layer].writes):
                            rerun(layer, s.index)
            names = tuple((t, current[t]) for t in (*s.reads, *s.writes) if t in current)
            ops.append(Op(len(ops), s.index, s.layer, s.phase, tuple(current.get(t, t) for t in s.reads),
                          s.writes, s.inplace, s.accumulate, names))
        else:
            ops.append(Op(len(ops), s.index, s.layer, s.phase, s.reads, s.writes, s.inplace, s.accumulate))
    config = MemoryConfig(liveness=True)
    persistent = Scheduler(graph, config).persistent()
    frees = LivenessStage(True).apply(ops, persistent, set(drop))
    return Plan(config, [PlannedOp(op, frees=tuple(frees.get(i, ()))) for i, op in enumerate(ops)], info)


# ---------------------------------------------------------------------------- compare
SQRT_LABEL = "sqrt(N) checkpoints"
_LO = dict(liveness=True, offload=True)
COMPARE = {
    "baseline": MemoryConfig(),
    "liveness": MemoryConfig(liveness=True),
    "+ offload": MemoryConfig(**_LO),
    "+ offload + cache": MemoryConfig(**_LO, cache=True),
    "+ offload + recompute speed": MemoryConfig(**_LO, recompute="speed"),
    "+ offload + recompute memory": MemoryConfig(**_LO, recompute="memory"),
    "+ offload + recompute cost_aware": MemoryConfig(**_LO, recompute="cost_aware"),
}


def no_progress(text: str) -> None:
    """The default ``progress``: say nothing."""


ALL_RESIDENT = MemoryConfig(liveness=True)  # the time reference: nothing moves, nothing is recomputed


def all_resident_ms(graph, gpu: str = "H200", workspace: str = "none") -> float:
    """The estimated step time with every tensor resident (liveness only, the same conv ``workspace``),
    on ``gpu``'s profile: what moving and recomputing are measured against."""
    return timing.estimate(place(graph, ALL_RESIDENT.replace(workspace=workspace)), graph, gpu).step_ms


def compare(graph, budget_bytes: int | None = None, progress=no_progress,
            fit: str = "first", host_budget_bytes: int | None = None) -> list[Measurement]:
    """One Measurement per strategy of ``COMPARE`` (each "+ recompute" row on top of liveness +
    offload), then the sqrt(N) checkpointing reference (liveness on), each placed with ``fit``. With
    budgets (device, pinned host memory or both), each row runs under them (the cache only moves data
    when memory runs short, so only then does it show). ``progress(text)`` is told which strategy
    runs (``snlite compare`` shows it)."""
    n, placed = len(COMPARE) + 1, "" if fit == "first" else f", fit={fit}"
    budgets = {"budget_bytes": budget_bytes, "host_budget_bytes": host_budget_bytes, "fit": fit}
    rows = []
    for i, (label, cfg) in enumerate(COMPARE.items(), 1):
        progress(f"{graph.name}: {label} ({i}/{n}{placed})")
        rows.append(measure(graph, cfg.replace(**budgets), label))
    progress(f"{graph.name}: {SQRT_LABEL} ({n}/{n}{placed})")
    plan = checkpoint_plan(graph)
    rows.append(measure(graph, plan.config.replace(**budgets), SQRT_LABEL, plan))
    return rows
