"""Cost-aware recomputation (docs/paper.md section 5), on plain data.

Cheap layers (the paper's ReLU, pooling, BN, LRN and dropout, and every layer snlite has added
since whose class sets ``checkpoint = False``: the other activations, ConvNeXt's layer norm and
layer scale, and the vision transformers' token layers and patch merging) hold about half the
activation memory but cost little time, so their outputs are dropped after the forward pass and
rebuilt in backward from the nearest earlier checkpoint (a layer whose output is kept,
``checkpoint = True``: conv, linear, attention and window attention, the structural data, add,
concat and softmax layers, and channel scale, narrow and channel shuffle). A flatten is neither:
its output is a view of its input. Every segment between checkpoints is a chain, so rebuilding a
tensor means re-running the forward steps from the checkpoint to it.

- ``speed``: at the first backward step that needs a segment, recompute the whole segment once
  and keep it for the segment's remaining backward steps (extra work O(N): m re-runs for a
  segment of m cheap layers).
- ``memory``: before each backward step, recompute only what that step needs, from the
  checkpoint (or from a tensor still alive), and free it right after, unless the next backward
  step reads it too: then it stays for that step (the checkpoint's backward and the segment's
  last layer's backward both read its output). A segment of m cheap layers whose backward steps
  read their x and y (ReLU, pooling, LRN, BN) costs m + (m - 1) + ... + 1 = m(m+1)/2 re-runs;
  memory l_i^b.
- ``cost_aware``: per segment, ``speed`` if its speed-centric peak is at most l_peak, else
  ``memory`` (:func:`choose_strategies`).

l_i, and so l_peak, is counted as the trace counts it (:func:`step_bytes`): the bytes one route
step holds at once, each tensor once, a dx written into dy's buffer once.

A recomputed tensor is a new *incarnation* of the dropped one, named ``<tensor>#r<k>``, so that
liveness analysis frees each incarnation after its own last use. Recomputed forwards never update
BatchNorm's running statistics, and dropout draws the identical mask (it is a hash of
(seed, iteration, layer, element), which its backward draws again too: nothing of it is saved).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from snlite.liveness import first_and_last_use, step_tensors
from snlite.records import record

STRATEGIES = ("off", "speed", "memory", "cost_aware")


@record
class Op:
    """One operation of a plan: a route step, or a forward re-run for recomputation."""

    index: int
    step: int  # the route step it belongs to (a recompute belongs to the step it serves)
    layer: str
    phase: str  # "forward", "backward" or "recompute"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    inplace: tuple[tuple[str, str], ...] = ()
    accumulate: tuple[str, ...] = ()
    names: tuple[tuple[str, str], ...] = ()  # tensor -> incarnation, where they differ


def base_name(name: str) -> str:
    """The tensor an incarnation belongs to: ``relu1#r2`` -> ``relu1``."""
    return name.split("#", 1)[0]


@dataclass
class RecomputeInfo:
    """What the recompute stage decided, for the trace and for printing."""

    strategy: str
    dropped: tuple[str, ...] = ()  # tensors dropped after their last forward use
    segment_strategy: dict[str, str] = field(default_factory=dict)  # checkpoint -> "speed" | "memory"
    count: int = 0  # forward re-runs
    extra_flops: int = 0


def segments(graph, keep=()) -> dict[str, str]:
    """Non-checkpoint layer -> the checkpoint its chain starts from. ``keep``: cheap layers that
    count as checkpoints here (``MemoryConfig.recompute_keep``): their outputs stay."""
    root: dict[str, str] = {}
    for name in graph.route()[0]:
        layer = graph.layers[name]
        if not (layer.checkpoint or name in keep):
            (src,) = graph.inputs[name]  # cheap layers have exactly one input
            root[name] = root.get(src, src)
    return root


def forward_steps(graph) -> list:
    """The route's forward steps: the first half of ``graph.steps()``, one per layer in route order
    (the backward steps follow them all), so that a pass over the forward never visits the backward."""
    return graph.steps()[:len(graph.route()[0])]


def step_bytes(steps, tensors, persistent) -> list[int]:
    """l_i of every route step: the bytes of the non-persistent tensors it reads and writes, each
    counted once, a tensor written in place into another's buffer (dx into dy's) once
    (:func:`snlite.liveness.step_tensors`). The batch and the labels count (a layer's input is part
    of its working set), so this l_peak is the trace's under count "all" less the weights, their kin
    and the workspace, in exact bytes rather than the pool's 1 KiB blocks; the paper count leaves
    the batch out, and where the busiest step reads it (a net with a large input) prints less."""
    return [sum(tensors[t].nbytes for t in step_tensors(s.reads, s.writes, s.inplace) if t not in persistent)
            for s in steps]


