"""The scheduler: SuperNeurons' optimizations as stages, each one toggled by :class:`MemoryConfig`.

    sched = Scheduler(graph, MemoryConfig.superneurons())
    print(sched)               # the stages, on or off, and what each decided
    plan = sched.plan()        # per-op actions, as data
    print(plan.table())        # ... as a readable table

The stages run in this order (``Scheduler.stages``) and take and return plain data:

1. :class:`RecomputeStage` expands the route into ops, inserting forward re-runs of cheap layers
   before the backward steps that need them (:mod:`snlite.recompute`);
2. :class:`UpdateStage` (``update_in_backward``) puts each layer's SGD update right after its
   gradient is complete, which changes what liveness frees next (the gradient, after its update);
3. :class:`LivenessStage` frees every tensor after its last use (:mod:`snlite.liveness`); when
   off, only recomputation's dropped tensors (and updated gradients) are freed early;
4. :class:`OffloadStage` schedules CONV outputs to the host and back (:mod:`snlite.offload`);
   with the cache on, offloading is lazy instead: nothing is scheduled;
5. :class:`CacheStage` says so: the placement pass evicts least-recently-used tensors only when an
   allocation would fail (:mod:`snlite.cache`);
6. :class:`WorkspaceStage` picks each conv step's algorithm at run time (:mod:`snlite.workspace`),
   from the memory free at that moment.

The placement pass (:mod:`snlite.placement`) turns a plan into a program (every allocation at its
offset, every copy on its stream with its events, every launch), which the executor
(:mod:`snlite.executor`) replays on the meta, host or CUDA device: what the meta device plans is
exactly what the others allocate.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from snlite import liveness, offload, recompute
from snlite.config import MemoryConfig, config_of
from snlite.graph import graph_of
from snlite.recompute import Op, base_name
from snlite.records import record, without_cycle_collection
from snlite.steps import TensorSpec

# what lives the whole run, in the order the placement pass lays it out: the weight gradients last, so
# that a grads program (no optimizer state) is a train program's prefix
PERSISTENT_KINDS = ("weight", "buffer", "optimizer", "weight_grad")


def persistent_tensors(specs: dict, without_grads: bool = False) -> list[str]:
    """The names of ``specs`` (name -> anything with a ``kind``) that live the whole run, in
    placement order; ``without_grads``: the weight gradients live only until their update (SGD in
    backward) or do not exist (inference)."""
    by_kind: dict[str, list[str]] = {k: [] for k in PERSISTENT_KINDS}
    for n, t in specs.items():
        if t.kind in by_kind:
            by_kind[t.kind].append(n)
    return [n for k in PERSISTENT_KINDS if not (without_grads and k == "weight_grad") for n in by_kind[k]]


def optimizer_specs(graph) -> dict[str, TensorSpec]:
    """SGD's momentum buffers, one per weight: the optimizer state :class:`~snlite.train.Model` keeps."""
    return {f"{n}.momentum": TensorSpec(f"{n}.momentum", t.shape, "float32", "optimizer")
            for n, t in graph.tensors().items() if t.kind == "weight"}


@record
class PlannedOp:
    """An op and the memory actions around it."""

    op: Op
    release: tuple[str, ...] = ()  # before: offloaded tensors whose device copy is released
    prefetch: tuple[str, ...] = ()  # before: tensors copied back from the host
    offload: tuple[str, ...] = ()  # after: tensors copied to the host
    frees: tuple[str, ...] = ()  # after: tensors freed (last use, or dropped for recomputation)


