"""Measurements on the meta device: what a plan costs, why it does not fit, and how far it goes.

Pure functions that return plain data; :mod:`snlite.cli` prints them (``snlite plan``,
``compare``, ``maxbatch``, ``maxdepth``).

    parse_size("12GiB")                                  # 12884901888 (binary and decimal units)
    measure(graph, MemoryConfig(liveness=True))          # a Measurement: both counts, costs
    compare(graph)                                       # one Measurement per strategy
    explain_budget(lambda b: get_model("alexnet", b), 200, cfg.replace(budget_bytes=2**30))
    max_batch(lambda b: get_model("alexnet", b), cfg)    # largest batch under cfg.budget_bytes
    max_depth(16, cfg)                                   # deepest ImageNet ResNet under it
    min_budget(graph)                                    # superneurons()'s smallest budget / l_peak

Every number comes from a program (:func:`snlite.place`, read by :func:`snlite.trace.trace_program`), so it is what a
:class:`~snlite.train.Model` then allocates, byte for byte. "Fits" always means: the simulation
ran under ``budget_bytes`` (the pool holds everything: weights, gradients, momentum, the batch,
activations, workspace), never a comparison of peaks, since fragmentation, the LRU cache and the
dynamic workspace all depend on the budget.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from snlite.config import MemoryConfig
from snlite.models import PAPER_WIDTH_BATCH, resnet
from snlite.recompute import Op, RecomputeInfo
from snlite.placement import BudgetError, place
from snlite.trace import trace_program
from snlite.scheduler import LivenessStage, Plan, PlannedOp, Scheduler
from snlite.trace import Trace

# ---------------------------------------------------------------------------- sizes
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``4096``, ``64KiB``, ``500MB``, ``1.5GB``, ``12 GiB`` (case-insensitive;
    KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024; with a unit, a fraction of a byte is
    dropped: ``2.1GiB`` is 2,254,857,830 bytes). Raises ValueError otherwise, and for a size that is
    not positive or, without a unit, not a whole number of bytes (``1.5`` is 1.5 bytes: a unit is missing)."""
    m = re.fullmatch(r"\s*([-+]?)([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m[3].lower() if m else None
    if m is None or unit not in UNITS:
        raise ValueError(f"not a size: {text!r}; expected a number of bytes with an optional unit, e.g. 4096, "
                         f"64KiB, 500MB, 1.5GB, 12GiB (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    try:
        nbytes = Decimal(m[1] + m[2]) * UNITS[unit]
    except InvalidOperation:
        raise ValueError(f"not a size: {text!r}") from None
    if nbytes <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    if unit not in ("", "b"):
        nbytes = nbytes.to_integral_value(rounding="ROUND_FLOOR")
        if nbytes <= 0:
            raise ValueError(f"a size must be at least 1 byte, got {text!r}")
    if nbytes != nbytes.to_integral_value():
        raise ValueError(f"{text!r} is not a size in whole bytes ({nbytes} B); a unit is missing, e.g. {m[2]}GiB "
                         f"or {m[2]}MB")
    return int(nbytes)


def format_size(nbytes: int | None) -> str:
    """``2.57 GiB``, ``812.0 MiB``, ``64.0 KiB``, ``512 B`` (binary units); ``-`` for None."""
    if nbytes is None:
        return "-"
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.{2 if unit == 'GiB' else 1}f} {unit}"
        n /= 1024
    return f"{n:,.2f} GiB"


# ---------------------------------------------------------------------------- one measurement
@dataclass
class Measurement:
    """One configuration simulated: ``trace`` counts everything on the device (count "all"),
    ``paper`` is the same run counted the paper's way (activations + gradients). Under a budget
    ``fits`` says whether it ran; where it did not, the traces are of the run without a budget."""

    label: str
    config: MemoryConfig
    trace: Trace
    paper: Trace
    forward_flops: int
    fits: bool | None = None  # None: no budget given
    program: object = None  # the snlite.program.Program both traces were read off
    graph: object = None

    def timeline(self, gpu: str = "H200"):
        """The program replayed on a GPU profile (:func:`snlite.timing.estimate`)."""
        from snlite import timing

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
                "peak_bytes": t.peak_bytes, "paper_peak_bytes": p.peak_bytes,
                "l_peak_bytes": t.l_peak_bytes, "paper_l_peak_bytes": p.l_peak_bytes,
                "ratio": t.ratio, "paper_ratio": p.ratio, "peak_step": t.peak_step,
                "peak_layer": t.steps[t.peak_op].layer if t.steps else None,
                "recompute_count": t.recompute_count, "extra_flops": t.extra_flops,
                "forward_flops": self.forward_flops, "d2h_bytes": t.d2h_bytes, "h2d_bytes": t.h2d_bytes,
                "cache_hits": t.cache_hits, "cache_misses": t.cache_misses, "host_peak_bytes": t.host_peak_bytes,
                "arena_bytes": self.arena_bytes, "slab_bytes": self.slab_bytes, "by_kind": by_kind_json(t)}