def droppable(graph, keep=()) -> dict[str, str]:
    """Tensor -> the cheap layer whose forward writes it (outputs and saved tensors); none of a
    layer in ``keep``."""
    out, tensors = {}, graph.tensors()
    for step in forward_steps(graph):
        layer = graph.layers[step.layer]
        if not (layer.checkpoint or step.layer in keep) and not layer.alias_input:
            for t in step.writes:
                if tensors[t].kind == "activation":
                    out[t] = step.layer
    return out


def choose_strategies(graph, strategy: str, persistent, keep=()) -> dict[str, str]:
    """checkpoint -> "speed" | "memory" for every segment, per ``strategy``.

    Assignment 5 (cost-aware recomputation). A segment is a checkpoint and the chain of cheap
    layers that starts from it (:func:`segments` maps each cheap layer to its checkpoint); its
    tensors are those its cheap layers' forward steps read and write (the checkpoint's output,
    their outputs and what they save; never persistent ones), and :func:`droppable` says which
    of them recomputation drops. ``keep``: cheap layers that count as checkpoints (hand it to
    both). Requirements (``pytest -m a5`` checks all but the cost):

    - one entry per segment: the keys are exactly ``set(segments(graph, keep).values())``;
    - ``strategy`` "speed" or "memory": every segment gets that strategy;
    - ``strategy`` "cost_aware", the paper's rule (docs/paper.md section 5) with its memory term
      made exact (sum_seg l^f + l_seg^b counts shared tensors twice), sizes counted once: a
      segment is "speed" if its speed-centric peak is at most l_peak, else "memory", where
      l_peak is the largest l_i of the route (:func:`step_bytes`: a step's non-persistent
      tensors, each once) and the segment's speed-centric peak is the largest, over the
      backward steps from the first one that reads a dropped tensor of the segment (there
      speed-centric rebuilds it whole) to the last one that reads any tensor of the segment, of
      the bytes of the segment's tensors still to be used at or after that step (each until its
      last use in the route, :func:`snlite.liveness.first_and_last_use`) plus those of the
      step's own tensors (:func:`snlite.liveness.step_tensors`) that are not the segment's;
      a segment whose dropped tensors no backward step reads needs nothing: "speed";
    - so the peak under "cost_aware" stays at or below the peak under "speed" (checked on five
      networks), and training under any strategy is bit-identical to training without it;
    - O(N + the segments' backward windows): one pass over the route for the step bytes and the
      last uses, one over the cheap layers, then each segment's steps from its first to its last
      backward use, never a rescan of the whole route per segment.
    """
    # BEGIN ASSIGNMENT 5: cost-aware recomputation
    roots = segments(graph, keep)
    if strategy in ("speed", "memory"):
        return {r: strategy for r in dict.fromkeys(roots.values())}
    steps, tensors = graph.steps(), graph.tensors()
    sizes = step_bytes(steps, tensors, persistent)
    l_peak = max(sizes)
    _, last = first_and_last_use(steps, persistent)
    drop = droppable(graph, keep)
    forward = forward_steps(graph)
    first_read: dict[str, int] = {}  # dropped tensor -> the first backward step that reads it
    for s in steps[len(forward):]:
        for t in s.reads:
            if t in drop:
                first_read.setdefault(t, s.index)
    fwd = {s.layer: s for s in forward}
    owned: dict[str, set[str]] = {}  # segment -> its tensors
    for layer, r in roots.items():
        owned.setdefault(r, set()).update(t for t in (*fwd[layer].reads, *fwd[layer].writes)
                                          if t not in persistent)
    chosen = {}
    for r, mine in owned.items():
        starts = [first_read[t] for t in mine if t in first_read]
        if not starts:
            chosen[r] = "speed"
            continue
        start, end = min(starts), max(last[t] for t in mine)
        live = [t for t in mine if last[t] >= start]  # the segment's tensors still to be used then
        held = sum(tensors[t].nbytes for t in live)
        if held + max(sizes[start:end + 1]) <= l_peak:  # fits even if the window's largest step held it all
            chosen[r] = "speed"
            continue
        dies: dict[int, int] = {}  # step -> bytes of the segment's tensors whose last use it is
        for t in live:
            dies[last[t]] = dies.get(last[t], 0) + tensors[t].nbytes
        peak = 0
        for i in range(start, end + 1):  # backward steps only: backward follows the whole forward
            s = steps[i]
            own = sum(tensors[t].nbytes for t in step_tensors(s.reads, s.writes, s.inplace) if t in mine)
            peak = max(peak, held + sizes[i] - own)
            held -= dies.get(i, 0)
        chosen[r] = "speed" if peak <= l_peak else "memory"
    return chosen
    # END ASSIGNMENT 5


