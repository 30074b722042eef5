"""The plans the exact recomputation planner searches, and the plan that runs one.

A plan drops some of the :func:`candidates` (their outputs are freed after their last forward use)
and re-runs each dropped layer before the backward steps that need it (:func:`as_reruns`);
:func:`plan_for` turns it into an ordinary :class:`~snlite.scheduler.Plan`, :func:`reruns_of` reads
one back from SuperNeurons' plans. :class:`Space` lays one graph's plans out for the integer program
(:mod:`snlite.milp`): who reads what, before which backward steps each layer's re-run may come, and
the slots, the moments a launch can happen. Nothing here needs a solver.
"""
from __future__ import annotations

from snlite.config import MemoryConfig
from snlite.recompute import Op, RecomputeInfo
from snlite.scheduler import LivenessStage, Plan, PlannedOp, Scheduler

CONFIG = MemoryConfig(liveness=True)  # the runtime configuration every plan here runs under
RERUNS = ("any", "once")  # re-run as often as the solver likes; or each dropped layer once, just in time


def candidates(graph) -> list[str]:
    """The layers a plan may drop, in forward order: every one whose forward writes activations,
    except the data layer, the loss (its output is the loss) and flatten (it only renames)."""
    fwd = {s.layer: s for s in graph.steps() if s.phase == "forward"}
    tensors = graph.tensors()
    out = []
    for name in graph.route()[0]:
        layer = graph.layers[name]
        if layer.kind == "data" or name == graph.loss_layer or layer.alias_input:
            continue
        if any(tensors[t].kind == "activation" for t in fwd[name].writes):
            out.append(name)
    return out


def outputs(graph, layer, fwd_step) -> list[str]:
    """The activations a layer's forward writes (its output and what it saves), not buffers."""
    tensors = graph.tensors()
    return [t for t in fwd_step.writes if tensors[t].kind == "activation"]


def recompute_stages(graph, dropped) -> dict[str, int | None]:
    """Dropped layer -> the backward route step before which it is re-run (None: never needed).
    Just in time: the first backward step reading one of its outputs, or the re-run of a dropped
    consumer that reads them, whichever is earlier."""
    steps = graph.steps()
    fwd = {s.layer: s for s in steps if s.phase == "forward"}
    producer = {t: name for name in dropped for t in outputs(graph, name, fwd[name])}
    first: dict[str, int] = {}
    for s in steps:
        if s.phase == "backward":
            for t in s.reads:
                if t in producer:
                    first.setdefault(producer[t], s.index)
    stage = {}
    for name in reversed(graph.route()[0]):  # consumers before producers
        if name not in producer.values() and name not in dropped:
            continue
        needs = [first.get(name)]
        outs = set(outputs(graph, name, fwd[name]))
        needs += [stage[m] for m in dropped if m in stage and outs.intersection(fwd[m].reads)]
        needs = [n for n in needs if n is not None]
        stage[name] = min(needs) if needs else None
    return stage


def as_reruns(graph, dropped) -> dict[str, tuple[int, ...]]:
    """Dropped layer -> the backward route steps before which it is re-run. ``dropped`` is either
    that dict already (returned as is, checked) or the layers only: each is then re-run once, just in
    time (:func:`recompute_stages`), or never if nothing needs it."""
    if isinstance(dropped, dict):
        out = {L: tuple(sorted(v)) for L, v in dropped.items()}
    else:
        out = {L: (() if s is None else (s,)) for L, s in recompute_stages(graph, tuple(dropped)).items()}
    bad = set(out) - set(candidates(graph))
    if bad:
        raise ValueError(f"cannot drop {sorted(bad)}: not recomputable layers of {graph.name}; "
                         f"choose among snlite.optimal.candidates(graph)")
    return out


def plan_for(graph, dropped) -> Plan:
    """The plan that drops ``dropped`` (layer names, any subset of :func:`candidates`, each re-run once
    just in time; or a dict layer -> the backward steps to re-run it before, :func:`as_reruns`),
    liveness on: what the runtime executes. Re-runs before one step go in forward order."""
    reruns = as_reruns(graph, dropped)
    steps = graph.steps()
    order = {name: i for i, name in enumerate(graph.route()[0])}
    fwd = {s.layer: s for s in steps if s.phase == "forward"}
    drop = {t: name for name in reruns for t in outputs(graph, name, fwd[name])}
    at: dict[int, list[str]] = {}
    for name, when in reruns.items():
        for s in when:
            at.setdefault(s, []).append(name)
    info = RecomputeInfo("optimal", dropped=tuple(drop))
    ops: list[Op] = []
    current: dict[str, str] = {}  # dropped tensor -> its recomputed incarnation
    serial = 0
    for s in steps:
        if s.phase == "backward":
            for layer in sorted(at.get(s.index, ()), key=order.get):
                f = fwd[layer]
                writes = [t for t in f.writes if t in drop]
                for t in writes:
                    serial += 1
                    current[t] = f"{t}#r{serial}"
                names = tuple((t, current[t]) for t in (*f.reads, *writes) if t in current)
                reads = tuple(current.get(t, t) for t in f.reads)
                ops.append(Op(len(ops), s.index, layer, "recompute", reads, tuple(current[t] for t in writes),
                              names=names))
                info.count += 1
                info.extra_flops += graph.layers[layer].flops()
            names = tuple((t, current[t]) for t in (*s.reads, *s.writes) if t in current)
            ops.append(Op(len(ops), s.index, s.layer, s.phase, tuple(current.get(t, t) for t in s.reads),
                          s.writes, s.inplace, s.accumulate, names))
        else:
            ops.append(Op(len(ops), s.index, s.layer, s.phase, s.reads, s.writes, s.inplace, s.accumulate))
    persistent = Scheduler(graph, CONFIG).persistent()
    frees = LivenessStage(True).apply(ops, persistent, set(drop))
    return Plan(CONFIG, [PlannedOp(op, frees=tuple(frees.get(i, ()))) for i, op in enumerate(ops)], info,
                persistent=frozenset(persistent))


