"""The planner's passes in order: the only module that knows it.

    graph --Scheduler--> Plan --retime--> Plan --placement.walk--> Program --trace_program--> Trace
                                                       \\--(cache on, a GPU schedule) hints, one more walk

1. the :class:`~snlite.scheduler.Scheduler` turns the config's stages into a plan (what happens);
2. with ``schedule`` naming a GPU, :func:`snlite.overlap.retime` moves the offload schedule's copies in
   time to hide behind compute, keeping the peak (it asks this module to place each candidate);
3. :func:`snlite.placement.walk` places the plan: every allocation, copy, event and launch (where and when);
   under ``fit="offline"`` :func:`snlite.offline.relocate` then moves every arena block, each offset
   chosen knowing every lifetime (:func:`_offline`);
4. with the LRU cache and a GPU schedule, the cache's moves are retimed too
   (:func:`snlite.overlap.cache_hints`) and the plan placed once more, kept only if it moves no more
   bytes at no higher peak;
5. :func:`snlite.trace.trace_program` reads the memory op by op off the program (:func:`simulate`).

Every pass takes plain data and returns plain data; each can be called, printed and tested alone.
``optimizer_state="auto"`` decides where the momentum waits: on the device if the iteration fits that way.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from snlite import offline, overlap, placement, timing
from snlite import workspace as ws
from snlite.checks import boolean, users_level
from snlite.errors import BudgetError, PlanError
from snlite.graph import graph_of
from snlite.config import MIN_BUDGET_BYTES, ConfigWarning, MemoryConfig, config_of, no_effect
from snlite.pool import TensorPool
from snlite.program import MODES, Launch, Program, without_cycle_collection
from snlite.scheduler import Plan, Scheduler, inference_plan, optimizer_specs, persistent_tensors
from snlite.tensor import IllegalTransition
from snlite.trace import trace_program

AFTER_PLACEMENT: list = []  # functions called with each placed program and its graph (the tests check each)


def place(graph, config: MemoryConfig | None = None, mode: str = "train", *, plan=None, costs=None,
          optimizer: bool = True, refine: bool = True) -> Program:
    """The program of one iteration of ``graph`` under ``config``.

    ``mode``: "train" (forward, backward and SGD with momentum), "grads" (no update), "update" (only
    the SGD step, for a caller that checks the gradients first) or "infer" (the forward route in
    inference mode, the logits read back). ``plan``: a plan built elsewhere
    (default: the :class:`~snlite.scheduler.Scheduler`'s). ``costs``: how conv algorithms are
    ranked (default :class:`~snlite.workspace.CostModel`; a GPU's measured table plans its choices).
    ``optimizer``: keep momentum buffers (False: weights and gradients only, no update).
    ``refine``: False skips the cache's time-aware second placement (which never raises the peak,
    so whether the iteration fits is already decided without it: a search asks only that).
    Raises :class:`~snlite.errors.BudgetError` if ``config.budget_bytes`` (or ``host_budget_bytes``)
    is too small."""
    graph, config = graph_of(graph), config_of(config)
    optimizer, refine = boolean(optimizer, "place's optimizer"), boolean(refine, "place's refine")
    if plan is not None:
        _check_plan(plan, graph, config)
    config = _checked(config, mode, optimizer, plan)
    for text in no_effect(config):  # (the command line says so itself, and ignores these)
        warnings.warn(text, ConfigWarning, stacklevel=users_level())
    with without_cycle_collection():
        job, placed = _first(graph, config, mode, plan, costs, optimizer)
        if refine:
            placed = _refined(job, placed)
    program = placed.program
    return program.without_updates() if mode == "grads" else program


@dataclass
class Job:
    """What the passes after the first placement work on: the config resolved (where the momentum
    waits), the plan, every tensor's spec, the conv costs and the mode."""

    graph: object
    config: MemoryConfig
    plan: object
    specs: dict
    costs: object
    mode: str


@dataclass
class Probe:
    """One training iteration that fits: ``program`` as first placed, and :meth:`final`, what
    :func:`place` returns (the cache's second placement, where it applies, made only when asked)."""

    job: Job
    placed: placement.Placed
    auto: MemoryConfig | None = None  # optimizer_state "auto" answered with the momentum on the host first
    plan: object = None  # the plan the caller gave, if any

    @property
    def program(self) -> Program:
        return self.placed.program

    def final(self, refine: bool = True) -> Program:
        """The program :func:`place` returns for this iteration (``refine=False``: without the cache's
        time-aware second placement, which never raises the peak and moves no more bytes)."""
        with without_cycle_collection():
            job, placed = self.job, self.placed
            auto = self.auto
            if auto is not None and _held_bytes(job.graph) <= auto.budget_bytes:
                # as place() decides: on the device, where the iteration fits that way (not tried
                # where the weights and their momentum alone exceed the budget, as in _first)
                try:
                    job, placed = _first(job.graph, auto.replace(optimizer_state="device"), "train",
                                         self.plan, None, True)
                except BudgetError:
                    pass
            return (_refined(job, placed) if refine else placed).program


def probe(graph, config: MemoryConfig, plan=None) -> Probe | None:
    """Does one training iteration of ``graph`` fit ``config``'s budgets? None where it does not;
    else a :class:`Probe` (:func:`probe_or_raise` says which budget ran out)."""
    try:
        return probe_or_raise(graph, config, plan)
    except BudgetError:
        return None


def probe_or_raise(graph, config: MemoryConfig, plan=None) -> Probe:
    """A :class:`Probe` of one training iteration of ``graph`` under ``config``'s budgets, or the
    :class:`~snlite.errors.BudgetError` (a :class:`~snlite.errors.HostBudgetError` where the pinned
    memory ran out) of the placement that decided it does not fit. A search asks this of each
    candidate and places only the answer in full. With ``optimizer_state="auto"`` under a budget the
    momentum is tried on the host first: where that fits, so does :func:`place` (on the device or,
    failing that, on the host), and the probe is answered by one placement; only where it does not
    is the device tried."""
    graph, config = graph_of(graph), _checked(config_of(config), "train", True, plan)
    with without_cycle_collection():
        # the scheduler never reads optimizer_state: one plan serves every place the momentum is tried
        plan = plan or Scheduler(graph, config).plan()
        if config.optimizer_state == "auto" and config.budget_bytes is not None:
            try:
                host = config.replace(optimizer_state="host")
                return Probe(*_first(graph, host, "train", plan, None, True), auto=config, plan=plan)
            except BudgetError:
                if _held_bytes(graph) > config.budget_bytes:
                    raise
                config = config.replace(optimizer_state="device")
        return Probe(*_first(graph, config, "train", plan, None, True))


def simulate(graph, config: MemoryConfig | None = None, optimizer: bool = True, costs=None, plan=None):
    """The trace of one training iteration of ``graph`` under ``config``, read off its program: what
    a :class:`~snlite.train.Model` (SGD with momentum, unless ``optimizer`` is False) then holds on
    the host or CUDA device, byte for byte. ``costs``: the conv timings a GPU measured."""
    config, optimizer = config_of(config), boolean(optimizer, "simulate's optimizer")
    program = place(graph, config, "train" if optimizer else "grads", plan=plan, costs=costs,
                    optimizer=optimizer)
    return trace_program(program, config.count)


# the switches a plan and the placement must agree on (what is freed, moved, updated in backward); a
# plan's recomputation is its own (the exact planner's and sqrt(N)'s plans run under liveness alone)
PLANNED_BY = ("liveness", "offload", "cache", "update_in_backward")


def _check_plan(plan, graph, config: MemoryConfig) -> None:
    """A plan given to place: a Plan, of this graph's layers, made under ``config``'s planning switches
    (else the program would do one thing and be labelled another: a superneurons() plan placed as
    "baseline" recomputed and offloaded under that name)."""
    if not isinstance(plan, Plan):
        raise ValueError(f"plan must be a Plan (Scheduler(graph, config).plan()), got {type(plan).__name__}")
    unknown = sorted({p.op.layer for p in plan.ops} - set(graph.layers))
    if unknown:
        more = f", nor {len(unknown) - 1} more of the plan's" if len(unknown) > 1 else ""
        raise ValueError(f"the plan is of another graph: {graph.name} has no layer {unknown[0]!r}{more}; "
                         "plan this graph: Scheduler(graph, config).plan()")
    differ = [f for f in PLANNED_BY if getattr(plan.config, f) != getattr(config, f)]
    if differ:
        said = ", ".join(f"{f}={getattr(plan.config, f)!r}" for f in differ)
        raise ValueError(f"the plan was made under {said}, the config says "
                         f"{', '.join(f'{f}={getattr(config, f)!r}' for f in differ)}: place it under the "
                         "config it was planned with (plan.config, with budgets and fit as you like)")


def _checked(config: MemoryConfig, mode: str, optimizer: bool, plan) -> MemoryConfig:
    """``config`` for ``mode``: refused where they contradict, SGD in backward only where it applies."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    if mode in ("train", "update") and not optimizer:
        raise ValueError("mode 'train' updates the weights, which needs the optimizer state; "
                         "use mode 'grads'")
    if config.update_in_backward and (mode != "train" or not optimizer):
        # gradients read back whole, an update alone, inference: nothing to update inside backward
        if plan is not None and any(p.op.phase == "update" for p in plan.ops):
            raise ValueError(f"this plan updates the weights inside backward, which only a 'train' "
                             f"program does; "
                             f"for mode {mode!r} plan under config.replace(update_in_backward=False)")
        config = config.replace(update_in_backward=False)
    return config


def _specs(graph, optimizer: bool) -> dict:
    """Every tensor of the iteration: the graph's, and SGD's momentum unless ``optimizer`` is False."""
    return {**graph.tensors(), **optimizer_specs(graph)} if optimizer else dict(graph.tensors())


def _walk(job: Job, plan, hints=None) -> placement.Placed:
    if job.config.fit == "offline" and job.config.allocator == "pool":
        placed = _offline(job, plan, hints)
    else:
        placed = placement.walk(job.graph, job.config, plan, job.specs, job.costs, job.mode, hints)
    for check in AFTER_PLACEMENT:
        check(placed.program, job.graph)
    return placed


def _offline(job: Job, plan, hints) -> placement.Placed:
    """``fit="offline"``: the walk's decisions, every arena offset then chosen knowing every lifetime
    (:func:`snlite.offline.relocate`, whose arena is never larger than the walk's own).

    The decisions are first fit's wherever first fit meets the budget (or there is none): the same
    instructions, other offsets. Where first fit runs out of contiguous room, the walk is planned
    with :class:`~snlite.pool.LivePool`, which limits only the bytes in use. Where the offsets then
    need more than the budget (the arena above the lower bound), the walk is planned again with less
    room: first less offered to the dynamic workspace (``spare``), then, once it gets none (or no conv
    takes any, when more withheld would change no walk), a smaller budget for the cache to evict
    against. Each retry takes the overshoot (at least a byte) and at least twice the last cut, and
    neither phase can cut more than the budget, so each ends within about 35 walks (2**35 bytes is
    32 GiB; a larger budget adds one walk per doubling): at a fit, or with nothing left to cut, or
    where the walk itself cannot fit the smaller budget; then the budgets between that one and the
    last that overshot are bisected (:func:`_between`). Where nothing fits yet, first fit is planned
    against each smaller budget whose offsets overshot (:func:`_first_fit_below`)."""
    def walk(config, spare=0):  # the walk, then its offsets chosen offline (written only if kept)
        placed = placement.walk(job.graph, config, plan, job.specs, job.costs, job.mode, hints, spare)
        return placed, offline.pack(placed.program)

    budget = job.config.budget_bytes
    try:
        return _kept(*walk(job.config.replace(fit="first")))
    except BudgetError:
        if budget is None:
            raise
    planning, spare, cut, overshot, above = budget, 0, 0, None, budget
    tried: list[int] = []  # smaller budgets where the bytes fitted, the offsets not: _first_fit_below
    while True:
        try:
            placed, packing = walk(job.config.replace(budget_bytes=planning), spare)
        except BudgetError:
            if overshot is None:
                raise  # more bytes live at once than the budget: no placement can fit
            found = _between(walk, job.config, spare, planning, above, budget, tried)
            break
        if packing.arena <= budget:
            return _kept(placed, packing)
        overshot = (f"{job.graph.name} does not fit a budget of {budget:,d} bytes under "
                    f"{job.config.describe()} with fit='offline': the bytes live at once fit "
                    f"({packing.lower:,d} at most), but placing them needs an arena of {packing.arena:,d} "
                    "bytes")
        if planning < budget:
            tried.append(planning)
        cut = max(packing.arena - budget, 2 * cut)
        if job.config.workspace == "dynamic" and spare < planning:
            if any(type(ins) is Launch and ins.workspace for ins in placed.program.body):
                spare += cut
                cut = 0 if spare >= planning else cut  # the cache's phase starts from the overshoot again
                continue
            # no conv took a workspace: withholding more room changes no walk, so that phase ends here
            spare, cut = planning, packing.arena - budget
        if not (job.config.cache and planning - cut >= MIN_BUDGET_BYTES):
            found = None  # nothing left to cut
            break
        above, planning = planning, planning - cut
    found = found or _first_fit_below(walk, job.config, tried)
    if found is None:
        raise BudgetError(overshot)
    return found


def _kept(placed: placement.Placed, packing) -> placement.Placed:
    """The walk's program with its offsets chosen offline (``packing``)."""
    placed.program = offline.relocate(placed.program, packing)
    return placed


def _between(walk, config: MemoryConfig, spare: int, lo: int, hi: int, budget: int, tried: list):
    """``fit="offline"``: the cache's budget ``lo`` was cut too far (the walk cannot fit it), and at
    ``hi`` the offsets overshot ``budget``; bisect the budgets between them, to within 1/256 of
    ``budget`` (a few walks: searches under offline probe many budgets that fail), for a walk whose
    offsets fit; None where none does (each budget whose offsets overshot is added to ``tried``)."""
    while hi - lo > max(MIN_BUDGET_BYTES, budget // 256):
        mid = (lo + hi) // 2
        try:
            placed, packing = walk(config.replace(budget_bytes=mid), spare)
        except BudgetError:
            lo = mid
            continue
        if packing.arena <= budget:
            return _kept(placed, packing)
        tried.append(mid)
        hi = mid
    return None


def _first_fit_below(walk, config: MemoryConfig, budgets: list):
    """``fit="offline"``'s last resort: first fit planned against each smaller budget where the
    offline walk fitted the bytes live at once but not its offsets, largest first; the first that
    fits is kept (its arena is within that budget, so within the real one). First fit is not
    monotone in the budget: where it fragments at the budget itself, a smaller one can change the
    cache's evictions enough to fit. None where none does."""
    for planning in sorted(set(budgets), reverse=True):
        try:
            return _kept(*walk(config.replace(fit="first", budget_bytes=planning)))
        except BudgetError:
            continue
    return None


def _first(graph, config, mode, plan, costs, optimizer) -> tuple[Job, placement.Placed]:
    """The first placement: the momentum's place decided (``optimizer_state="auto"``: on the device if
    the iteration fits that way, else in the pinned slab; a device too small even for the weights
    and their momentum is not tried), the copies retimed for a GPU schedule."""
    if config.optimizer_state == "auto":
        if mode == "infer" or not optimizer:
            states = ("device",)
        elif config.budget_bytes is None or _held_bytes(graph) <= config.budget_bytes:
            states = ("device", "host")
        else:
            states = ("host",)
        plan = plan or Scheduler(graph, config).plan()  # the same wherever the momentum waits
        for state in states[:-1]:
            try:
                return _first(graph, config.replace(optimizer_state=state), mode, plan, costs, optimizer)
            except BudgetError:
                pass
        try:
            return _first(graph, config.replace(optimizer_state=states[-1]), mode, plan, costs, optimizer)
        except BudgetError as e:  # its message describes the last try's config: say it was auto's
            if states == ("device",):
                raise
            why = ("on the device, tried first, it did not fit either" if len(states) > 1 else
                   "the device was not tried: the weights and their momentum alone exceed its budget")
            raise type(e)(f"{str(e).rstrip('.')}. (optimizer_state is auto, and this was its try with the "
                          f"momentum on the host: {why}.)") from None
    plan = plan or Scheduler(graph, config).plan()
    if mode == "infer":
        plan = inference_plan(plan, graph)
    job = Job(graph, config, plan, _specs(graph, optimizer), costs or ws.CostModel(), mode)
    if config.schedule != "paper" and mode in ("train", "grads") and job.plan.transfers:
        return job, _retimed(job)
    return job, _walk(job, job.plan)


def _held_bytes(graph) -> int:
    """The arena bytes of the weights, buffers and momentum: what the device holds all iteration."""
    block = TensorPool(1024).reserved_bytes
    tensors = graph.tensors()  # each weight's momentum is a float32 buffer of the weight's size
    return sum(block(max(tensors[n].nbytes, 1)) * (2 if tensors[n].kind == "weight" else 1)
               for n in persistent_tensors(tensors, without_grads=True))


def _retimed(job: Job) -> placement.Placed:
    """The plan's offload copies moved in time for the GPU ``config.schedule`` (:func:`overlap.retime`),
    placed; each candidate is placed once, and the one kept is the program returned."""
    plan, config = job.plan, job.config
    first = _walk(job, plan)
    placed = [(plan, first)]

    def peak_of(candidate):
        try:
            placed.append((candidate, _walk(job, candidate)))
        except BudgetError:  # held longer, a block no longer fits the budget somewhere
            return None
        trace = trace_program(placed[-1][1].program, "all")
        return trace.peak_bytes, trace.steps[trace.peak_op].op

    start = timing.op_starts(first.program, job.graph, config.schedule, len(plan.ops))
    nbytes = {tr.tensor: job.specs[tr.tensor].nbytes for tr in plan.transfers}
    peak = trace_program(first.program, "all").peak_bytes
    chosen = overlap.retime(plan, start, nbytes, timing.profile(config.schedule), peak, peak_of)
    kept = next(p for c, p in placed if c is chosen)
    if chosen is not plan and not _no_worse(job, first, kept):
        chosen, kept = plan, first
    job.plan = chosen
    return kept


def _no_worse(job: Job, first: placement.Placed, candidate: placement.Placed) -> bool:
    """A retimed placement is kept only if its peak in the count asked for is no higher and its
    estimated step no longer: held longer, a block can leave the dynamic workspace less room (a conv
    in smaller chunks, a slower step) or raise the paper count's peak where the count "all" stays."""
    count = job.config.count
    if trace_program(candidate.program, count).peak_bytes > trace_program(first.program, count).peak_bytes:
        return False
    gpu = job.config.schedule
    new, old = (timing.estimate(p.program, job.graph, gpu).step_ms for p in (candidate, first))
    return new <= old * (1 + 1e-9)  # no longer, but for rounding: the same work in another order


def _refined(job: Job, first: placement.Placed) -> placement.Placed:
    """The cache's moves moved in time (``schedule`` names a GPU): a second placement follows the
    first one's evictions, each eviction's copy started right after the tensor's last use before it
    (write-behind) and each fetch as early as its block fits but no earlier than it must land
    (read-ahead); kept only if it moves no more bytes, its peak is no higher and its estimated step
    no longer (a walk that found less room for the conv workspace could trade the copies it hides
    for slower convolutions: 3.5 times the step, for VGG-16 under offline fit). Nothing to do
    without the cache, under the paper's schedule, or where the cache moved nothing."""
    config = job.config
    if not (config.cache and config.schedule != "paper" and (first.evictions or first.fetches)):
        return first
    start = timing.op_starts(first.program, job.graph, config.schedule, len(job.plan.ops))
    nbytes = {n: t.nbytes for n, t in job.specs.items()}
    old = trace_program(first.program, "all")
    moved = old.d2h_bytes + old.h2d_bytes
    step_ms = None  # the first placement's estimated step, estimated where a candidate needs it
    for hints in overlap.cache_hints(first.evictions, first.fetches, start, nbytes,
                                     timing.profile(config.schedule)):
        try:
            candidate = _walk(job, job.plan, hints)
        except (BudgetError, PlanError, IllegalTransition):  # it strayed from the first pass: keep that one
            continue
        new = trace_program(candidate.program, "all")
        if new.peak_bytes <= old.peak_bytes and new.d2h_bytes + new.h2d_bytes <= moved:
            if step_ms is None:
                step_ms = timing.estimate(first.program, job.graph, config.schedule).step_ms
            # no longer, but for rounding: the same work replayed in another order sums its times otherwise
            if timing.estimate(candidate.program, job.graph, config.schedule).step_ms <= step_ms * (1 + 1e-9):
                return candidate
    return first