def by_kind_json(trace) -> dict | None:
    """:meth:`Trace.by_kind` as plain data: ``{kind: {"device_bytes": .., "host_bytes": ..}}``."""
    if trace is None:
        return None
    return {k: {"device_bytes": d, "host_bytes": h} for k, (d, h) in trace.by_kind().items()}


def run(graph, config: MemoryConfig, plan: Plan | None = None) -> Trace:
    """One training iteration's trace, read off its program: the scheduler's plan, or ``plan``."""
    return trace_program(place(graph, config, plan=plan), config.count)


def fits(graph, config: MemoryConfig, plan: Plan | None = None) -> bool:
    """Whether one iteration runs under ``config.budget_bytes`` (True where there is none)."""
    try:
        place(graph, config, plan=plan, refine=False)  # the refinement never raises the peak
        return True
    except BudgetError:
        return False


def measure(graph, config: MemoryConfig, label: str | None = None, plan: Plan | None = None) -> Measurement:
    """Simulate ``config`` with both counts. Under a budget that is too small, the numbers are of
    the run without it (what it would need) and ``fits`` is False."""
    budgeted = config.budget_bytes is not None or config.host_budget_bytes is not None
    try:
        program, ok = place(graph, config, plan=plan), (True if budgeted else None)
    except BudgetError:
        config = config.replace(budget_bytes=None, host_budget_bytes=None)
        program, ok = place(graph, config, plan=plan), False
    t_all, t_paper = trace_program(program, "all"), trace_program(program, "paper")
    return Measurement(label or config.describe(), config, t_all, t_paper, graph.flops(), ok, program, graph)


# ---------------------------------------------------------------------------- how close to l_peak
@dataclass
class MinBudget:
    """The smallest budget under which ``config`` runs one iteration, against l_peak: the paper's
    claim that SuperNeurons' peak is about l_peak, put the way a GPU decides it (does it fit?).
    ``l_peak_bytes`` is the largest working set of one route step (activations and gradients, each
    once, an in-place dx in dy's buffer once); ``persistent_bytes`` what is held all iteration (the
    weights, and their gradients and momentum unless they are updated in backward and wait on the
    host), which any budget must hold too, so ``ratio`` adds them to l_peak."""

    label: str
    config: MemoryConfig
    budget_bytes: int  # the smallest budget, a whole number of the pool's 1 KiB blocks
    l_peak_bytes: int
    persistent_bytes: int
    seconds: float

    @property
    def ratio(self) -> float:
        """budget / (l_peak + what is held all iteration): 1 is the paper's ideal."""
        return self.budget_bytes / (self.l_peak_bytes + self.persistent_bytes)


