"""The second exact model: which activations to send to the host and when to bring each back.

SuperNeurons offloads only CONV outputs, on a fixed schedule (:mod:`snlite.offload`). Here any
activation a backward step reads may go: its copy to the host starts right after the forward step
that writes it, its device block is released before the forward step after its last forward read,
and the integer program chooses whether it goes and before which backward step (at or before its
first backward read) it comes back. Nothing is recomputed; liveness is on.

The program is small and linear, with no ``alive`` variables: per tensor u a binary ``o[u]`` (it
goes) and one-hot binaries ``p[u, k]`` (it comes back before backward op k). The memory at each op's
launch is the liveness-only plan's, read off its trace, plus for each u that goes

- under count "all": minus its block from its release to its last use, plus its block from its
  prefetch on (a block being copied out still counts, as the trace counts ``in_flight``);
- under count "paper": minus its bytes from the op after its copy starts (the paper counts what is
  in flight as gone), plus its bytes from its prefetch on.

Objectives: the least peak under an allowance of bytes moved (to the host and back), or the fewest
bytes moved under a budget on the peak, or the least transfer time under that budget: each tensor that
goes costs two copies as the time model counts them (:func:`snlite.timing.copy_ms`: a fixed latency,
then the bytes over the profile's pinned bandwidth), so many small tensors cost more than their bytes
say. That is the copies' own time (``Timeline.transfer_ms``), not how much of it compute hides. The
executed peak equals the program's (tests/test_optimal.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from snlite import highs
from snlite.config import MemoryConfig
from snlite.highs import STATUS
from snlite.measure import measure
from snlite.offload import Transfer
from snlite.pool import TensorPool
from snlite.scheduler import Scheduler
from snlite.timing import copy_ms, profile

CONFIG = MemoryConfig(liveness=True, offload=True)  # on for the pinned slab; the plan gives the transfers


@dataclass
class OffloadResult:
    """What :func:`solve` found."""

    graph_name: str
    prefetch: dict  # tensor -> the op before which it comes back (the tensors that go to the host)
    plan: object
    peak_bytes: int | None
    moved_bytes: int | None
    status: str
    gap: float | None
    solve_s: float
    size: dict = field(default_factory=dict)
    transfer_ms: float | None = None  # the copies' time on ``gpu`` (snlite.timing), both ways

    @property
    def optimal(self) -> bool:
        return self.status == "optimal"


OBJECTIVES = ("peak", "moved", "time")


class OffloadModel:
    """The offload program of one graph (count "all" or "paper"); see the module docstring."""

    def __init__(self, graph, count: str = "all"):
        if count not in ("all", "paper"):
            raise ValueError(f"count must be 'all' or 'paper', got {count!r}")
        self.graph, self.count = graph, count
        self.base_plan = Scheduler(graph, CONFIG.replace(offload=False)).plan()
        m = measure(graph, CONFIG.replace(offload=False), plan=self.base_plan)
        trace = m.trace if count == "all" else m.paper
        ops = [p.op for p in self.base_plan.ops]
        self.n = len(ops)
        self.base = np.zeros(self.n)
        self.launched = [False] * self.n
        for r in trace.op_steps:
            self.base[r.op], self.launched[r.op] = r.counted_bytes, True
        tensors = graph.tensors()
        block = TensorPool(1024).reserved_bytes
        first_fwd = {}
        reads: dict[str, list[int]] = {}
        for op in ops:
            for t in op.writes:
                first_fwd.setdefault(t, op.index)
            for t in op.reads:
                reads.setdefault(t, []).append(op.index)
        nf = sum(op.phase == "forward" for op in ops)
        self.cands = {}  # tensor -> (copy after, release before, first backward read, last use)
        for t, spec in tensors.items():
            if spec.kind != "activation" or t not in first_fwd:
                continue
            rs = reads.get(t, [])
            fwd_reads = [i for i in rs if i < nf]
            bwd_reads = [i for i in rs if i >= nf]
            release = max([first_fwd[t], *fwd_reads]) + 1
            if not bwd_reads or release >= nf or min(bwd_reads) <= release:
                continue  # never read again, or still needed in forward, or needed at once
            self.cands[t] = (first_fwd[t], release, min(bwd_reads), max(bwd_reads))
        self.size = {t: (block(max(tensors[t].nbytes, 1)) if count == "all" else tensors[t].nbytes)
                     for t in self.cands}
        # the variables: o[u], then p[u, k] for k in (release, first backward read]
        self.names, self.o, self.p = [], {}, {}
        for u, (_, rel, fb, _) in self.cands.items():
            self.o[u] = len(self.names)
            self.names.append(f"o[{u}]")
            self.p[u] = {}
            for k in range(max(rel + 1, nf), fb + 1):
                self.p[u][k] = len(self.names)
                self.names.append(f"p[{u},{k}]")

    def memory(self):
        """Per op, (constant bytes, {variable: bytes}): the memory at its launch."""
        out = []
        for i in range(self.n):
            terms: dict[int, float] = {}
            for u, (a, rel, _, last) in self.cands.items():
                if i > last:
                    continue
                gone = rel if self.count == "all" else a + 1
                n = self.size[u]
                if i >= gone:
                    terms[self.o[u]] = terms.get(self.o[u], 0.0) - n
                for k, v in self.p[u].items():
                    if k <= i:
                        terms[v] = terms.get(v, 0.0) + n
            out.append((float(self.base[i]), terms))
        return out

    def moved(self) -> dict[int, float]:
        return {self.o[u]: 2.0 * self.graph.tensors()[u].nbytes for u in self.cands}

    def transfer(self, gpu="H200") -> dict[int, float]:
        """Per ``o[u]``: the milliseconds of its two copies (to the host and back) on ``gpu``."""
        prof = profile(gpu)
        return {self.o[u]: copy_ms(prof, self.graph.tensors()[u].nbytes, True)
                + copy_ms(prof, self.graph.tensors()[u].nbytes, False) for u in self.cands}

    def transfer_ms(self, prefetch: dict, gpu="H200") -> float:
        """The copies' time of one choice (tensor -> prefetch op) on ``gpu``."""
        ms = self.transfer(gpu)
        return sum(ms[self.o[u]] for u in prefetch)

    def bytes_at(self, prefetch: dict) -> list[int]:
        """The bytes at every launched op for one choice (tensor -> prefetch op), exactly."""
        if not hasattr(self, "_dense"):
            rows = [(k0, t) for (k0, t), ok in zip(self.memory(), self.launched) if ok]
            A = np.zeros((len(rows), len(self.names)), dtype=np.int64)
            for r, (_, t) in enumerate(rows):
                for v, c in t.items():
                    A[r, v] = int(c)
            self._dense = (np.array([int(k0) for k0, _ in rows], dtype=np.int64), A)
        x = np.zeros(len(self.names), dtype=np.int64)
        for u, k in prefetch.items():
            x[self.o[u]], x[self.p[u][k]] = 1, 1
        k0, A = self._dense
        return [int(b) for b in k0 + A @ x]

    def solve(self, objective: str = "peak", allowance: int | None = None, budget: int | None = None,
              time_limit: float = 60.0, gpu="H200"):
        nv = len(self.names) + 1  # the last one: peak
        peak = nv - 1
        rows, lo, hi = [], [], []
        unit = 1024.0
        for (k0, terms), ok in zip(self.memory(), self.launched):
            if not ok:
                continue
            row = np.zeros(nv)
            for v, c in terms.items():
                row[v] = c / unit
            if objective == "peak":
                row[peak] = -1.0
                rows.append(row), lo.append(-np.inf), hi.append(-k0 / unit)
            else:
                rows.append(row), lo.append(-np.inf), hi.append((budget - k0) / unit)
        for u in self.cands:  # it comes back once, if it went
            row = np.zeros(nv)
            row[self.o[u]] = -1.0
            for v in self.p[u].values():
                row[v] = 1.0
            rows.append(row), lo.append(0.0), hi.append(0.0)
        mv = np.zeros(nv)
        for v, c in self.moved().items():
            mv[v] = c / unit
        if allowance is not None:
            rows.append(mv), lo.append(-np.inf), hi.append(allowance / unit)
        c = np.zeros(nv)
        if objective == "peak":
            c[peak] = 1.0
        elif objective == "moved":
            c = mv
        else:  # in microseconds, nearer 1 than milliseconds, as HiGHS likes
            for v, ms in self.transfer(gpu).items():
                c[v] = 1e3 * ms
        integrality = np.ones(nv)
        integrality[peak] = 0
        ub = np.ones(nv)
        ub[peak] = np.inf
        res, seconds = highs.run(c, integrality, np.zeros(nv), ub, np.array(rows), lo, hi, time_limit)
        if res.x is None:
            return res, None, seconds
        return res, {u: next(k for k, v in self.p[u].items() if res.x[v] > 0.5) for u in self.cands
                     if res.x[self.o[u]] > 0.5}, seconds