def cheap_layers(graph) -> list[str]:
    """The layers recomputation may drop the outputs of, in route order (not checkpoints, not flatten)."""
    return [n for n in graph.route()[0] if not graph.layers[n].checkpoint and not graph.layers[n].alias_input]


def check_keep(graph, keep) -> None:
    """ValueError unless every name in ``keep`` is a cheap layer of ``graph``."""
    cheap = cheap_layers(graph)
    wrong = [k for k in keep if k not in cheap]
    if wrong:
        why = {k: "no such layer" if k not in graph.layers else
               "a view of its input: nothing of its own to keep" if graph.layers[k].alias_input else
               "a checkpoint: its output stays anyway" for k in wrong}
        what = ", ".join(f"{k!r} ({why[k]})" for k in wrong)
        raise ValueError(f"recompute_keep names {what}; it takes cheap layers of {graph.name}: "
                         f"{', '.join(cheap)}")


def expensive_layers(graph, forward_ms: dict, ratio: float = 0.5) -> tuple[str, ...]:
    """The cheap layers too slow to re-run on the device ``forward_ms`` was measured on: those whose
    forward takes more than ``ratio`` times the mean forward of the network's conv and linear
    layers (the work a checkpoint's output stands for). The paper recomputes by layer kind because
    on a GPU a ReLU, a pooling or a BN costs a few percent of a conv; on another device the same
    kinds need not be cheap, and this says which are not, from times measured there
    (:func:`snlite.costs.measure_layer_costs`). Hand the result to ``MemoryConfig.recompute_keep``.
    With no such layer the paper's rule stands unchanged."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
        raise ValueError(f"expensive_layers: ratio must be a number > 0, got {ratio!r}")
    heavy = [n for n, l in graph.layers.items() if l.kind in ("conv2d", "linear")]
    cheap = cheap_layers(graph)
    missing = [n for n in heavy + cheap if n not in forward_ms]
    if missing:
        raise ValueError(f"expensive_layers: no time for {', '.join(missing[:5])}"
                         f"{' ...' if len(missing) > 5 else ''}; "
                         f"measure every layer of {graph.name} (snlite.costs.measure_layer_costs)")
    bad = {n: forward_ms[n] for n in heavy + cheap if not (forward_ms[n] >= 0)}
    if bad:
        raise ValueError(f"expensive_layers: times must be milliseconds >= 0, got {bad}")
    if not heavy:
        return ()
    limit = ratio * sum(forward_ms[n] for n in heavy) / len(heavy)
    return tuple(n for n in cheap if forward_ms[n] > limit)


def expand(graph, strategy: str, persistent=frozenset(), keep=()) -> tuple[list[Op], RecomputeInfo]:
    """The route as ops, with the recompute ops the strategy needs inserted before backward steps;
    the cheap layers in ``keep`` keep their outputs, as checkpoints do (see :class:`_Expansion`)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown recompute strategy {strategy!r}; choose one of {STRATEGIES}")
    if keep:
        check_keep(graph, keep)
    if strategy == "off":
        return [Op(s.index, s.index, s.layer, s.phase, s.reads, s.writes, s.inplace, s.accumulate)
                for s in graph.steps()], RecomputeInfo(strategy)
    return _Expansion(graph, strategy, persistent, keep).run()