@dataclass
class Plan:
    """What the stages decided, op by op."""

    config: MemoryConfig
    ops: list[PlannedOp]
    recompute: recompute.RecomputeInfo
    transfers: list[offload.Transfer] = field(default_factory=list)
    conv_layers: frozenset = frozenset()  # their steps also pick a workspace (at run time if dynamic)
    persistent: frozenset = frozenset()  # weights, their gradients, buffers: allocated once, never in a row

    def __repr__(self) -> str:  # one line, not every op (``table()`` lists them)
        return (f"Plan({self.config.describe()!r}, {len(self.ops):,d} ops, {len(self.transfers)} transfers, "
                f"{len(self.recompute.dropped)} dropped)")

    def with_transfers(self, transfers) -> "Plan":
        """The same plan with other offload times (``snlite.overlap`` retimes them for a GPU)."""
        frees = {i: p.frees for i, p in enumerate(self.ops)}
        return dataclasses.replace(self, ops=_planned(self.ops, transfers, frees),
                                   transfers=list(transfers))

    def table(self, limit: int | None = None) -> str:
        """One row per op, its actions in the order the placement pass takes them: release and prefetch
        before it, then alloc (what it writes), the workspace choice for convs, the compute, then
        offload and free after it."""
        rows = [f"{'op':>5} {'step':>5}  {'layer':24} {'phase':10} actions"]
        for p in self.ops[:limit]:
            inplace = {new: old for new, old in p.op.inplace}
            allocs = [t for t in p.op.writes if t not in inplace and t not in self.persistent]
            acts = ([f"release {','.join(p.release)}"] if p.release else []) + \
                   ([f"prefetch {','.join(p.prefetch)}"] if p.prefetch else []) + \
                   ([f"alloc {','.join(allocs)}"] if allocs else []) + \
                   [f"{new} into {old}'s buffer" for new, old in inplace.items()] + \
                   ([f"workspace {self.config.workspace}"] if p.op.layer in self.conv_layers else []) + \
                   ([f"offload {','.join(p.offload)}"] if p.offload else []) + \
                   ([f"free {','.join(p.frees)}"] if p.frees else [])
            rows.append(f"{p.op.index:>5} {p.op.step:>5}  {p.op.layer:24} {p.op.phase:10} {'; '.join(acts)}")
        if limit is not None and len(self.ops) > limit:
            rows.append(f"... {len(self.ops) - limit} more ops")
        return "\n".join(rows)


def _planned(ops, transfers, frees) -> list[PlannedOp]:
    """Ops (or planned ops) with the actions the transfers and frees put around them."""
    before_rel, before_pre, after_off = {}, {}, {}
    for tr in transfers:
        after_off.setdefault(tr.offload_after, []).append(tr.tensor)
        before_rel.setdefault(tr.release_before, []).append(tr.tensor)
        if tr.prefetch_before is not None:
            before_pre.setdefault(tr.prefetch_before, []).append(tr.tensor)
    rel, pre, off, fr = ({i: tuple(ts) for i, ts in d.items() if ts}
                         for d in (before_rel, before_pre, after_off, frees))
    if not (rel or pre or off):  # the common case, without transfers: one lookup per op
        return [PlannedOp(getattr(op, "op", op), frees=fr[i]) if i in fr else PlannedOp(getattr(op, "op", op))
                for i, op in enumerate(ops)]
    none = ()
    return [PlannedOp(getattr(op, "op", op), rel.get(i, none), pre.get(i, none), off.get(i, none),
                      fr.get(i, none))
            for i, op in enumerate(ops)]


class Stage:
    """One optimization: on or off, and a line saying what it does."""

    name = "stage"

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.summary = "off"

    def __str__(self) -> str:
        return f"{self.name:11} {'on ' if self.enabled else 'off'}  {self.summary if self.enabled else ''}"


class RecomputeStage(Stage):
    name = "recompute"

    def __init__(self, strategy: str, keep=()):
        super().__init__(strategy != "off")
        self.strategy, self.keep = strategy, tuple(keep)

    def apply(self, graph, persistent):
        ops, info = recompute.expand(graph, self.strategy, persistent, self.keep)
        if self.enabled:
            kinds = sorted(set(info.segment_strategy.values()))
            self.summary = (f"{self.strategy}: {len(info.dropped)} tensors dropped, "
                            f"{info.count} forward re-runs "
                            f"({', '.join(kinds)}-centric segments), +{info.extra_flops:,d} FLOPs"
                            + (f"; kept (too slow to re-run): {', '.join(self.keep)}" if self.keep else ""))
        return ops, info


