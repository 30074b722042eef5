"""The placement pass: the scheduler's plan in, a :class:`~snlite.program.Program` out. Pure: no
device, no data, only the graph's shapes and the plan.

It is the one place where memory decisions are made. Walking the plan op by op, it

1. releases offloaded tensors (compute waits for their copy, then frees the block) and starts
   prefetches into freshly allocated blocks on the ``copy_in`` stream;
2. makes every tensor the op reads resident: waits for a prefetch, or (with the LRU cache) fetches
   a tensor the cache evicted, counting hits and misses; locks them;
3. allocates what the op writes (first or best fit over 1 KiB blocks, :mod:`snlite.pool`); an
   in-place write takes over the buffer it overwrites; with the cache on, an allocation that does not
   fit evicts unlocked tensors from the least recently used end until it does;
4. picks each conv step's algorithm and places its workspace (:mod:`snlite.workspace`);
5. launches the op, then starts offloads and frees what the plan frees.

Every copy gets its events: a copy into or out of a block waits for an event recorded on the compute
stream (the producing kernels, or the block's previous users, have finished); compute waits for a
copy's event only where it must (before it frees a block a copy still reads, or before it reads a
tensor a copy is writing). The batch arrives through a pinned slot on ``copy_in``; the loss and the
logits leave through pinned slots on ``copy_out``; the iteration ends with one host wait.

Because the meta, host and CUDA devices all replay this one program, the planned peak is the
executed peak by construction, and the high-water marks size the arena and the pinned slab.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter

from snlite import workspace as ws
from snlite.cache import LRUCache
from snlite.config import MemoryConfig
from snlite.graph import TensorSpec
from snlite.pool import HostPool, PoolFullError, RawAllocator, TensorPool
from snlite.program import (COMPUTE, COPY_IN, COPY_OUT, HOST, MODES, Alloc, Copy, Free, HandOver, HostRead,
                            HostWait, HostWrite, Launch, Program, Record, Wait, without_cycle_collection)
from snlite.recompute import base_name
from snlite.scheduler import PERSISTENT_KINDS, PlannedOp, Scheduler, update_op
from snlite.tensor import IllegalTransition, State, Tensor

EVICTABLE_KINDS = ("activation", "gradient", "input")  # what may wait on the host


class BudgetError(MemoryError):
    """The plan does not fit the memory budget; says where, what was live, and what would fit."""


class PlanError(RuntimeError):
    """A plan asked an op to read a tensor that is not resident (a scheduler bug)."""


def optimizer_specs(graph) -> dict[str, TensorSpec]:
    """SGD's momentum buffers, one per weight: the optimizer state :class:`~snlite.train.Model` keeps."""
    return {f"{n}.momentum": TensorSpec(f"{n}.momentum", t.shape, "float32", "optimizer")
            for n, t in graph.tensors().items() if t.kind == "weight"}


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
    Raises :class:`BudgetError` if ``config.budget_bytes`` (or ``host_budget_bytes``) is too small."""
    config = config or MemoryConfig()
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    if mode in ("train", "update") and not optimizer:
        raise ValueError("mode 'train' updates the weights, which needs the optimizer state; use mode 'grads'")
    if config.update_in_backward and (mode != "train" or not optimizer):
        # gradients read back whole, an update alone, inference: nothing to update inside backward
        if plan is not None and any(p.op.phase == "update" for p in plan.ops):
            raise ValueError(f"this plan updates the weights inside backward, which only a 'train' program does; "
                             f"for mode {mode!r} plan under config.replace(update_in_backward=False)")
        config = config.replace(update_in_backward=False)
    if config.optimizer_state == "auto":
        return _auto_state(graph, config, mode, plan, costs, optimizer, refine)
    with without_cycle_collection():
        plan = plan or Scheduler(graph, config).plan()
        if config.schedule != "paper" and mode != "infer":
            from snlite import overlap

            plan = overlap.retime(graph, config, plan, costs)  # copies moved in time to hide behind compute
        specs = dict(graph.tensors())
        if optimizer:
            specs.update(optimizer_specs(graph))
        placer = _Placer(graph, config, plan, specs, costs or ws.CostModel(), mode)
        program = placer.run()
        if refine and config.cache and config.schedule != "paper" and (placer.evicted or placer.fetched):
            program = _overlapped(graph, config, plan, specs, costs or ws.CostModel(), mode, placer, program)
    return program.without_updates() if mode == "grads" else program


def _auto_state(graph, config, mode, plan, costs, optimizer, refine) -> Program:
    """``optimizer_state="auto"``: the momentum on the device if the iteration fits that way, else
    in the pinned slab (a device too small even for the weights and their momentum is not tried)."""
    device = config.replace(optimizer_state="device")
    persistent = sum(TensorPool(1024).reserved_bytes(max(t.nbytes, 1)) for t in _specs(graph, optimizer).values()
                     if t.kind in ("weight", "buffer", "optimizer"))
    if mode == "infer" or not optimizer or config.budget_bytes is None or persistent <= config.budget_bytes:
        try:
            return place(graph, device, mode, plan=plan, costs=costs, optimizer=optimizer, refine=refine)
        except BudgetError:
            if mode == "infer" or not optimizer:
                raise
    return place(graph, config.replace(optimizer_state="host"), mode, plan=plan, costs=costs, optimizer=optimizer,
                 refine=refine)


def _overlapped(graph, config, plan, specs, costs, mode, first, program) -> Program:
    """The cache's moves, moved in time (``schedule`` names a GPU): each eviction's copy starts right
    after the tensor's last use before it (write-behind), so the copy runs while compute goes on and
    the block is freed only at the eviction, after the copy's event; each fetch starts as early as the
    block fits without evicting anything, but no earlier than its copy needs to land in time on that
    GPU (read-ahead). A second placement follows the first one's evictions; it is kept only if it moves
    no more bytes and its peak is no higher, so the planned memory never rises."""
    from snlite import overlap
    from snlite.trace import trace_program

    evictions: dict[int, list[str]] = {}
    behind: dict[int, list[str]] = {}
    for name, at, last in first.evicted:
        evictions.setdefault(at, []).append(name)
        if last < at:
            behind.setdefault(last, []).append(name)
    start = overlap._op_starts(program, graph, config.schedule, len(plan.ops))
    prof = timing_profile(config.schedule)
    ahead = []  # (earliest op, tensor, the op that needs it)
    for name, at in first.fetched:
        land = start[at] - overlap._copy_ms(first.nbytes[base_name(name)], prof.h2d_gbs, prof)
        ahead.append((max(0, bisect_right(start, land, hi=at) - 1), name, at))
    old = trace_program(program, "all")
    for early in (sorted(ahead), []):  # with read-ahead; if that costs memory or bytes, write-behind alone
        try:
            candidate = _Placer(graph, config, plan, specs, costs, mode, behind=behind,
                                evictions={k: list(v) for k, v in evictions.items()}, ahead=early).run()
        except (BudgetError, PlanError, IllegalTransition):  # it strayed from the first pass: keep that one
            continue
        new = trace_program(candidate, "all")
        if new.peak_bytes <= old.peak_bytes and new.d2h_bytes + new.h2d_bytes <= old.d2h_bytes + old.h2d_bytes:
            return candidate
    return program


def timing_profile(name):
    from snlite import timing

    return timing.profile(name)




def simulate(graph, config: MemoryConfig | None = None, optimizer: bool = True, costs=None, plan=None):
    """The trace of one training iteration of ``graph`` under ``config``, read off its program: what
    a :class:`~snlite.train.Model` (SGD with momentum, unless ``optimizer`` is False) then holds on
    the host or CUDA device, byte for byte. ``costs``: the conv timings a GPU measured."""
    from snlite.trace import trace_program

    config = config or MemoryConfig()
    program = place(graph, config, "train" if optimizer else "grads", plan=plan, costs=costs, optimizer=optimizer)
    return trace_program(program, config.count)


def fits(graph, config: MemoryConfig, plan=None, costs=None, optimizer: bool = True) -> bool:
    """Whether one training iteration places within ``config``'s budgets."""
    try:
        place(graph, config, "train" if optimizer else "grads", plan=plan, costs=costs, optimizer=optimizer,
              refine=False)
        return True
    except BudgetError:
        return False