def plan_for(graph, prefetch: dict, base_plan=None):
    """The liveness-only plan with each tensor of ``prefetch`` sent to the host right after the op
    that writes it, released before the op after its last forward read, and brought back before op
    ``prefetch[tensor]``: what the runtime executes (under :data:`CONFIG`)."""
    base_plan = base_plan or Scheduler(graph, CONFIG.replace(offload=False)).plan()
    ops = [p.op for p in base_plan.ops]
    first, last_fwd = {}, {}
    nf = sum(op.phase == "forward" for op in ops)
    for op in ops:
        for t in op.writes:
            first.setdefault(t, op.index)
        for t in op.reads:
            if op.index < nf:
                last_fwd[t] = op.index
    transfers = [Transfer(u, first[u], max(first[u], last_fwd.get(u, first[u])) + 1, k)
                 for u, k in prefetch.items()]
    return dataclasses.replace(base_plan.with_transfers(transfers), config=CONFIG)


def solve(graph, objective: str = "peak", allowance: int | None = None, budget: int | None = None,
          count: str = "all", time_limit: float = 60.0, model: OffloadModel | None = None,
          gpu="H200") -> OffloadResult:
    """The best offload plan: the least peak (with at most ``allowance`` bytes moved), or the fewest
    bytes moved (``objective="moved"``) or least transfer time on ``gpu`` (``"time"``) with a peak of
    at most ``budget``."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
    if objective != "peak" and budget is None:
        raise ValueError(f"objective {objective!r} needs a byte budget on the peak (budget=...)")
    model = model or OffloadModel(graph, count)
    res, choice, seconds = model.solve(objective, allowance, budget, time_limit, gpu)
    status = STATUS.get(res.status, f"status {res.status}")
    size = {"variables": len(model.names) + 1, "binaries": len(model.names)}
    if choice is None:
        return OffloadResult(graph.name, {}, None, None, None, status, None, seconds, size)
    moved = int(sum(2 * graph.tensors()[u].nbytes for u in choice))
    plan = plan_for(graph, choice, model.base_plan)
    return OffloadResult(graph.name, choice, plan, max(model.bytes_at(choice)), moved, status,
                         getattr(res, "mip_gap", None), seconds, size, model.transfer_ms(choice, gpu))