class UpdateStage(Stage):
    """SGD in backward: each layer's update as an op right after its backward step (the last step
    that writes its weight gradients), reading the loss as a guard (a non-finite loss skips it on the
    device), so that liveness frees each weight gradient right after its update."""

    name = "update"

    def __init__(self, enabled: bool):
        super().__init__(enabled)
        self.summary = "each layer's SGD step right after its backward; weight gradients freed there"

    def apply(self, ops, graph) -> list[Op]:
        if not self.enabled:
            return ops
        out = []
        for op in ops:  # an op keeps its place until the first update; after it, each moves one more on
            out.append(op if op.index == len(out) else Op(len(out), op.step, op.layer, op.phase, op.reads,
                                                          op.writes, op.inplace, op.accumulate, op.names))
            if op.phase == "backward" and graph.layers[op.layer].params():
                out.append(update_op(graph, op.layer, len(out), op.step, guard=f"{graph.loss_layer}.loss"))
        self.summary = (f"{sum(o.phase == 'update' for o in out)} updates in backward, "
                        f"each freeing its weight gradients")
        return out

    @staticmethod
    def frees(ops) -> dict[int, list[str]]:
        """Each weight gradient freed right after its update (what liveness decides too; without
        liveness the update stage still frees them, or updating in backward would save nothing)."""
        return {op.index: [t for t in op.reads if t.endswith(".grad")] for op in ops if op.phase == "update"}


def update_op(graph, layer: str, index: int, step: int, guard: str | None = None) -> Op:
    """The SGD step of one layer as an op: it reads every parameter, its gradient and its momentum
    buffer (and ``guard``, the loss), and writes the parameters and the buffers."""
    params = [graph.layers[layer].state_name(p) for p in graph.layers[layer].params()]
    reads = tuple(x for p in params for x in (p, f"{p}.grad", f"{p}.momentum")) + ((guard,) if guard else ())
    return Op(index, step, layer, "update", reads, tuple(x for p in params for x in (p, f"{p}.momentum")))


class LivenessStage(Stage):
    name = "liveness"

    def apply(self, ops, persistent, dropped):
        if not (self.enabled or dropped):  # no liveness and nothing recomputed: nothing is freed early
            return {}
        handed = {i: {old for _, old in op.inplace} for i, op in enumerate(ops) if op.inplace}
        if self.enabled:
            frees = {i: [t for t in ts if t not in handed[i]] if i in handed else ts
                     for i, ts in liveness.frees_after(ops, persistent).items()}
            self.summary = f"{sum(map(len, frees.values()))} frees after last uses"
            return frees
        early = dict.fromkeys(t for op in ops for t in (*op.reads, *op.writes) if base_name(t) in dropped)
        _, last = liveness.first_and_last_use(ops, persistent)
        frees: dict[int, list[str]] = {}
        for t in early:
            if t not in handed.get(last[t], ()):
                frees.setdefault(last[t], []).append(t)
        return frees


class OffloadStage(Stage):
    name = "offload"

    def __init__(self, enabled: bool, lazy: bool, evict: str = "lru"):
        super().__init__(enabled)
        self.lazy, self.evict = lazy, evict

    def apply(self, ops, graph):
        if not self.enabled or self.lazy:
            if self.enabled:
                first = "CONV outputs first" if self.evict == "lru" else f"evict={self.evict}"
                self.summary = f"lazy: the tensor cache moves data ({first}) only when memory runs short"
            return []
        transfers = offload.schedule(ops, graph)
        outputs = "CONV output" if len(transfers) == 1 else "CONV outputs"
        self.summary = f"{len(transfers)} {outputs} to pinned host memory and back"
        return transfers


class CacheStage(Stage):
    name = "cache"

    def __init__(self, enabled: bool, conv_first: bool, evict: str = "lru"):
        super().__init__(enabled)
        policy = {"lru": "LRU", "largest": "largest-first", "belady": "Belady (next use furthest)"}[evict]
        self.summary = (policy + " eviction of activations and gradients"
                        + (", CONV outputs first" if conv_first and evict == "lru" else "")
                        + " when an allocation would fail")


class WorkspaceStage(Stage):
    name = "workspace"

    def __init__(self, mode: str):
        super().__init__(mode != "none")
        self.mode = mode
        self.summary = {"fastest": "always the fastest conv algorithm",
                        "dynamic": "the fastest conv algorithm whose workspace fits now"}.get(mode, "")