class _Expansion:
    """One walk over the route that inserts the re-runs, in three steps per backward step:

    1. :meth:`rebuild_reads`: each dropped tensor the step reads and that is not there is rebuilt;
       speed-centric re-runs its whole segment (and keeps it until the segment's last use),
       memory-centric only the chain from the nearest tensor still there (:meth:`rebuild`);
    2. the step itself, reading the incarnations (``relu1#r2``) the re-runs wrote;
    3. :meth:`carry_over`: memory-centric re-runs' outputs die after the step, unless the next
       step reads them too.
    """

    def __init__(self, graph, strategy: str, persistent, keep):
        self.graph = graph
        self.drop = droppable(graph, keep)  # tensor -> the cheap layer that writes it
        self.roots = segments(graph, keep)  # cheap layer -> its segment's checkpoint
        self.per_segment = choose_strategies(graph, strategy, persistent, keep)
        self.info = RecomputeInfo(strategy, tuple(self.drop), self.per_segment)
        self.fwd_step = {s.layer: s for s in forward_steps(graph)}
        self.members: dict[str, list[str]] = {}  # checkpoint -> its segment's cheap layers, in route order
        for layer, r in self.roots.items():
            self.members.setdefault(r, []).append(layer)
        self.current: dict[str, str] = {}  # dropped tensor -> its live recomputed incarnation
        self.groups: list[tuple[str, ...]] = []  # memory-centric re-runs' outputs, alive until unread
        self.serial = 0  # incarnations numbered in the order they are made
        self.ops: list[Op] = []

    def run(self) -> tuple[list[Op], RecomputeInfo]:
        steps = self.graph.steps()
        busy = [s for s in steps if not self.graph.layers[s.layer].alias_input]  # steps that compute
        after = {a.index: b for a, b in zip(busy, busy[1:])}
        current = self.current
        for s in steps:
            backward = s.phase == "backward"
            if backward:
                self.rebuild_reads(s)
            names = tuple((t, current[t]) for t in (*s.reads, *s.writes) if t in current) if backward else ()
            reads = tuple(current.get(t, t) for t in s.reads) if backward else s.reads
            self.ops.append(Op(len(self.ops), s.index, s.layer, s.phase, reads, s.writes, s.inplace,
                               s.accumulate,
                               names))
            if self.groups and backward and s.index in after:
                self.carry_over(s, after[s.index])
        return self.ops, self.info

    def rebuild_reads(self, s) -> None:
        for t in s.reads:
            if t not in self.drop or t in self.current:
                continue
            root = self.roots[self.drop[t]]
            if self.per_segment[root] == "speed":
                for layer in self.members[root]:
                    if any(w not in self.current for w in self.fwd_step[layer].writes if w in self.drop):
                        self.rerun(layer, s.index)
            else:
                self.rebuild(t, s.index)

    def rebuild(self, t: str, step_index: int) -> None:
        """Memory-centric: re-run the chain from the nearest tensor still there to ``t``."""
        producer = self.drop[t]
        for x in self.fwd_step[producer].reads:
            if x in self.drop and x not in self.current:
                self.rebuild(x, step_index)
        self.rerun(producer, step_index)

    def rerun(self, layer: str, step_index: int) -> None:
        """One forward re-run of ``layer`` for the backward step ``step_index``: each output a new
        incarnation (a recomputed BatchNorm never updates its running statistics)."""
        fs, current = self.fwd_step[layer], self.current
        reads = tuple(current.get(t, t) for t in fs.reads)
        names = []
        for t in fs.writes:
            if t in self.drop:  # an output or a saved tensor; not a buffer (running statistics)
                self.serial += 1
                current[t] = f"{t}#r{self.serial}"
                names.append((t, current[t]))
        writes = tuple(new for _, new in names)
        if self.per_segment[self.roots[layer]] == "memory":
            self.groups.append(tuple(t for t, _ in names))
        names += [(t, current[t]) for t in fs.reads if t in current]
        self.ops.append(Op(len(self.ops), step_index, layer, "recompute", reads, writes, names=tuple(names)))
        self.info.count += 1
        self.info.extra_flops += self.graph.layers[layer].flops()

    def carry_over(self, s, nxt) -> None:
        """Memory-centric: what step ``s`` read stays for the next step if that one reads it too
        (e.g. a segment's output, read by the next checkpoint's backward and by the segment's last
        layer's backward); the rest was rebuilt for ``s`` only."""
        later = set(nxt.reads) if nxt.phase == "backward" else set()
        read, kept = set(s.reads), []
        for group in self.groups:  # the outputs of one re-run (BatchNorm's: y and its saved statistics)
            stay = tuple(t for t in group if t in later) if read.intersection(group) else ()
            if stay:
                kept.append(stay)
            for t in group:
                if t not in stay:
                    del self.current[t]
        self.groups[:] = kept
