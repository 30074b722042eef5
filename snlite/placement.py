"""The placement pass: one walk over the scheduler's plan, a :class:`~snlite.program.Program` out.
Pure: no device, no data, only the graph's shapes and the plan. It is the one place where memory
decisions are made. For each op it

1. releases offloaded tensors (compute waits for their copy, then frees the block) and starts
   prefetches into freshly allocated blocks on the ``copy_in`` stream;
2. makes every tensor the op reads resident: waits for a prefetch, or (with the LRU cache) fetches
   a tensor the cache evicted, counting hits and misses; locks them;
3. allocates what the op writes (first or best fit over 1 KiB blocks, :mod:`snlite.pool`; under
   ``fit="offline"`` :mod:`snlite.offline` moves every block after the walk); an
   in-place write takes over the buffer it overwrites; with the cache on, an allocation that does not
   fit evicts unlocked tensors (:func:`snlite.cache.choose_victim`) until it does;
4. picks each conv step's algorithm and places its workspace (:mod:`snlite.workspace`);
5. launches the op, then starts offloads and frees what the plan frees.

How each copy gets its events is :mod:`snlite.copies`; where the pinned slab puts things,
:mod:`snlite.slab`; what a budget too small says, :mod:`snlite.errors`. The order of the passes
(schedule, retime, place, the cache's second placement) is :mod:`snlite.pipeline`'s.

Because the meta, host and CUDA devices all replay this one program, the planned peak is the
executed peak by construction, and the high-water marks size the arena and the pinned slab.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from snlite import slab
from snlite import workspace as ws
from snlite.errors import BudgetError, HostBudgetError, PlanError, staging_message
from snlite.residency import Residency
from snlite.cache import Eviction, Fetch, Hints, LRUCache, victim_rank
from snlite.copies import Emitter
from snlite.pool import HostPool, LivePool, PoolFullError, RawAllocator, TensorPool
from snlite.program import COMPUTE, HOST, Alloc, HostRead, HostWait, Launch, Program
from snlite.scheduler import PlannedOp, persistent_tensors, update_op
from snlite.tensor import State, Tensor

EVICTABLE_KINDS = ("activation", "gradient", "input")  # what may wait on the host


@dataclass
class Placed:
    """A walk's program, and the cache's moves it made (what the second placement retimes)."""

    program: Program
    evictions: list[Eviction] = field(default_factory=list)
    fetches: list[Fetch] = field(default_factory=list)


def walk(graph, config, plan, specs: dict, costs, mode: str, hints: Hints | None = None,
         spare_bytes: int = 0) -> Placed:
    """Place ``plan`` (see the module docstring); ``specs``: every tensor's spec, the optimizer's too.
    ``spare_bytes``: under ``fit="offline"``, room the dynamic workspace is not offered (LivePool)."""
    return Placer(graph, config, plan, specs, costs, mode, hints, spare_bytes).run()


class Placer(Residency):
    """One placement: the walk over the plan's ops; the moves each makes are :class:`Residency`'s."""

    def __init__(self, graph, config, plan, specs, costs, mode: str, hints: Hints | None = None,
                 spare_bytes: int = 0):
        self.spare_bytes = spare_bytes
        self.graph, self.config, self.plan, self.specs = graph, config, plan, specs
        self.costs, self.mode = costs, mode
        self.hints = hints or Hints()
        self.planned_evictions = {k: list(v) for k, v in self.hints.evictions.items()}
        self._ahead_next, self._ready = 0, []  # hints.ahead[:_ahead_next] came due; _ready: due, not started
        self.behind_in_flight: dict[str, None] = {}  # write-behind copies whose block is not released yet
        self.evictions: list[Eviction] = []
        self.fetches: list[Fetch] = []
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
        placed = persistent_tensors(specs, without_grads=self.in_backward or mode == "infer")
        self.persistent = [n for n in placed if n not in self.host_state]  # on the device all iteration
        self.fixed = frozenset(self.persistent)  # never move: no state to keep, nothing to lock
        self.persistent_set = self.fixed | self.host_state
        self.dropped = set(plan.recompute.dropped)
        self.evictable = {n for n, t in specs.items() if t.kind in EVICTABLE_KINDS}
        self.nbytes = {n: t.nbytes for n, t in specs.items()}
        self.kinds = {n: t.kind for n, t in specs.items()}
        self.ranked = ws.Ranked(costs)  # each conv shape's algorithms, fastest first
        self.raw = config.allocator == "raw"
        self.emit = Emitter("raw" if self.raw else "arena")
        self.out = self.emit.out
        self._reserved: dict[int, int] = {}
        self._bases: list[str] | None = None  # slab.incarnations, for the bounds (both ask)
        self.capacity = config.budget_bytes or self._arena_bound()
        self.pool = self._pool()
        self.layout = slab.layout(graph, self.nbytes, self.host_state, self.train)
        if config.host_budget_bytes is not None and config.host_budget_bytes < self.layout.staging_bytes:
            raise HostBudgetError(staging_message(graph, config.describe(), config.host_budget_bytes,
                                                  self.layout.state_bytes, self.layout.staging_bytes))
        self.host = HostPool((config.host_budget_bytes - self.layout.staging_bytes)
                             if config.host_budget_bytes
                             else self._host_bound())  # tensors waiting on the host, after the fixed part
        self.tensors: dict[str, Tensor] = {}
        conv_outputs = {graph.output_tensor(n) for n, layer in graph.layers.items() if layer.kind == "conv2d"}
        self.lru = LRUCache(conv_outputs if config.offload else ())
        self.rank = victim_rank(config.evict, (p.op for p in plan.ops))  # which tensor the cache evicts
        self.stats = {"cache_hits": 0, "cache_misses": 0, "recompute_count": 0, "extra_flops": 0}
        self.table = {n: (t.shape, t.dtype, t.kind) for n, t in specs.items()}
        self.setup = self._place_persistent()

    # ------------------------------------------------------------ sizes
    def _incarnations(self) -> list[str]:
        if self._bases is None:
            self._bases = slab.incarnations(self.specs, self.plan)
        return self._bases

    def _arena_bound(self) -> int:
        return slab.arena_upper_bound(self.nbytes, self._incarnations(),
                                      self.ranked.largest_workspace(self.graph))

    def _pool(self):
        """Raw, first or best fit; under ``fit="offline"`` the walk's offsets are provisional
        (:mod:`snlite.offline` moves them), so the budget limits the bytes in use, not where they are."""
        fit = self.config.fit
        if self.raw:
            return RawAllocator(self.capacity)
        if fit != "offline":
            return TensorPool(self.capacity, fit=fit)
        return LivePool(self.capacity, self._arena_bound(), self.spare_bytes)

    def _host_bound(self) -> int:
        if not (self.config.offload or self.config.cache):
            return 0
        return slab.host_upper_bound(self.nbytes, self._incarnations(), self.evictable)

    def _place_persistent(self) -> tuple:
        """The weights, their gradients, buffers and momentum: placed once, before the iteration,
        end to end from the arena's start (``TensorPool.alloc_all``)."""
        try:
            offsets = self.pool.alloc_all(((n, max(self.nbytes[n], 1)) for n in self.persistent), "setup")
        except PoolFullError as e:
            live = [(name, self.nbytes[name]) for name, _ in self.pool.allocations().values()]
            raise BudgetError(self._budget_message(e.name, "setup", e, live)) from None
        space, stream = self.emit.space, COMPUTE if self.raw else None
        setup = [Alloc(name, space, offset, self.reserved(self.nbytes[name]), stream)
                 for name, offset in zip(self.persistent, offsets)]
        # momentum waiting in the slab, before the staging area
        for name, offset in self.layout.state.items():
            self.tensors[name] = Tensor(name, self.nbytes[name], "optimizer", State.ON_HOST,
                                        host_offset=offset,
                                        host_valid=True)
            setup.append(Alloc(name, "slab", offset, slab.slot_bytes(max(self.nbytes[name], 1))))
        return tuple(setup)

    def _read_ahead(self, op) -> None:
        """Start the fetches planned to begin by this op, where their block fits without evicting.
        ``hints.ahead`` is sorted by earliest op: the ones whose time has come join ``_ready`` (in
        that order) and wait there until they fit or their op has passed."""
        ahead, i = self.hints.ahead, self._ahead_next
        while i < len(ahead) and ahead[i].earliest <= op.index:
            self._ready.append(ahead[i])
            i += 1
        self._ahead_next = i
        waiting = []
        for entry in self._ready:
            t = self.tensors.get(entry.tensor)
            if entry.need <= op.index or t is None:
                continue
            if t.state is State.ON_HOST and self.pool.can_fit(max(t.nbytes, 1)):
                self._fetch(t, op.step)
            elif t.state is State.ON_HOST:
                waiting.append(entry)
        self._ready = waiting

    def _write_behind(self, op) -> None:
        """Start the copies out planned after this op (the block stays until the eviction)."""
        for name in self.hints.behind.get(op.index, ()):
            t = self.tensors.get(name)
            if t is not None and t.state is State.ON_DEVICE and not t.host_valid:
                self._start_offload(t, op.step, "evict")
                self.behind_in_flight[name] = None

    def _copy_out(self, tensor: str) -> tuple[str, int]:
        """Start copying a result (the loss, the logits) to its pinned slot on ``copy_out``."""
        t = self.tensors[tensor]
        if not t.readable:
            raise PlanError(f"the result {tensor} is {t.state.name} when it is read back: the plan is wrong")
        slot = self.layout.staging[f"{tensor}:out"]
        self.out.append(Alloc(slot.name, "slab", slot.offset, slot.nbytes))
        self.emit.result(tensor, t.offset, slot.offset, t.nbytes)
        return tensor, slot.offset

    # ------------------------------------------------------------ the iteration
    def run(self) -> Placed:
        program = self._update_program() if self.mode == "update" else self._iteration()
        return Placed(program, self.evictions, self.fetches)

    def _iteration(self) -> Program:
        g, train = self.graph, self.train
        loss_layer = g.loss_layer
        self.logits = g.output_tensor(g.inputs[loss_layer][0])
        self.staged = [s for s in self.layout.staging.values() if s.way == "in"]
        for s in self.staged:
            self.out.append(Alloc(s.name, "slab", s.offset, s.nbytes))
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
            self.results.append(self._copy_out(self.logits))
        self._release_state()
        gone, kept = (State.FREED, State.UNALLOCATED), self.persistent_set  # gone: most tensors by now
        for name in [n for n, t in self.tensors.items() if t.state not in gone and n not in kept]:
            self._free(name)  # the end of the iteration: nothing but the persistent tensors survives
        if self.mode == "train" and not self.in_backward and self.optimizer:
            self._updates()
            self._release_state()
        self.emit.end()
        for tensor, slot in self.results:
            self.out.append(HostRead(tensor, slot, self.nbytes[tensor]))
        for s in self.staged:
            self._free_host_slot(s.name, s.offset, self.nbytes[s.tensor], HOST)
        for tensor, slot in self.results:
            self._free_host_slot(f"{tensor}:out", slot, self.nbytes[tensor], HOST)
        for s in self.layout.staging.values():
            if s.way == "in" or any(s.tensor == t for t, _ in self.results):
                self.table[s.name] = self.table[s.tensor]
        stats = dict(self.stats) if self.train else {"cache_hits": self.stats["cache_hits"],
                                                     "cache_misses": self.stats["cache_misses"]}
        stats["optimizer_state"] = "host" if self.host_state else "device"
        return self._program(stats)

    def _program(self, stats: dict) -> Program:
        slab_bytes = self.layout.state_bytes if self.mode == "update" else \
            self.layout.staging_bytes + self.host.high_water_bytes
        return Program(self.graph.name, self.config.describe(), self.mode, self.config.allocator, self.table,
                       self.setup, tuple(self.out), self.pool.high_water_bytes if not self.raw else 0,
                       slab_bytes,
                       stats)

    def _place_op(self, planned) -> None:
        """One op, in the order a GPU needs it: the moves planned before it, what it reads and
        writes made resident, its launch, then what happens after it."""
        op = planned.op
        self.op_index = op.index
        self._before(planned)
        touched = self._resident(op)
        self._launch(op)
        for t in touched:
            t.locked = False
        self._after(planned, touched)

    def _before(self, planned) -> None:
        """Momentum copied back last op released; read-ahead; the plan's releases and prefetches."""
        if self.state_out:
            self._release_state()
        if self._ready or self._ahead_next < len(self.hints.ahead):
            self._read_ahead(planned.op)
        if self.train:
            for name in planned.release:
                self._finish_offload(self.tensors[name])
            for name in planned.prefetch:
                self._start_prefetch(self.tensors[name], planned.op.step, "prefetch")

    def _resident(self, op) -> list[Tensor]:
        """Lock what the op reads and writes (weights never move: nothing to lock), make its reads
        readable (a cache hit, or a fetch), allocate its writes; returns the locked tensors."""
        tensors, fixed, persistent, cache = self.tensors, self.fixed, self.persistent_set, self.config.cache
        on_device = State.ON_DEVICE  # looked up once: an enum member is a class attribute, slow to reach
        touched = []
        for name in dict.fromkeys((*op.reads, *op.writes)):  # in order: not hashing's
            if name not in fixed:
                t = tensors.get(name) or self._tensor(name)
                t.locked = True
                touched.append(t)
        for name in op.reads:
            if name in fixed:
                continue
            t = tensors[name]
            if t.state is on_device:  # the common case, without a call: a hit if the cache holds it
                if cache and name not in persistent and self.lru.touch(name):  # (it never holds weights)
                    self.stats["cache_hits"] += 1
                continue
            self._make_readable(t, op.step)
        handed = {new for new, _ in op.inplace} if op.inplace else ()  # written into another's buffer
        for name in op.writes:
            if name in fixed:
                continue
            t = tensors[name]
            if name not in handed:
                if t.state is not on_device:
                    self._alloc(t, op.step)
                t.mark_written()
        return touched

    def _launch(self, op) -> None:
        """The batch uploaded (the data layer), the workspace placed, the kernel launched, then
        in-place hand-overs, the workspace freed, and the loss and logits copied out."""
        g, tensors = self.graph, self.tensors
        if op.layer == "data" and op.phase == "forward":
            self.emit.upload([(s.tensor, s.offset, tensors[s.tensor].offset, self.nbytes[s.tensor])
                              for s in self.staged])
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
        if self.train and op.layer == g.loss_layer and op.phase == "forward":
            self.results += [self._copy_out(f"{g.loss_layer}.loss"), self._copy_out(self.logits)]

    def _after(self, planned, touched) -> None:
        """New momentum back to the host, the plan's offloads and frees, the cache's clock and its
        write-behind copies."""
        op, tensors = planned.op, self.tensors
        if op.phase == "update":
            for name in op.writes:
                if name in self.host_state:  # back to its pinned slot; its block freed next op
                    self._start_offload(tensors[name], op.step, "state")
                    self.state_out.append(tensors[name])
        for name in planned.offload if self.train else ():
            self._start_offload(tensors[name], op.step, "offload")
        for name in planned.frees:
            if self.train or name != self.logits:
                self._free(name)
        if self.config.cache:
            for t in touched:
                self.last_use[t.name] = op.index
            self._write_behind(op)

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
        self.out.append(HostWait(self.emit.record(COMPUTE)))
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

    def _workspace(self, op):
        """A conv step's algorithms (:class:`snlite.workspace.Ranked`) and its workspace block, if any."""
        layer = self.graph.layers[op.layer]
        if layer.kind != "conv2d" or op.phase == "update":
            return (), None
        convs, nbytes = self.ranked.step(layer, op.phase, self.config.workspace,
                                         self.pool.largest_free_block())
        if nbytes == 0:
            return convs, None
        t = self.tensors[f"{op.layer}.workspace"] = Tensor(f"{op.layer}.workspace", nbytes, "workspace")
        self.table[t.name] = (None, "float32", "workspace")  # a flat view of the whole block
        t.allocate(self._take_block(t, op.step))
        return convs, t