class Scheduler:
    """Builds a :class:`Plan` for ``graph`` under ``config`` from one stage per optimization."""

    def __init__(self, graph, config: MemoryConfig | None = None):
        self.graph = graph_of(graph)
        self.config = c = config_of(config)
        self.recompute = RecomputeStage(c.recompute, c.recompute_keep)
        self.liveness = LivenessStage(c.liveness)
        self.offload = OffloadStage(c.offload, lazy=c.cache, evict=c.evict)
        self.cache = CacheStage(c.cache, conv_first=c.offload, evict=c.evict)
        self.workspace = WorkspaceStage(c.workspace)
        self.update = UpdateStage(c.update_in_backward)
        self.stages = [self.recompute, self.update, self.liveness, self.offload, self.cache, self.workspace]
        self._plan = None

    def persistent(self, classic: set[str] | None = None) -> set[str]:
        """What lives the whole run: weights, buffers, momentum, and the weight gradients unless each
        lives only until its update (``update_in_backward``). ``classic``: the graph's
        :func:`persistent_tensors`, where the caller has them already."""
        tensors = self.graph.tensors()
        classic = set(persistent_tensors(tensors)) if classic is None else classic
        if not self.config.update_in_backward:
            return classic
        # the update ops read and write the momentum buffers (the optimizer's, not the graph's tensors)
        weights = [n for n in classic if tensors[n].kind == "weight"]
        return {n for n in classic if tensors[n].kind != "weight_grad"} | {f"{n}.momentum" for n in weights}

    def plan(self) -> Plan:
        if self._plan is None:
            with without_cycle_collection():  # tens of thousands of ops, and no cycle among them
                self._plan = self._build()
        return self._plan

    def _build(self) -> Plan:
        classic = set(persistent_tensors(self.graph.tensors()))
        persistent = self.persistent(classic)
        ops, info = self.recompute.apply(self.graph, classic)  # its segment rule counts activations only
        ops = self.update.apply(ops, self.graph)
        frees = self.liveness.apply(ops, persistent, set(info.dropped))
        if self.update.enabled and not self.liveness.enabled:
            for i, grads in self.update.frees(ops).items():
                frees.setdefault(i, []).extend(grads)
        transfers = self.offload.apply(ops, self.graph)
        planned = _planned(ops, transfers, frees)
        convs = frozenset(n for n, l in self.graph.layers.items() if l.kind == "conv2d")
        return Plan(self.config, planned, info, transfers, convs, frozenset(persistent))

    def __str__(self) -> str:
        self.plan()
        lines = [f"Scheduler for {self.graph.name} under {self.config.describe()}"]
        lines += [f"  {s}" for s in self.stages]
        return "\n".join(lines)


def inference_plan(plan: Plan, graph) -> Plan:
    """The plan an inference pass places: ``plan``'s forward ops but the loss layer's, each tensor
    freed after its last use among them (under liveness; without it, only the outputs recomputation
    drops, as in training), the logits kept to be read back, and nothing moved to the host (no
    backward will read it). The training plan's frees come after backward, which inference skips."""
    ops = [p.op for p in plan.ops if p.op.phase == "forward" and p.op.layer != graph.loss_layer]
    logits = graph.output_tensor(graph.inputs[graph.loss_layer][0])
    frees = LivenessStage(plan.config.liveness).apply(ops, plan.persistent | {logits},
                                                      set(plan.recompute.dropped))
    return dataclasses.replace(plan, ops=_planned(ops, [], frees), transfers=[])


def validate_plan(plan: Plan, persistent) -> None:
    """Walk a plan on plain data and raise ValueError if any op reads a tensor
    that is not resident then (written earlier, not freed, released or still on the host), or
    frees one it does not hold (one an in-place write took over, say). The LRU cache's moves are
    decided by the placement pass, which checks those op by op."""
    resident: set[str] = set(persistent)
    on_host: set[str] = set()
    for p in plan.ops:
        op = p.op
        for t in p.release:
            resident.discard(t)
            on_host.add(t)
        for t in p.prefetch:
            if t not in on_host:
                raise ValueError(f"op {op.index} prefetches {t}, which is not on the host")
            on_host.discard(t)
            resident.add(t)
        missing = [t for t in op.reads if t not in resident]
        if missing:
            raise ValueError(f"op {op.index} ({op.layer} {op.phase}, step {op.step}) reads {missing}, which "
                             f"{'is' if len(missing) == 1 else 'are'} not resident")
        for new, old in op.inplace:
            resident.discard(old)
        resident.update(op.writes)
        gone = [t for t in p.frees if t not in resident]
        if gone:
            raise ValueError(f"op {op.index} ({op.layer} {op.phase}, step {op.step}) frees {gone}, which "
                             f"{'it does' if len(gone) == 1 else 'they do'} not hold (handed over in place, "
                             "freed before or on the host)")
        for t in p.frees:
            resident.discard(t)