def reruns_of(graph, plan) -> dict[str, tuple[int, ...]] | None:
    """The re-runs of a recomputation plan (SuperNeurons' speed-, memory-centric or cost-aware, sqrt(N))
    as :func:`plan_for` takes them, or None where it is not one of these plans (a layer it drops that
    may not be dropped here, or re-run twice before one step)."""
    fwd = {s.layer: s for s in graph.steps() if s.phase == "forward"}
    dropped = set(plan.recompute.dropped)
    out: dict[str, list[int]] = {L: [] for L in candidates(graph) if dropped.intersection(fwd[L].writes)}
    for p in plan.ops:
        if p.op.phase == "recompute":
            if p.op.layer not in out or p.op.step in out[p.op.layer]:
                return None
            out[p.op.layer].append(p.op.step)
    return {L: tuple(v) for L, v in out.items()}


class Space:
    """The plans of one graph as the integer program sees them, built in four steps: the layers it
    may drop (``allowed``, default every candidate) and what their outputs are read by; the backward
    positions each re-run may come before (``reruns``: "any" or "once", see :mod:`snlite.optimal`);
    the slots; and the slots between which each tensor of the plan without recomputation lives."""

    def __init__(self, graph, allowed=None, reruns: str = "any"):
        if reruns not in RERUNS:
            raise ValueError(f"reruns must be one of {RERUNS}, got {reruns!r}")
        self.graph, self.mode = graph, reruns
        self.persistent = Scheduler(graph, CONFIG).persistent()
        self.cands = [L for L in candidates(graph) if allowed is None or L in set(allowed)]  # may be dropped
        self.pos = {name: i for i, name in enumerate(self.cands)}
        self._readers()
        self._rerun_positions()
        self._lifetimes(self._slots())

    def _readers(self) -> None:
        """Per candidate L its outputs ``outs[L]``, and who reads each output u: ``readers[u]`` (the
        candidates whose forward reads it, so their re-runs read it again), ``bread[u]`` (the backward
        positions reading it) and ``cons[L]`` (L's consumers among the candidates)."""
        steps = self.graph.steps()
        fwd = {s.layer: s for s in steps if s.phase == "forward"}
        self.outs = {L: outputs(self.graph, L, fwd[L]) for L in self.cands}
        self.producer = {u: L for L, us in self.outs.items() for u in us}
        self.readers = {}  # tensor -> candidates whose forward reads it (a re-run reads it again)
        for M in self.cands:
            for u in fwd[M].reads:
                if u not in self.persistent:
                    self.readers.setdefault(u, []).append(M)
        self.cons = {L: sorted({M for u in us for M in self.readers.get(u, ()) if M != L}, key=self.pos.get)
                     for L, us in self.outs.items()}
        self.bstages = [s.index for s in steps if s.phase == "backward"]
        bpos = {s: j for j, s in enumerate(self.bstages)}
        self.bread: dict[str, list[int]] = {}  # candidate output -> backward positions reading it
        for s in steps:
            if s.phase == "backward":
                for u in s.reads:
                    if u in self.producer:
                        self.bread.setdefault(u, []).append(bpos[s.index])

    def _rerun_positions(self) -> None:
        """``starts[L]``: the backward positions a re-run of L can come before; ``fb[L]``: the first
        that reads its outputs (None: none does)."""
        self.fb = {L: min((j for u in self.outs[L] for j in self.bread.get(u, ())), default=None)
                   for L in self.cands}
        self.starts: dict[str, set[int]] = {}
        for L in reversed(self.cands):
            opts = {x for M in self.cons[L] for x in self.starts[M]}
            if self.mode == "any":  # wherever it, or a consumer's re-run, needs it
                opts |= {j for u in self.outs[L] for j in self.bread.get(u, ())}
            elif self.fb[L] is not None:  # once: just in time
                opts = {x for x in opts if x < self.fb[L]} | {self.fb[L]}
            self.starts[L] = opts

    def _slots(self) -> dict[int, int]:
        """``slots``, the moments a launch can happen: each forward step ("f", step, None); per backward
        position j each possible re-run ("r", j, L), in forward order, then the step ("b", j, None).
        Returns each route step's slot."""
        steps = self.graph.steps()
        slots = [("f", s.index, None) for s in steps if s.phase == "forward"]
        at = {}
        for L in self.cands:
            for j in self.starts[L]:
                at.setdefault(j, []).append(L)
        step_slot = {}
        for j, s in enumerate(self.bstages):
            for L in sorted(at.get(j, ()), key=self.pos.get):
                slots.append(("r", j, L))
            step_slot[s] = len(slots)
            slots.append(("b", j, None))
        for s in steps:
            if s.phase == "forward":
                step_slot[s.index] = s.index  # forward steps come first, one slot each
        self.slots = slots
        return step_slot

    def _lifetimes(self, step_slot) -> None:
        """Every tensor of the route without recomputation: ``first`` and ``last``, the slots between
        which it holds its block, and ``lf``, the slot of its last forward use."""
        self.first, self.last, self.lf = {}, {}, {}
        for s in self.graph.steps():
            k = step_slot[s.index]
            new = {n for n, _ in s.inplace}
            for t in (*s.reads, *s.writes):
                if t in self.persistent:
                    continue
                self.first.setdefault(t, k + 1 if t in new else k)  # written into another's buffer: one block
                self.last[t] = k
                if s.phase == "forward":
                    self.lf[t] = k