def smallest_budget(graph, config: MemoryConfig, lo: int = 0, hi: int | None = None, block: int | None = None,
                    costs=None, optimizer: bool = True, host: bool = False) -> int:
    """The smallest ``budget_bytes`` (``host``: ``host_budget_bytes``), a multiple of ``block``
    (default: the pool's block, 1024 or 256), under which ``config`` places one training iteration,
    by a binary search over placements between ``lo`` and ``hi``. The answer always fits (it was
    placed). Fitting is not quite monotone in the budget, though (the dynamic workspace and the
    cache decide by what is free, and a larger arena can fragment where a smaller one did not), so
    a smaller budget the bisection skipped over can fit too: :func:`snlite.search.min_budget`
    searches up from the lower bound instead, for the paper's "peak / l_peak" figure."""
    field = "host_budget_bytes" if host else "budget_bytes"
    block = block or (256 if host else 1024)
    if hi is None:
        unlimited = _Placer(graph, config.replace(**{field: None}), Scheduler(graph, config).plan(),
                            _specs(graph, optimizer), costs or ws.CostModel(), "train")
        hi = unlimited.host.capacity_bytes if host else unlimited.capacity
    if not fits(graph, config.replace(**{field: hi}), costs=costs, optimizer=optimizer):
        raise BudgetError(f"{graph.name} does not fit even {hi:,d} bytes under {config.describe()}")
    lo, hi = max(lo // block, 0), math.ceil(hi / block)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if fits(graph, config.replace(**{field: mid * block}), costs=costs, optimizer=optimizer):
            hi = mid
        else:
            lo = mid
    return hi * block


def _specs(graph, optimizer: bool) -> dict:
    specs = dict(graph.tensors())
    if optimizer:
        specs.update(optimizer_specs(graph))
    return specs


class _Placer:
    """One placement: the pool simulation, the LRU cache, the events; appends instructions to ``out``."""

    def __init__(self, graph, config: MemoryConfig, plan, specs, costs, mode: str, behind=None, evictions=None,
                 ahead=None):
        self.graph, self.config, self.plan, self.specs, self.costs, self.mode = graph, config, plan, specs, costs, mode
        # the time-aware second pass (see _overlapped): copies to start after an op, evictions to repeat
        self.behind, self.planned_evictions, self.ahead = behind or {}, evictions or {}, sorted(ahead or ())
        self._ahead_next, self._ready = 0, []  # ahead[:_ahead_next] have come due; _ready: due, not started
        self.behind_in_flight: dict[str, None] = {}  # write-behind copies whose block is not released yet
        self.evicted: list[tuple[str, int, int]] = []  # (tensor, op it was evicted at, its last use before)
        self.fetched: list[tuple[str, int]] = []  # (tensor, op that fetched it back)
        self.last_use: dict[str, int] = {}
        self.op_index = -1
        self.train = mode != "infer"
        # SGD inside backward (the plan has update ops): each weight gradient lives only until its update
        self.in_backward = any(p.op.phase == "update" for p in plan.ops)
        self.optimizer = any(t.kind == "optimizer" for t in specs.values())
        # the optimizer state waiting in the pinned slab between its updates (optimizer_state "host")
        self.host_state = {n for n, t in specs.items() if t.kind == "optimizer"} \
            if config.optimizer_state == "host" else set()
        self.state_out: list[Tensor] = []  # momentum copied back to the host, its device block freed next op
        order = ("weight", "buffer", "optimizer", "weight_grad")  # grads last: a grads program extends a train one
        kinds = [k for k in order if not (k == "weight_grad" and (self.in_backward or mode == "infer"))]
        self.persistent = [n for k in kinds for n, t in specs.items() if t.kind == k and n not in self.host_state]
        self.persistent_set = set(self.persistent) | self.host_state
        self.dropped = set(plan.recompute.dropped)
        self.evictable = {n for n, t in specs.items() if t.kind in EVICTABLE_KINDS}
        self.moving = config.offload or config.cache
        self.nbytes = {n: t.nbytes for n, t in specs.items()}
        self.kinds = {n: t.kind for n, t in specs.items()}
        self._bases = None
        self._reserved: dict[int, int] = {}
        self.ranked: dict[tuple, list] = {}  # (conv shape, conv op) -> its algorithms, fastest first
        self.raw = config.allocator == "raw"
        self.space = "raw" if self.raw else "arena"
        self.capacity = config.budget_bytes or self.upper_bound_bytes()
        self.pool = RawAllocator(self.capacity) if self.raw else TensorPool(self.capacity, fit=config.fit)
        # the slab: the optimizer state waiting there (optimizer_state "host"), the staging area, then
        # the host pool (tensors waiting on the host); the first two at the same offsets in every mode
        slot = HostPool(256).reserved_bytes
        self.state_slots, self.state_bytes = {}, 0
        for name in (n for n in specs if n in self.host_state):
            self.state_slots[name] = self.state_bytes
            self.state_bytes += slot(max(self.nbytes[name], 1))
        self.staging = self._staging_area()  # pinned slot -> offset: the batch in, the results out
        self.staging_bytes = self.state_bytes + sum(slot(self.nbytes[base_name(n.rsplit(":", 1)[0])])
                                                    for n in self.staging)
        if config.host_budget_bytes is not None and config.host_budget_bytes < self.staging_bytes:
            state = f"with the optimizer state waiting there ({self.state_bytes:,d} bytes), " if self.state_bytes else ""
            raise BudgetError(f"{graph.name} does not fit a host budget of {config.host_budget_bytes:,d} bytes of "
                              f"pinned memory under {config.describe()}: {state}while staging the batch, the input, its "
                              f"labels and the results need {self.staging_bytes:,d} bytes")
        host_room = (config.host_budget_bytes - self.staging_bytes) if config.host_budget_bytes else \
            self.host_upper_bound_bytes()
        self.host = HostPool(host_room)  # tensors waiting on the host, after the staging area
        self.tensors: dict[str, Tensor] = {}
        conv_outputs = {graph.output_tensor(n) for n, l in graph.layers.items() if l.kind == "conv2d"}
        self.lru = LRUCache(conv_outputs if config.offload else ())
        self.pending: dict[str, str] = {}  # tensor -> event of a copy still using its device block
        self.n_events = 0
        self.stats = {"cache_hits": 0, "cache_misses": 0, "recompute_count": 0, "extra_flops": 0}
        self.table = {n: (t.shape, t.dtype, t.kind) for n, t in specs.items()}
        self.setup = self._place_persistent()
        self.out: list = []

    # ------------------------------------------------------------ sizes
    def upper_bound_bytes(self) -> int:
        """Enough for every tensor and incarnation at once plus the largest workspace: what an
        unlimited budget means (the baseline needs at most this). Only the placement uses it; the
        arena is then the high-water mark the placement reached."""
        block = TensorPool(1024).reserved_bytes
        wmax = max((c.workspace_bytes for layer in self.graph.layers.values() if layer.kind == "conv2d"
                    for op in ("forward", "backward_data", "backward_filter")
                    for c in self._candidates(layer, op)), default=0)
        sizes = Counter(map(self.nbytes.__getitem__, self._all_bases()))  # deep nets repeat a few sizes
        return sum(block(n) * k for n, k in sizes.items()) + block(wmax)

    def host_upper_bound_bytes(self) -> int:
        """Room in the pinned slab for every tensor (and incarnation) that may go to the host, all
        at once: the unlimited host budget (the slab is then what the placement reached)."""
        if not self.moving:
            return 0
        slot = HostPool(256).reserved_bytes
        sizes = Counter(self.nbytes[b] for b in self._all_bases() if b in self.evictable)
        return sum(slot(n) * k for n, k in sizes.items())

    def _all_bases(self) -> list:
        """The original tensor of every tensor and incarnation of the iteration (the graph's, the
        optimizer's, every recomputed one), once per incarnation."""
        if self._bases is None:
            self._bases = list(self.specs) + [base_name(t) for p in self.plan.ops if p.op.phase == "recompute"
                                              for t in p.op.writes]
        return self._bases

    def _staging_area(self) -> dict:
        """Fixed pinned slots at the start of the slab: the batch (and labels) the host writes before
        uploading them, the loss and the logits it reads back."""
        g = self.graph
        logits = g.output_tensor(g.inputs[g.loss_layer][0])
        names = ["data:in", "labels:in", f"{g.loss_layer}.loss:out", f"{logits}:out"] if self.train else \
            ["data:in", f"{logits}:out"]
        slots, offset = {}, self.state_bytes
        for name in names:
            slots[name] = offset
            offset += HostPool(256).reserved_bytes(self.nbytes[base_name(name.rsplit(":", 1)[0])])
        return slots

    def _all_names(self) -> set:
        """Every tensor of the iteration: the graph's, the optimizer's, and every recomputed incarnation."""
        return set(self.specs) | {t for p in self.plan.ops if p.op.phase == "recompute" for t in p.op.writes}

    def _candidates(self, layer, op: str) -> list:
        """``workspace.candidates``, once per conv shape (deep nets repeat a few shapes thousands of times)."""
        key = (ws.conv_key(layer), op)
        if key not in self.ranked:
            self.ranked[key] = ws.candidates(layer, op, self.costs)
        return self.ranked[key]

    def reserved(self, nbytes: int) -> int:
        """The bytes the pool reserves for ``nbytes`` (memoised: the pass asks about a million times)."""
        r = self._reserved.get(nbytes)
        if r is None:
            r = self._reserved[nbytes] = self.pool.reserved_bytes(max(nbytes, 1))
        return r

    def _place_persistent(self) -> tuple:
        """The weights, their gradients, buffers and momentum: placed once, before the iteration,
        end to end from the arena's start (``TensorPool.alloc_all``)."""
        try:
            offsets = self.pool.alloc_all(((n, max(self.nbytes[n], 1)) for n in self.persistent), "setup")
        except PoolFullError as e:
            for offset, (name, _) in self.pool.allocations().items():  # what was placed before it: live there
                self.tensors[name] = Tensor(name=name, nbytes=self.nbytes[name], kind=self.specs[name].kind,
                                            state=State.ON_DEVICE, offset=offset)
            raise BudgetError(self._budget_message(self._tensor(e.name), "setup", e)) from None
        setup = []
        for name, offset in zip(self.persistent, offsets):
            t = self.tensors[name] = Tensor(name=name, nbytes=self.nbytes[name], kind=self.specs[name].kind,
                                            state=State.ON_DEVICE, offset=offset)
            setup.append(Alloc(name, self.space, offset, self.reserved(t.nbytes), COMPUTE if self.raw else None))
        for name, offset in self.state_slots.items():  # momentum waiting in the slab, before the staging area
            t = self.tensors[name] = Tensor(name=name, nbytes=self.nbytes[name], kind="optimizer",
                                            state=State.ON_HOST, host_offset=offset, host_valid=True)
            setup.append(Alloc(name, "slab", offset, HostPool(256).reserved_bytes(max(t.nbytes, 1))))
        return tuple(setup)

    # ------------------------------------------------------------ instructions
    def _record(self, stream: str) -> str:
        self.n_events += 1
        event = f"e{self.n_events}"
        self.out.append(Record(event, stream))
        return event

    def _tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            base = base_name(name) if "#" in name else name
            t = self.tensors[name] = Tensor(name=name, nbytes=self.nbytes[base], kind=self.kinds[base])
        return t

    def _take_block(self, t: Tensor, step):
        """A block for ``t``; with the cache on, a full pool evicts least recently used tensors
        until it fits. Raises BudgetError when nothing more can leave."""
        nbytes = max(t.nbytes, 1)
        while True:
            try:
                offset = self.pool.alloc(nbytes, t.name, step)
                break
            except PoolFullError as e:
                if not (self.config.cache and self._evict_one()):
                    raise BudgetError(self._budget_message(t, step, e)) from None
        self.out.append(Alloc(t.name, self.space, offset, self.reserved(nbytes), COMPUTE if self.raw else None))
        return offset

    def _alloc(self, t: Tensor, step) -> None:
        t.allocate(self._take_block(t, step))
        if base_name(t.name) in self.evictable:
            self.lru.add(t.name, base_name(t.name))

    def _release_block(self, t: Tensor, offset) -> None:
        event = self.pending.pop(t.name, None)
        if event is not None:
            self.out.append(Wait(event, COMPUTE, "release"))  # a copy still reads this block: reuse only after it
        self.pool.free(offset)
        self.out.append(Free(t.name, self.space, offset, self.reserved(t.nbytes)))
        self.lru.remove(t.name)

    def _host_slot(self, name: str, nbytes: int, step) -> int:
        """A pinned slot for a tensor going to the host, from the host pool (after the staging area)."""
        try:
            offset = self.staging_bytes + self.host.alloc(nbytes, name, step)
        except PoolFullError as e:
            raise BudgetError(self._host_message(name, nbytes, step, e)) from None
        self.out.append(Alloc(name, "slab", offset, self.host.reserved_bytes(nbytes)))
        return offset

    def _free_host_slot(self, name: str, offset: int, nbytes: int, stream: str = COMPUTE) -> None:
        if name in self.staging:
            self.out.append(Free(name, "slab", offset, self.host.reserved_bytes(nbytes), stream))
            return
        self.host.free(offset - self.staging_bytes)
        self.out.append(Free(name, "slab", offset, self.host.reserved_bytes(nbytes), stream))

    def _hand_over(self, new: Tensor, old: Tensor) -> None:
        """An in-place write: ``new`` takes over ``old``'s block (and its place in the cache);
        ``old`` is dead, and so is any host copy it had."""
        new.take_buffer(old)
        self.out.append(HandOver(new.name, old.name))
        if old.name in self.pending:
            self.pending[new.name] = self.pending.pop(old.name)
        host = old.release_host()
        if host is not None:
            self._free_host_slot(old.name, host, old.nbytes)
        if self.lru.remove(old.name):
            self.lru.add(new.name, base_name(new.name))

    def _free(self, name: str) -> None:
        t = self.tensors.get(name)
        if t is None or t.state in (State.FREED, State.UNALLOCATED):
            return
        if t.state is State.OFFLOADING:
            self._finish_offload(t)
        was_resident = t.resident
        drop = t.state is State.ON_DEVICE and "#" not in name and name in self.dropped
        offset = t.drop() if drop else t.free()
        if was_resident:
            self._release_block(t, offset)
        if t.host_offset is not None:
            self._free_host_slot(t.name, t.release_host(), t.nbytes)

    # ------------------------------------------------------------ moving data
    def _start_offload(self, t: Tensor, step, why: str) -> None:
        if t.host_offset is None:
            t.host_offset = self._host_slot(t.name, t.nbytes, step)
        if t.start_offload(t.host_offset):  # False: a clean eviction, the host copy is still valid
            self.out.append(Wait(self._record(COMPUTE), COPY_OUT, "ready"))  # the producing kernels have finished
            self.out.append(Copy(t.name, why, self.space, t.offset, "slab", t.host_offset, t.nbytes, COPY_OUT))
            self.pending[t.name] = self._record(COPY_OUT)
        self.lru.remove(t.name)

    def _finish_offload(self, t: Tensor) -> None:
        self.behind_in_flight.pop(t.name, None)
        self._release_block(t, t.finish_offload())

    def _start_prefetch(self, t: Tensor, step, why: str) -> None:
        t.start_prefetch(self._take_block(t, step))
        self.out.append(Wait(self._record(COMPUTE), COPY_IN, "reuse"))  # the block's previous users have finished
        self.out.append(Copy(t.name, why, "slab", t.host_offset, self.space, t.offset, t.nbytes, COPY_IN))
        self.pending[t.name] = self._record(COPY_IN)

    def _make_readable(self, t: Tensor, step) -> None:
        cache = self.config.cache
        if t.state is State.ON_HOST and t.name in self.host_state:  # momentum not fetched ahead: now
            self._start_prefetch(t, step, "state")
        elif t.state is State.ON_HOST:
            if not cache:
                raise PlanError(f"op {step} reads {t.name}, which is on the host and nothing prefetched it")
            self.stats["cache_misses"] += 1
            self.fetched.append((t.name, self.op_index))
            self._start_prefetch(t, step, "fetch")
        elif cache and t.name in self.lru:
            self.stats["cache_hits"] += 1
        if t.state is State.PREFETCHING:
            self.out.append(Wait(self.pending.pop(t.name), COMPUTE, "landed"))  # read only once the copy has landed
            t.finish_prefetch()
            if base_name(t.name) in self.evictable:
                self.lru.add(t.name, base_name(t.name))
        if not t.readable:
            raise PlanError(f"op {step} reads {t.name}, which is {t.state.name}: the plan is wrong")
        self.lru.touch(t.name)

    def _evict_one(self) -> bool:
        """Move the least recently used unlocked tensor to the host (CONV outputs first when
        ``offload`` is on, see :class:`~snlite.cache.LRUCache`); False if none is left. In the
        time-aware second pass, the first pass's evictions at this op come first (their copies may be
        running already: write-behind), then the LRU, then any copy still running."""
        planned = self.planned_evictions.get(self.op_index)
        while planned:
            t = self.tensors.get(planned.pop(0))
            if t is not None and not t.locked and t.state in (State.ON_DEVICE, State.OFFLOADING):
                return self._evict(t)
        for name in self.lru.eviction_order():
            t = self.tensors[name]
            if not t.locked and t.state is State.ON_DEVICE:
                return self._evict(t)
        for name in self.behind_in_flight:
            return self._evict(self.tensors[name])
        return False

    def _evict(self, t: Tensor) -> bool:
        self.evicted.append((t.name, self.op_index, self.last_use.get(t.name, -1)))
        if t.state is State.ON_DEVICE:
            self._start_offload(t, "evict", "evict")
        self._finish_offload(t)
        return True

    def _read_ahead(self, op) -> None:
        """Start the fetches planned to begin by this op, where their block fits without evicting.
        ``ahead`` is sorted by earliest op: the ones whose time has come join ``ready`` (in that order)
        and wait there until they fit or their op has passed, so each op looks only at those."""
        ahead, i = self.ahead, self._ahead_next
        while i < len(ahead) and ahead[i][0] <= op.index:
            self._ready.append(ahead[i])
            i += 1
        self._ahead_next = i
        waiting = []
        for entry in self._ready:
            earliest, name, need = entry
            t = self.tensors.get(name)
            if need <= op.index or t is None:
                continue
            if t.state is State.ON_HOST and self.pool.can_fit(max(t.nbytes, 1)):
                self.stats["cache_misses"] += 1
                self.fetched.append((name, op.index))
                self._start_prefetch(t, op.step, "fetch")
            elif t.state is State.ON_HOST:
                waiting.append(entry)
        self._ready = waiting

    def _copy_out(self, tensor: str, step) -> tuple[str, int]:
        """Start copying a result (the loss, the logits) to a pinned slot on ``copy_out``."""
        t = self.tensors[tensor]
        if not t.readable:
            raise PlanError(f"the result {tensor} is {t.state.name} when it is read back: the plan is wrong")
        slot = self.staging[f"{tensor}:out"]
        self.out.append(Alloc(f"{tensor}:out", "slab", slot, self.host.reserved_bytes(t.nbytes)))
        self.out.append(Wait(self._record(COMPUTE), COPY_OUT, "ready"))
        self.out.append(Copy(tensor, "result", self.space, t.offset, "slab", slot, t.nbytes, COPY_OUT))
        self.pending[tensor] = self._record(COPY_OUT)
        return tensor, slot

    # ------------------------------------------------------------ the iteration
    def run(self) -> Program:
        if self.mode == "update":
            return self._update_program()
        g, train = self.graph, self.train
        loss_layer = g.loss_layer
        self.logits = g.output_tensor(g.inputs[loss_layer][0])
        self.staged = {name: self.staging[f"{name}:in"] for name in (("data", "labels") if train else ("data",))}
        for name, slot in self.staged.items():
            self.out.append(Alloc(f"{name}:in", "slab", slot, self.host.reserved_bytes(self.nbytes[name])))
        self.results = []
        ops = self.plan.ops
        for k, planned in enumerate(ops):
            op = planned.op
            if not train and (op.phase != "forward" or op.layer == loss_layer):
                continue
            if self.host_state and k + 1 < len(ops) and ops[k + 1].op.phase == "update":
                self._fetch_state(ops[k + 1].op)  # momentum on its way while this backward step runs
            self._place_op(planned)
        if not train:
            self.results.append(self._copy_out(self.logits, "end"))
        self._release_state()
        for name in [n for n in self.tensors if n not in self.persistent_set]:
            self._free(name)  # the end of the iteration: nothing but the persistent tensors survives
        if self.mode == "train" and not self.in_backward and self.optimizer:
            self._updates()
            self._release_state()
        for stream in (COPY_OUT, COPY_IN):  # everything of this iteration is ordered before its end
            self.out.append(Wait(self._record(stream), COMPUTE, "end"))
        self.out.append(HostWait(self._record(COMPUTE)))
        for tensor, slot in self.results:
            self.out.append(HostRead(tensor, slot, self.specs[base_name(tensor)].nbytes))
        for name, slot in self.staged.items():
            self._free_host_slot(f"{name}:in", slot, self.specs[name].nbytes, HOST)
        for tensor, slot in self.results:
            self._free_host_slot(f"{tensor}:out", slot, self.specs[base_name(tensor)].nbytes, HOST)
        for name in [*(f"{n}:in" for n in self.staged), *(f"{t}:out" for t, _ in self.results)]:
            self.table[name] = self.table[base_name(name.rsplit(":", 1)[0])]
        stats = dict(self.stats) if self.train else {"cache_hits": self.stats["cache_hits"],
                                                     "cache_misses": self.stats["cache_misses"]}
        stats["optimizer_state"] = "host" if self.host_state else "device"
        return self._program(stats)

    def _program(self, stats: dict) -> Program:
        return Program(self.graph.name, self.config.describe(), self.mode, self.config.allocator, self.table,
                       self.setup, tuple(self.out), self.pool.high_water_bytes if not self.raw else 0,
                       self.state_bytes if self.mode == "update" else self.staging_bytes + self.host.high_water_bytes,
                       stats)

    def _place_op(self, planned) -> None:
        """One op: releases and prefetches before it, what it reads made resident, what it writes
        allocated, its workspace, its launch, then hand-overs, offloads and frees after it."""
        g, op, train, cache = self.graph, planned.op, self.train, self.config.cache
        tensors, ON_DEVICE, persistent = self.tensors, State.ON_DEVICE, self.persistent_set
        loss_layer = g.loss_layer
        self.op_index = op.index
        self._release_state()
        if self._ready or self._ahead_next < len(self.ahead):
            self._read_ahead(op)
        for name in planned.release if train else ():
            self._finish_offload(tensors[name])
        for name in planned.prefetch if train else ():
            self._start_prefetch(tensors[name], op.step, "prefetch")
        touched = []
        for name in dict.fromkeys((*op.reads, *op.writes)):  # in order: the program must not depend on hashing
            if name not in persistent or name in self.host_state:  # weights never move: nothing to lock
                t = tensors.get(name) or self._tensor(name)
                t.locked = True
                touched.append(t)
        for name in op.reads:
            t = tensors[name]
            if t.state is ON_DEVICE and not cache:  # the common case, without a call
                continue
            self._make_readable(t, op.step)
        handed = {new for new, _ in op.inplace}  # written into another tensor's buffer
        for name in op.writes:
            t = tensors[name]
            if name not in handed:
                if t.state is not ON_DEVICE:
                    self._alloc(t, op.step)
                t.mark_written()
        if op.layer == "data" and op.phase == "forward":
            self._upload(self.staged)
        convs, workspace = self._workspace(op)
        writes = op.writes + ((g.output_grads(op.layer)[0],) if op.accumulate else ())  # summed into in place
        self.out.append(Launch(op.index, op.step, op.layer, op.phase, COMPUTE, op.reads, writes, op.inplace,
                               op.names, op.accumulate, convs, workspace.name if workspace else None))
        if op.phase == "recompute":
            self.stats["recompute_count"] += 1
            self.stats["extra_flops"] += g.layers[op.layer].flops()
        for new, old in op.inplace:
            self._hand_over(tensors[new], tensors[old])
        if workspace is not None:
            self._release_block(workspace, workspace.free())
            del tensors[workspace.name]
        if train and op.layer == loss_layer and op.phase == "forward":
            self.results += [self._copy_out(f"{loss_layer}.loss", op.step), self._copy_out(self.logits, op.step)]
        for t in touched:
            t.locked = False
        if op.phase == "update":
            for name in op.writes:
                if name in self.host_state:  # the new momentum back to its pinned slot; its block freed next op
                    self._start_offload(tensors[name], op.step, "state")
                    self.state_out.append(tensors[name])
        for name in planned.offload if train else ():
            self._start_offload(tensors[name], op.step, "offload")
        for name in planned.frees:
            if train or name != self.logits:
                self._free(name)
        if cache:
            for t in touched:
                self.last_use[t.name] = op.index
            for name in self.behind.get(op.index, ()):  # write-behind: the copy starts now, the block stays
                t = tensors.get(name)
                if t is not None and t.state is ON_DEVICE and not t.host_valid:
                    self._start_offload(t, op.step, "evict")
                    self.behind_in_flight[name] = None

    def _fetch_state(self, op) -> None:
        """Start copying an update's momentum buffers from the host into fresh device blocks."""
        for name in op.reads:
            t = self.tensors.get(name)
            if name in self.host_state and t.state is State.ON_HOST:
                self._start_prefetch(t, op.step, "state")

    def _release_state(self) -> None:
        """Free the device blocks of momentum copied back to the host (after their copies' events)."""
        while self.state_out:
            self._finish_offload(self.state_out.pop(0))

    def _update_program(self) -> Program:
        """SGD alone: every layer's update on compute, then the host waits for it."""
        self._updates()
        self._release_state()
        self.out.append(HostWait(self._record(COMPUTE)))
        return self._program({"optimizer_state": "host" if self.host_state else "device"})

    def _updates(self) -> None:
        """SGD with momentum, one op per layer with weights, after the iteration's backward (each
        layer's momentum fetched while the previous layer's update runs, where it waits on the host)."""
        ops = [PlannedOp(update_op(self.graph, name, -1, -1)) for name, layer in self.graph.layers.items()
               if layer.params()]
        for k, planned in enumerate(ops):
            if self.host_state and k == 0:
                self._fetch_state(planned.op)
            if self.host_state and k + 1 < len(ops):
                self._fetch_state(ops[k + 1].op)
            self._place_op(planned)

    def _upload(self, staged: dict) -> None:
        """The batch (and labels) go from their pinned slots to the device on ``copy_in``."""
        for name, slot in staged.items():
            self.out.append(HostWrite(name, slot, self.specs[name].nbytes))
        self.out.append(Wait(self._record(COMPUTE), COPY_IN, "reuse"))
        for name, slot in staged.items():
            t = self.tensors[name]
            self.out.append(Copy(name, "input", "slab", slot, self.space, t.offset, t.nbytes, COPY_IN))
        self.out.append(Wait(self._record(COPY_IN), COMPUTE, "landed"))

    def _workspace(self, op):
        layer = self.graph.layers[op.layer]
        if layer.kind != "conv2d" or op.phase == "update":
            return (), None
        phase = "forward" if op.phase == "recompute" else op.phase
        kinds = ("forward",) if phase == "forward" else ("backward_filter", "backward_data")
        largest = self.pool.largest_free_block()
        choices = {k: ws.choose(layer, k, self.config.workspace, largest, self.costs, self._candidates(layer, k))
                   for k in kinds}
        convs = tuple((k, c.algo, c.chunk, c.workspace_bytes) for k, c in choices.items())
        nbytes = max(c.workspace_bytes for c in choices.values())
        if nbytes == 0:
            return convs, None
        t = Tensor(name=f"{op.layer}.workspace", nbytes=nbytes, kind="workspace")
        self.tensors[t.name] = t
        self.table[t.name] = (None, "float32", "workspace")  # a flat view of the whole block
        t.allocate(self._take_block(t, op.step))
        return convs, t

    # ------------------------------------------------------------ explaining failures
    def _budget_message(self, t: Tensor, step, err: PoolFullError) -> str:
        live = sorted(((x.name, x.nbytes) for x in self.tensors.values() if x.resident), key=lambda p: -p[1])
        shown = ", ".join(f"{n} ({b:,d} B)" for n, b in live[:8]) + (f" and {len(live) - 8} more" if len(live) > 8 else "")
        if step == "setup":
            where = "while placing the weights and optimizer state"
        else:
            s = self.graph.steps()[step] if isinstance(step, int) else None
            where = f"at step {step} ({s.layer} {s.phase})" if s is not None else f"at {step}"
        return (f"{self.graph.name} does not fit a budget of {self.capacity:,d} bytes under "
                f"{self.config.describe()}: {where}, {t.name} needs {t.nbytes:,d} bytes but the largest free "
                f"block is {err.stats.largest_free_bytes:,d} bytes. "
                + (f"Live there: {shown}." if shown else "Nothing else was live there."))

    def _staging_slots(self) -> list:
        return [(n, self.host.reserved_bytes(self.nbytes[base_name(n.rsplit(":", 1)[0])])) for n in self.staging]

    def _host_message(self, name: str, nbytes: int, step, err: PoolFullError) -> str:
        s = self.graph.steps()[step] if isinstance(step, int) else None
        where = f"at step {step} ({s.layer} {s.phase})" if s is not None else f"at {step}"
        held = sorted(self.host.allocations().values(), key=lambda p: -p[1]) + self._staging_slots()
        shown = ", ".join(f"{n} ({b:,d} B)" for n, b in held[:8]) + (f" and {len(held) - 8} more" if len(held) > 8 else "")
        return (f"{self.graph.name} does not fit a host budget of {self.config.host_budget_bytes:,d} bytes of pinned "
                f"memory under {self.config.describe()}: {where}, {name} needs {nbytes:,d} bytes but the largest free "
                f"slot is {err.stats.largest_free_bytes:,d} bytes. "
                + (f"On the host there: {shown}." if shown else "Nothing else was on the host there."))

