"""Will it fit? The largest batch, the deepest network and the smallest budget under a
configuration: searches on the meta device (what would make a plan fit that does not:
:mod:`snlite.explain`).

    max_batch(lambda b: get_model("alexnet", b), cfg)    # largest batch under cfg.budget_bytes
    max_depth(16, cfg)                                   # deepest ImageNet ResNet under it
    max_batch_table(build, 12 * 2**30)                   # every strategy of SEARCH (the paper's Table 5)
    min_budget(graph)                                    # superneurons()'s smallest budget / l_peak

"Fits" always means: the program was placed under ``budget_bytes`` (:func:`snlite.budget.fits`),
never a comparison of peaks, since fragmentation, the LRU cache and the dynamic workspace all
depend on the budget. Each probe is one placement of the meta device, so a search is counted in
probes and seconds (``Found.probes``, ``Found.seconds``). :mod:`snlite.measure` holds what one run
costs; this module asks how far runs go.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

from snlite.budget import first_fitting, fits
from snlite.checks import integer
from snlite.config import MemoryConfig, config_of
from snlite.errors import BudgetError, HostBudgetError
from snlite.graph import graph_of
from snlite.measure import _LO, no_progress
from snlite.models import PAPER_WIDTH_BATCH, resnet
from snlite.pipeline import place, probe_or_raise, simulate
from snlite.scheduler import Scheduler
from snlite.trace import Trace, trace_program


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


def min_budget(graph, config: MemoryConfig | None = None, label: str | None = None,
               resolution: int = 1) -> MinBudget:
    """The smallest ``budget_bytes`` (a whole number of 1 KiB blocks) under which ``config`` (default
    ``superneurons()``) places one training iteration of ``graph``. No budget below l_peak plus the
    persistent tensors can work; the search gallops up from there (+0.1%, +0.2%, +0.4%...) to the
    first budget that fits, then bisects down to the block. It searches from the bottom because
    fitting is not quite monotone in the budget (the dynamic workspace and the cache decide by what
    is free, so a larger pool can fragment where a smaller one did not). ``resolution``: the answer
    in steps of that many blocks (a search's first guess needs it only to about 0.1%).

    Under a ``host_budget_bytes``, a device budget fits only where the pinned memory fits too. With
    no device budget a plan pins the least (the cache evicts nothing, "auto" keeps the momentum on
    the device), so where even that exceeds the host budget no device budget can help: the
    :class:`~snlite.errors.HostBudgetError` of that placement is raised, rather than a search that
    would never end. ``label``: what the result is called (default ``superneurons()``, or the
    config's description); any ``budget_bytes`` of ``config`` is the search's to choose."""
    t0 = time.perf_counter()
    resolution = integer(resolution, "min_budget's resolution (blocks of 1 KiB)")
    graph = graph_of(graph)
    given = config
    config = config_of(config) if config is not None else MemoryConfig.superneurons()
    label = label or ("superneurons()" if given is None else config.describe())
    config = config.replace(budget_bytes=None, count="all")
    if config.host_budget_bytes is not None:
        place(graph, config)  # raises HostBudgetError where no device budget meets the host budget
    # the bound must hold for every placement the search may meet: with optimizer_state "auto" a
    # tight budget sends the momentum to the host, so count it where it weighs least (the bound is
    # the device's: the host budget plays no part in it)
    lowest = config.replace(host_budget_bytes=None)
    if config.optimizer_state == "auto":
        lowest = lowest.replace(optimizer_state="host")
    program = place(graph, lowest)
    at_start = trace_program(program, "all").steps[0].device_bytes
    persistent = at_start["weights"] + at_start["weight_grads"] + at_start["optimizer"]
    l_peak = trace_program(program, "paper").l_peak_bytes
    block = 1024 * resolution
    plan = Scheduler(graph, config).plan()  # the budget changes no decision of the scheduler's: planned once
    lo = (l_peak + persistent - 1) // block  # in blocks; never fits: one byte short of the busiest step
    blocks = first_fitting(lambda n: fits(graph, config.replace(budget_bytes=n * block), plan=plan), lo,
                           step=max(1, lo // 1024))  # +0.1%, +0.2%, +0.4%... then bisection
    return MinBudget(label, config, blocks * block, l_peak, persistent, time.perf_counter() - t0)


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
    the trace there, the next candidate (which does not fit; None where the cap was reached) and
    ``stopped_by``, the memory it ran out of ("device" or "host"; None where the cap was reached).
    The trace is of the placement that decided "it fits", with the momentum where :func:`place`
    puts it; :func:`place` adds the cache's time-aware second placement (a GPU schedule), which
    never raises the peak and moves no more bytes, so the search leaves it out (with the cache near
    full it costs two more placements of the largest network)."""

    label: str
    config: MemoryConfig
    value: int | None
    trace: Trace | None
    next_value: int | None
    probes: int
    seconds: float
    capped: bool = False
    stopped_by: str | None = None

    @property
    def host_peak_bytes(self) -> int | None:
        return self.trace.host_peak_bytes if self.trace is not None else None


def _search(label, config, candidates, build, guess_from, progress=no_progress, what=str,
            further: bool = False, slack: str = "bytes") -> Found:
    """Largest candidate x with ``build(x)`` fitting ``config`` (count "all"), starting near the
    estimate of :func:`_estimate` over the two sample points ``guess_from`` (drawn ``further`` out
    where they measure mostly fixed costs). ``progress(text)`` is told each probe, the candidate
    written by ``what``."""
    t0 = time.perf_counter()
    config = config.replace(count="all")
    traces: dict[int, str | None] = {}  # candidate index -> None where it fits, else what ran out
    best: dict = {}  # the probe of the largest candidate that fit so far (the answer, in the end)

    def ok(i):
        if i not in traces:
            progress(f"{label}: probe {len(traces) + 1}, {what(candidates[i])}")
            try:
                found = probe_or_raise(build(candidates[i]), config)  # does it fit? (all a probe asks)
            except BudgetError as e:
                traces[i] = "host" if isinstance(e, HostBudgetError) else "device"
            else:
                traces[i] = None
                if i >= best.get("i", -1):
                    best.update(i=i, probe=found)
        return traces[i] is None

    if guess_from:
        progress(f"{label}: estimating from {what(guess_from[0])} and {what(guess_from[1])}")
    guess = _estimate(build, config, guess_from, further, slack, ceiling=candidates[-1])
    start = 0 if guess is None else max((i for i, c in enumerate(candidates) if c <= guess), default=0)
    i = largest(len(candidates), ok, start)
    after = 0 if i is None else i + 1  # the first candidate that does not fit, if any
    nxt = candidates[after] if after < len(candidates) else None
    trace = None
    if i is not None:
        trace = trace_program(best.pop("probe").final(refine=False), config.count)
    return Found(label, config, None if i is None else candidates[i], trace, nxt,
                 len(traces), time.perf_counter() - t0, capped=i == len(candidates) - 1,
                 stopped_by=traces.get(after))


def _estimate(build, config, xs, further: bool = False, slack: str = "bytes",
              ceiling: int | None = None) -> float | None:
    """Where the peak crosses the budget, by a straight line through the peaks at two sizes
    under ``config`` without the budget, the cache or workspaces (a guess to start from). With
    ``further``, where the line lands more than 8 times beyond the larger size, what it measured is
    mostly a fixed cost (AlexNet's largest step at batch 32 is a fully connected layer's update,
    whatever the batch), so it is drawn again through sizes further out, at most twice (a batch
    search asks for it; a ResNet's depth scales every step alike). With ``optimizer_state="auto"``
    the guess is for momentum on the host (a search's answer is where memory runs short, which is
    where auto sends it there). ``ceiling``: the largest size the search may try; the line is not drawn
    through sizes beyond it (a guess past the ceiling starts the search at the ceiling all the same).

    With the cache, what must fit is the busiest step (l_peak, count all) and what a placement under
    pressure needs beyond it (fragmentation, the dynamic workspace, momentum fetched for its update).
    That is measured at one sample size, as its smallest budget (:func:`min_budget`, to about 0.1%)
    over its l_peak, and carried to every size: as the same bytes, measured at the smaller size
    (``slack="bytes"``: a deeper ResNet adds units, not a busier step, so the extra stays put: 30.75
    MiB at batch 16 from 50 to 200 units), or as the same ratio, measured at the larger size
    (``slack="ratio"``: a larger batch scales every step, the extra too). Across Table 5's networks
    the guess lands within 6 of the answer (it was up to 135 off with l_peak alone: 16 probes)."""
    if not xs:
        return None
    state = "host" if config.optimizer_state == "auto" else config.optimizer_state
    cfg = config.replace(budget_bytes=None, host_budget_bytes=None, cache=False, workspace="none",
                         optimizer_state=state, schedule="paper")  # retiming keeps the peak: not needed here
    need = (lambda t: t.l_peak_bytes) if config.cache else (lambda t: t.peak_bytes)
    seen: dict = {}

    def at(x):
        if x not in seen:
            seen[x] = need(simulate(build(x), cfg))
        return seen[x]

    def line(room):
        return x0 + (room - at(x0)) * (x1 - x0) / (at(x1) - at(x0))

    (x0, x1) = xs
    for redraws in range(3):
        if at(x1) <= at(x0):
            return None
        guess = line(config.budget_bytes)
        if not further or guess <= 8 * x1 or redraws == 2 or (ceiling is not None and x1 >= ceiling):
            break  # (x0, x1) stay the sizes the guess was drawn through
        x0, x1 = x1, 8 * x1 if ceiling is None else min(8 * x1, ceiling)
    if not config.cache:
        return guess
    if slack == "bytes":
        return line(config.budget_bytes - (_least(build(x0), config, at(x0)) - at(x0)))
    return line(config.budget_bytes * at(x1) / _least(build(x1), config, at(x1)))


def _least(graph, config: MemoryConfig, l_peak: int) -> int:
    """The smallest budget under which ``graph`` fits ``config`` (:func:`min_budget`), to about 0.1%
    of its ``l_peak`` (a guess needs no finer); ``l_peak`` where no budget fits."""
    try:
        return max(min_budget(graph, config.replace(budget_bytes=None),
                              resolution=max(1, l_peak // 2**20)).budget_bytes, l_peak)
    except BudgetError:
        return l_peak


MAX_BATCH = 1 << 16
# The deepest ResNet maxdepth probes by default (residual units; depth 9,002): deep enough for every
# depth docs/results.md reports (2,865 units at batch 1 in 12 GiB), shallow enough that a search which
# still fits there (a large budget) ends in about a minute: each probe places the whole network,
# 3 * units + 2 layers, and holds its program in this machine's memory (PLANNER_BYTES_PER_UNIT).
MAX_UNITS = 3_000
# host RAM the planner holds per residual unit (superneurons(), measured ~120 KiB)
PLANNER_BYTES_PER_UNIT = 128 << 10
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


def max_batch(build, config: MemoryConfig, label: str = "", lo: int | None = None, hi: int = MAX_BATCH,
              progress=no_progress) -> Found:
    """The largest batch in [lo, hi] for which ``build(batch)`` fits ``config``'s budgets
    (``budget_bytes``, ``host_budget_bytes`` or both; the first guess is drawn from the device's).
    ``config`` must be a MemoryConfig.
    ``lo``: by default the smallest valid batch (:func:`smallest_batch`: 1, or 2 where 1 is none)."""
    config = config_of(config)
    if config.budget_bytes is None and config.host_budget_bytes is None:
        raise ValueError("max_batch needs a budget (config.budget_bytes or config.host_budget_bytes)")
    _check_builder(build, "max_batch", "batch", "lambda b: get_model('alexnet', batch=b)")
    lo = smallest_batch(build)[0] if lo is None else integer(lo, "max_batch's lo")
    hi = integer(hi, "max_batch's hi")
    if lo > hi:
        raise ValueError(f"max_batch searches the batches from lo to hi, and lo {lo} is above hi {hi}")
    sample = (8, 32) if hi >= 32 and config.budget_bytes is not None else None
    return _search(label or config.describe(), config, range(lo, hi + 1), build, sample, progress,
                   lambda b: f"batch {b:,d}", further=True, slack="ratio")


MIN_UNITS = 16  # ResNet-50's residual units: the shallowest ImageNet ResNet


def resnet_units(max_units: int = 10_000) -> list[int]:
    """Residual units of every valid ImageNet ResNet depth (depth = 3 * units + 2) up to
    ``max_units``: 50 and 101 (16 and 33 units), then 152, 155, ... (50, 51, ... units)."""
    if max_units < MIN_UNITS:
        raise ValueError(f"max_units must be at least {MIN_UNITS} "
                         f"(ResNet-50, the shallowest ImageNet ResNet), "
                         f"got {max_units}")
    return [u for u in (16, 33) if u <= max_units] + list(range(50, max_units + 1))


def _depth(units: int) -> str:
    return f"depth {3 * units + 2:,d} ({units:,d} units)"


def max_depth(batch: int, config: MemoryConfig, label: str = "", max_units: int = 10_000,
              build=None, progress=no_progress) -> Found:
    """The deepest ImageNet ResNet (:func:`resnet_units`) that fits ``config.budget_bytes`` at
    ``batch``; ``value`` is the depth. Starts from a straight-line estimate through 50 and 100
    units, so a search costs about five simulations of the size it ends at."""
    config = config_of(config)
    if config.budget_bytes is None:
        raise ValueError("max_depth needs a budget (config.budget_bytes)")
    if build is None:
        build = _resnet_builder(integer(batch, "max_depth's batch"))
    else:
        _check_builder(build, "max_depth", "number of residual units", "lambda u: resnet(3 * u + 2, 16)")
    units = resnet_units(max_units)
    guess_from = (50, 100) if max_units >= 100 else None
    found = _search(label or config.describe(), config, units, build, guess_from, progress, _depth)
    found.value = None if found.value is None else 3 * found.value + 2
    found.next_value = None if found.next_value is None else 3 * found.next_value + 2
    return found


def _check_builder(build, search: str, of: str, example: str) -> None:
    """A search probes a network built for each candidate: ``build`` is that function, not a Graph."""
    if not callable(build) or isinstance(build, type):
        raise ValueError(f"{search} takes build, a function of the {of} giving the network's Graph (e.g. "
                         f"{example}), not {type(build).__name__ if not isinstance(build, type) else build}")


def _resnet_builder(batch: int):
    @lru_cache(maxsize=8)
    def build(units: int):
        return resnet(3 * units + 2, batch)
    return build


def _strategies(progress, **limits):
    """Each strategy of ``SEARCH`` as ``(label, config with limits, numbered progress)``."""
    return [(label, cfg.replace(**limits), lambda text, i=i: progress(f"{text} [strategy {i}/{len(SEARCH)}]"))
            for i, (label, cfg) in enumerate(SEARCH.items(), 1)]


def smallest_batch(build) -> tuple[int, str | None]:
    """The batch a search of ``build``'s net starts from, and why it is not 1: 2 where a batch of 1 is
    no valid input (a BatchNorm left with one value per channel, as after a ResNet's global pooling
    at CIFAR size), else 1. A net that builds at neither raises batch 1's error (an unknown name...)."""
    _check_builder(build, "max_batch", "batch", "lambda b: get_model('alexnet', batch=b)")
    try:
        build(1)
        return 1, None
    except ValueError as one:
        try:
            build(2)
        except ValueError:
            raise one from None
        return 2, str(one)


def max_batch_table(build, budget_bytes: int, hi: int = MAX_BATCH, progress=no_progress,
                    host_budget_bytes: int | None = None, fit: str = "first",
                    lo: int | None = None) -> list[Found]:
    """:func:`max_batch` under every strategy of ``SEARCH`` (the paper's Table 5), each placed with
    ``fit``; with ``host_budget_bytes`` a batch whose plan needs more pinned host memory does not fit.
    ``lo``: the smallest batch to try (default :func:`smallest_batch`'s)."""
    lo = smallest_batch(build)[0] if lo is None else lo
    return [max_batch(build, cfg, label, lo=lo, hi=hi, progress=each) for label, cfg, each in _strategies(
        progress, budget_bytes=budget_bytes, host_budget_bytes=host_budget_bytes, fit=fit)]


def max_depth_table(batch: int, budget_bytes: int, max_units: int = MAX_UNITS, progress=no_progress,
                    host_budget_bytes: int | None = None, fit: str = "first") -> list[Found]:
    """:func:`max_depth` under every strategy of ``SEARCH`` (the paper's Table 4), each placed with
    ``fit``, sharing the graphs; with ``host_budget_bytes`` a depth whose plan needs more pinned host
    memory does not fit."""
    build = _resnet_builder(batch)
    return [max_depth(batch, cfg, label, max_units, build, each) for label, cfg, each in _strategies(
        progress, budget_bytes=budget_bytes, host_budget_bytes=host_budget_bytes, fit=fit)]