def min_budget(graph, config: MemoryConfig | None = None, label: str = "superneurons()") -> MinBudget:
    """The smallest ``budget_bytes`` (a whole number of 1 KiB blocks) under which ``config`` (default
    ``superneurons()``) places one training iteration of ``graph``. No budget below l_peak plus the
    persistent tensors can work; the search gallops up from there (+0.1%, +0.2%, +0.4%...) to the
    first budget that fits, then bisects down to the block. It searches from the bottom because
    fitting is not quite monotone in the budget (the dynamic workspace and the cache decide by what
    is free, so a larger pool can fragment where a smaller one did not)."""
    from snlite.placement import fits

    t0 = time.perf_counter()
    config = (config or MemoryConfig.superneurons()).replace(budget_bytes=None, count="all")
    # the bound must hold for every placement the search may meet: with optimizer_state "auto" a
    # tight budget sends the momentum to the host, so count it where it weighs least
    lowest = config.replace(optimizer_state="host") if config.optimizer_state == "auto" else config
    program = place(graph, lowest)
    at_start = trace_program(program, "all").steps[0].device_bytes
    persistent = at_start["weights"] + at_start["weight_grads"] + at_start["optimizer"]
    l_peak = trace_program(program, "paper").l_peak_bytes
    block = 1024
    lo = (l_peak + persistent - 1) // block  # in blocks; never fits: one byte short of the busiest step
    step = max(1, lo // 1024)
    while not fits(graph, config.replace(budget_bytes=(lo + step) * block)):
        lo, step = lo + step, 2 * step
    hi = lo + step  # fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(graph, config.replace(budget_bytes=mid * block)):
            hi = mid
        else:
            lo = mid
    return MinBudget(label, config, hi * block, l_peak, persistent, time.perf_counter() - t0)


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
    from snlite import timing

    return timing.estimate(place(graph, ALL_RESIDENT.replace(workspace=workspace)), graph, gpu).step_ms


def compare(graph, budget_bytes: int | None = None, progress=no_progress) -> list[Measurement]:
    """One Measurement per strategy of ``COMPARE`` (each "+ recompute" row on top of liveness +
    offload), then the sqrt(N) checkpointing reference (liveness on). With a budget, each row
    runs under it (the cache only moves data when memory runs short, so only then does it show).
    ``progress(text)`` is told which strategy runs (``snlite compare`` shows it on stderr)."""
    n = len(COMPARE) + 1
    rows = []
    for i, (label, cfg) in enumerate(COMPARE.items(), 1):
        progress(f"{graph.name}: {label} ({i}/{n})")
        rows.append(measure(graph, cfg.replace(budget_bytes=budget_bytes), label))
    progress(f"{graph.name}: {SQRT_LABEL} ({n}/{n})")
    plan = checkpoint_plan(graph)
    rows.append(measure(graph, plan.config.replace(budget_bytes=budget_bytes), SQRT_LABEL, plan))
    return rows


# ---------------------------------------------------------------------------- searching
def largest(n: int, ok, start: int = 0) -> int | None:
    """The largest index i < n with ``ok(i)``, for ``ok`` True then False along 0..n-1 (None if
    ``ok(0)`` is False). Gallops from ``start`` (steps 1, 2, 4, ...) to bracket the edge, then
    bisects, so a guess off by d costs about 2 log2(d) + 1 probes. Fitting a budget is taken to be
    monotone in the size; the pool's fragmentation can bend that (more since weight gradients and
    momentum come and go in backward), so what a search guarantees is that its result fits and the
    next candidate does not (both simulated)."""
    start = min(max(start, 0), n - 1)

    def steps():
        s = 1
        while True:
            yield s
            s *= 2

    if ok(start):
        lo = start
        for step in steps():
            if lo == n - 1:
                return lo
            probe = min(lo + step, n - 1)
            if not ok(probe):
                hi = probe
                break
            lo = probe
    else:
        hi = start
        for step in steps():
            if hi == 0:
                return None
            probe = max(hi - step, 0)
            if ok(probe):
                lo = probe
                break
            hi = probe
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Found:
    """What a search found: ``value`` (a batch or a depth; None if even the smallest fails),
    the trace there, the next candidate (which does not fit; None where the cap was reached)."""

    label: str
    config: MemoryConfig
    value: int | None
    trace: Trace | None
    next_value: int | None
    probes: int
    seconds: float
    capped: bool = False

    @property
    def host_peak_bytes(self) -> int | None:
        return self.trace.host_peak_bytes if self.trace is not None else None


def _search(label, config, candidates, build, guess_from, progress=no_progress, what=str,
            further: bool = False) -> Found:
    """Largest candidate x with ``build(x)`` fitting ``config`` (count "all"), starting near the
    estimate of :func:`_estimate` over the two sample points ``guess_from`` (drawn ``further`` out
    where they measure mostly fixed costs). ``progress(text)`` is told each probe, the candidate
    written by ``what``."""
    t0 = time.perf_counter()
    config = config.replace(count="all")
    traces: dict[int, bool] = {}  # candidate index -> fits
    kept: dict[int, Trace] = {}  # the full traces of probes that settled the answer

    def ok(i):
        if i not in traces:
            progress(f"{label}: probe {len(traces) + 1}, {what(candidates[i])}")
            if traces.get(i + 1) is False or i == len(candidates) - 1:
                # if this one fits it is the answer: place it in full now rather than twice
                try:
                    kept[i] = run(build(candidates[i]), config)
                    traces[i] = True
                except BudgetError:
                    traces[i] = False
            else:
                traces[i] = fits(build(candidates[i]), config)
        return traces[i]

    if guess_from:
        progress(f"{label}: estimating from {what(guess_from[0])} and {what(guess_from[1])}")
    guess = _estimate(build, config, guess_from, further)
    start = 0 if guess is None else max((i for i, c in enumerate(candidates) if c <= guess), default=0)
    i = largest(len(candidates), ok, start)
    nxt = candidates[i + 1] if i is not None and i + 1 < len(candidates) else (candidates[0] if i is None else None)
    trace = None
    if i is not None:
        trace = kept.get(i)
        if trace is None:
            progress(f"{label}: the trace of {what(candidates[i])}")
            trace = run(build(candidates[i]), config)
    return Found(label, config, None if i is None else candidates[i], trace, nxt,
                 len(traces), time.perf_counter() - t0, capped=i == len(candidates) - 1)


def _estimate(build, config, xs, further: bool = False) -> float | None:
    """Where the peak crosses the budget, by a straight line through the peaks at two sizes
    under ``config`` without the budget, the cache or workspaces (a guess to start from). With
    ``further``, where the line lands more than 8 times beyond the larger size, what it measured is
    mostly a fixed cost (AlexNet's largest step at batch 32 is a fully connected layer's update,
    whatever the batch), so it is drawn again through sizes further out, at most twice (a batch
    search asks for it; a ResNet's depth scales every step alike). With ``optimizer_state="auto"``
    the guess is for momentum on the host (a search's answer is where memory runs short, which is
    where auto sends it there)."""
    if not xs:
        return None
    state = "host" if config.optimizer_state == "auto" else config.optimizer_state
    cfg = config.replace(budget_bytes=None, cache=False, workspace="none", optimizer_state=state)
    # with the cache, what must fit is roughly the largest step's working set (everything else can
    # wait on the host); without it, the peak
    need = (lambda t: t.l_peak_bytes) if config.cache else (lambda t: t.peak_bytes)
    seen: dict = {}

    def at(x):
        if x not in seen:
            seen[x] = need(run(build(x), cfg))
        return seen[x]

    (x0, x1) = xs
    for _ in range(3):
        p0, p1 = at(x0), at(x1)
        if p1 <= p0:
            return None
        guess = x0 + (config.budget_bytes - p0) * (x1 - x0) / (p1 - p0)
        if not further or guess <= 8 * x1:
            break
        x0, x1 = x1, 8 * x1
    return guess


MAX_BATCH = 1 << 16
SEARCH = {
    "baseline": MemoryConfig(),
    "liveness": MemoryConfig(liveness=True),
    "+ offload": MemoryConfig(**_LO),
    "+ recompute": MemoryConfig(**_LO, recompute="cost_aware"),
    "superneurons": MemoryConfig.superneurons(),
}
PAPER_BEST_OTHER_BATCH = {"alexnet": 1408, "vgg16": 80, "inception_v4": 64, "resnet50": 128, "resnet101": 80,
                          "resnet152": 48}  # docs/paper.md section 7, the best other framework
PAPER_DEPTH = {"Caffe": 148, "Torch": 152, "MXNet": 480, "TensorFlow": 592, "SuperNeurons": 1920}  # batch 16
PAPER_DEPTH_AT_BATCH = {16: 1920, 1: 3 * 2500 + 2}  # SuperNeurons' deepest ResNet (docs/paper.md section 7)
PAPER_BATCH = PAPER_WIDTH_BATCH


def max_batch(build, config: MemoryConfig, label: str = "", lo: int = 1, hi: int = MAX_BATCH,
              progress=no_progress) -> Found:
    """The largest batch in [lo, hi] for which ``build(batch)`` fits ``config.budget_bytes``."""
    if config.budget_bytes is None:
        raise ValueError("max_batch needs a budget (config.budget_bytes)")
    sample = (8, 32) if hi >= 32 else None
    return _search(label or config.describe(), config, range(lo, hi + 1), build, sample, progress,
                   lambda b: f"batch {b:,d}", further=True)


MIN_UNITS = 16  # ResNet-50's residual units: the shallowest ImageNet ResNet


def resnet_units(max_units: int = 10_000) -> list[int]:
    """Residual units of every valid ImageNet ResNet depth (depth = 3 * units + 2) up to
    ``max_units``: 50 and 101 (16 and 33 units), then 152, 155, ... (50, 51, ... units)."""
    if max_units < MIN_UNITS:
        raise ValueError(f"max_units must be at least {MIN_UNITS} (ResNet-50, the shallowest ImageNet ResNet), "
                         f"got {max_units}")
    return [u for u in (16, 33) if u <= max_units] + list(range(50, max_units + 1))


def _depth(units: int) -> str:
    return f"depth {3 * units + 2:,d} ({units:,d} units)"


def max_depth(batch: int, config: MemoryConfig, label: str = "", max_units: int = 10_000,
              build=None, progress=no_progress) -> Found:
    """The deepest ImageNet ResNet (:func:`resnet_units`) that fits ``config.budget_bytes`` at
    ``batch``; ``value`` is the depth. Starts from a straight-line estimate through 50 and 100
    units, so a search costs about five simulations of the size it ends at."""
    if config.budget_bytes is None:
        raise ValueError("max_depth needs a budget (config.budget_bytes)")
    build = build or _resnet_builder(batch)
    units = resnet_units(max_units)
    guess_from = (50, 100) if max_units >= 100 else None
    found = _search(label or config.describe(), config, units, build, guess_from, progress, _depth)
    found.value = None if found.value is None else 3 * found.value + 2
    found.next_value = None if found.next_value is None else 3 * found.next_value + 2
    return found


def _resnet_builder(batch: int):
    @lru_cache(maxsize=8)
    def build(units: int):
        return resnet(3 * units + 2, batch)
    return build


def _numbered(progress, i: int, n: int):
    return lambda text: progress(f"{text} [strategy {i}/{n}]")


def max_batch_table(build, budget_bytes: int, hi: int = MAX_BATCH, progress=no_progress) -> list[Found]:
    """:func:`max_batch` under every strategy of ``SEARCH`` (the paper's Table 5)."""
    return [max_batch(build, cfg.replace(budget_bytes=budget_bytes), label, hi=hi,
                      progress=_numbered(progress, i, len(SEARCH))) for i, (label, cfg) in enumerate(SEARCH.items(), 1)]


def max_depth_table(batch: int, budget_bytes: int, max_units: int = 10_000, progress=no_progress) -> list[Found]:
    """:func:`max_depth` under every strategy of ``SEARCH`` (the paper's Table 4), sharing the graphs."""
    build = _resnet_builder(batch)
    return [max_depth(batch, cfg.replace(budget_bytes=budget_bytes), label, max_units, build,
                      _numbered(progress, i, len(SEARCH))) for i, (label, cfg) in enumerate(SEARCH.items(), 1)]


# ---------------------------------------------------------------------------- why it does not fit
COSTS = ("nothing", "bytes moved", "slower convolutions", "extra FLOPs", "a smaller batch")


@dataclass
class Suggestion:
    """A change to the configuration (or the batch), simulated under the same budget. ``peak_bytes``
    is the peak of that run where it fits, else of the run without a budget (what it would need)."""

    change: str  # as flags: "--liveness", "--recompute cost_aware", "--batch 96"
    what: str
    config: MemoryConfig
    batch: int
    fits: bool
    peak_bytes: int | None
    saved_bytes: int | None
    extra_flops: int = 0
    forward_flops: int = 0
    moved_bytes: int = 0
    host_peak_bytes: int = 0
    cost: str = "nothing"  # one of COSTS

    @property
    def extra_pct(self) -> float:
        return 100.0 * self.extra_flops / self.forward_flops if self.forward_flops else 0.0

    def rank_key(self):
        return (not self.fits, COSTS.index(self.cost), self.extra_flops, self.moved_bytes, self.peak_bytes or 0)


@dataclass
class Explanation:
    """Whether ``batch`` fits ``config``; if not, the runtime's account of where it failed, the run
    without a budget (``need``: its peak, the step and the tensors live there) and the ranked changes."""

    net: str
    batch: int
    config: MemoryConfig
    fits: bool
    message: str = ""
    need: Measurement | None = None
    suggestions: list[Suggestion] = field(default_factory=list)


def _changes(c: MemoryConfig) -> list[tuple[str, str, dict]]:
    out = []
    if not c.liveness:
        out.append(("--liveness", "turn on liveness analysis", {"liveness": True}))
    if not c.offload:
        out.append(("--offload", "offload CONV outputs to the host", {"offload": True}))
    if not c.cache:
        out.append(("--cache", "turn on the LRU tensor cache", {"cache": True}))
    if c.recompute not in ("cost_aware", "memory"):
        out.append(("--recompute cost_aware", "cost-aware recomputation", {"recompute": "cost_aware"}))
    if c.recompute != "memory":
        out.append(("--recompute memory", "memory-centric recomputation", {"recompute": "memory"}))
    if c.workspace != "none":
        out.append(("--workspace none", "no convolution workspace", {"workspace": "none"}))
    return out


def _cost(m: Measurement, changes: dict) -> str:
    """What a change costs, by what it turns on (offload and the cache cost nothing if they moved nothing)."""
    moved = 1 if m.moved_bytes else 0
    rank = {"liveness": 0, "offload": moved, "cache": moved, "workspace": 2, "recompute": 3}
    return COSTS[max(rank[k] for k in changes)]


def explain_budget(build, batch: int, config: MemoryConfig) -> Explanation:
    """Does ``build(batch)`` fit ``config.budget_bytes``? If not: why (the runtime's message, and
    the run without a budget), and every change not already on, each simulated under the same
    budget (liveness, offload, the cache, cost-aware or memory-centric recomputation, no
    workspace, all of them together, and the largest batch that fits as it is), ranked: those
    that fit first; then by what they cost: nothing < bytes moved < slower convolutions < extra
    FLOPs < a smaller batch; then fewer extra FLOPs, fewer bytes moved, a lower peak."""
    if config.budget_bytes is None:
        raise ValueError("explain_budget needs a budget (config.budget_bytes)")
    config = config.replace(count="all")
    graph = build(batch)
    try:
        run(graph, config)
        return Explanation(graph.name, batch, config, True)
    except BudgetError as e:
        message = str(e)
    need = measure(graph, config.replace(budget_bytes=None))
    changes = _changes(config)
    together = [c for c in changes if c[0] != "--recompute memory" or config.recompute == "cost_aware"]
    if len(together) > 1:
        changes.append((" ".join(flag for flag, _, _ in together), "all of the above together",
                        {k: v for _, _, kw in together for k, v in kw.items()}))
    suggestions = []
    for flag, what, kw in changes:
        m = measure(graph, config.replace(**kw))
        suggestions.append(Suggestion(flag, what, config.replace(**kw), batch, bool(m.fits), m.peak_bytes,
                                      need.peak_bytes - m.peak_bytes, m.trace.extra_flops, m.forward_flops,
                                      m.moved_bytes, m.trace.host_peak_bytes, _cost(m, kw)))
    if batch > 1:
        found = max_batch(build, config, lo=1, hi=batch - 1)
        if found.value is not None:
            t = found.trace
            suggestions.append(Suggestion(f"--batch {found.value}", "the largest batch that fits as configured",
                                          config, found.value, True, t.peak_bytes, need.peak_bytes - t.peak_bytes,
                                          t.extra_flops, build(found.value).flops(), t.d2h_bytes + t.h2d_bytes,
                                          t.host_peak_bytes, "a smaller batch"))
    suggestions.sort(key=Suggestion.rank_key)
    return Explanation(graph.name, batch, config, False, message, need, suggestions)
