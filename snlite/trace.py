"""The trace: what a program does to memory, op by op, and the totals people ask about.

:func:`trace_program` reads it off a :class:`~snlite.program.Program` without running anything.
Under ``count="all"`` every byte here is what the pool reserved (requests rounded up to its blocks),
and the host and CUDA devices run that same program, so the trace is, byte for byte, what they then
hold.

Categories: ``weights`` (weights and BatchNorm buffers), ``weight_grads``, ``optimizer``
(momentum), ``input`` (the batch and its labels), ``activations`` (layer outputs and what
forward saves for backward), ``gradients`` (activation gradients), ``workspace`` (conv),
``in_flight`` (a device copy still held while it is copied to the host). The paper's count
(``count="paper"``) is the paper's accounting: activations + gradients, each tensor at its own
size (not rounded up to the pool's blocks), as cuDNN's steps give them (a dx written in place is
one buffer; dropout's backward writes its own dx; dropout saves no mask), no workspace.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from snlite.liveness import step_tensors
from snlite.program import Alloc, Copy, Free, HandOver, Launch, program_of, without_cycle_collection
from snlite.records import record
from snlite.scheduler import PERSISTENT_KINDS

CATEGORIES = ("weights", "weight_grads", "optimizer", "input", "activations", "gradients", "workspace",
              "in_flight")
KIND_CATEGORY = {"weight": "weights", "buffer": "weights", "weight_grad": "weight_grads",
                 "optimizer": "optimizer", "input": "input", "activation": "activations",
                 "gradient": "gradients", "workspace": "workspace"}
PAPER_CATEGORIES = ("activations", "gradients")
PERSISTENT_CATEGORIES = ("weights", "weight_grads", "optimizer")  # the parameters and their kin


def counted(device_bytes: dict, count: str) -> int:
    """Bytes that count under ``count`` ("all" or "paper")."""
    cats = PAPER_CATEGORIES if count == "paper" else CATEGORIES
    return sum(device_bytes.get(c, 0) for c in cats)


@record
class StepRecord:
    """The device's state at the busiest moment of one op (its inputs, outputs and workspace held)."""

    op: int  # -1: an SGD update after backward, no op of the plan
    step: int  # -1 likewise
    layer: str
    phase: str
    device_bytes: dict  # category -> bytes
    host_bytes: int  # pinned host memory in use (tensors waiting on the host, the staged batch, results)
    live_tensors: int
    counted_bytes: int  # under the trace's count
    working_set_bytes: int  # l_i: what this op itself holds, each tensor once (snlite.liveness.step_tensors)


@record
class ConvChoice:
    step: int
    layer: str
    op: str  # forward, backward_data, backward_filter
    algo: str
    chunk: int
    workspace_bytes: int


@dataclass
class Trace:
    """What one training iteration's program holds, op by op (:func:`trace_program`, what
    :func:`snlite.simulate` returns). Bytes throughout; ``count``: "all" counts every tensor on the
    device, "paper" only activations and gradients, as the paper's figures do.

    ``steps``: one :class:`StepRecord` per op (bytes by category at that op). ``peak_bytes``: the largest
    count, first reached at op ``peak_op`` (an index of ``steps``), of the route's step ``peak_step``;
    ``peak_tensors``: (name, bytes) resident there, largest first. ``l_peak_bytes``: the largest working
    set of one op (what it reads and writes), in the same count: the paper's l_peak under "paper", the
    floor of any plan. ``recompute_count``, ``extra_flops``: forwards run again, and their FLOPs.
    ``d2h_bytes``, ``h2d_bytes``: bytes copied to the host and back. ``cache_hits``, ``cache_misses``: the
    LRU cache's. ``host_peak_bytes``: pinned host memory at its peak (``host_optimizer_bytes`` of it the
    momentum kept there). ``conv_choices``: each conv step's algorithm and workspace.
    ``arena_bytes``: the device pool's size, its high-water mark."""

    count: str = "all"
    steps: list[StepRecord] = field(default_factory=list)
    peak_bytes: int = 0
    peak_step: int = -1
    peak_op: int = -1
    peak_tensors: tuple = ()  # (name, bytes) resident at the peak, largest first
    l_peak_bytes: int = 0
    recompute_count: int = 0
    extra_flops: int = 0
    d2h_bytes: int = 0
    h2d_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    host_peak_bytes: int = 0
    host_optimizer_bytes: int = 0  # optimizer state waiting in the pinned slab (optimizer_state "host")

    conv_choices: list[ConvChoice] = field(default_factory=list)
    arena_bytes: int = 0

    def __repr__(self) -> str:  # one line, not every step (a notebook showed kilobytes of them)
        return (f"Trace(count={self.count!r}, {len(self.steps):,d} steps, peak {self.peak_bytes:,d} bytes at "
                f"{self.peak_at()}, l_peak {self.l_peak_bytes:,d}, moved {self.d2h_bytes:,d} out and "
                f"{self.h2d_bytes:,d} back, {self.recompute_count} recomputed)")

    def peak_at(self) -> str:
        """Where the peak is: "step 12 (conv2)", or "conv2's SGD update after backward"."""
        if not 0 <= self.peak_op < len(self.steps):
            return f"step {self.peak_step} (-)"
        r = self.steps[self.peak_op]
        return f"step {r.step} ({r.layer})" if r.op >= 0 else f"{r.layer}'s SGD update after backward"

    @property
    def op_steps(self) -> list[StepRecord]:
        """The records of the plan's ops: every one but the SGD updates after backward (op -1)."""
        return [r for r in self.steps if r.op >= 0]

    @property
    def ratio(self) -> float:
        """peak / l_peak: the paper's aim is about 1."""
        return self.peak_bytes / self.l_peak_bytes if self.l_peak_bytes else float("nan")

    def summary(self) -> str:
        """Two lines: the peak and l_peak (MiB), then the recomputation, transfers, cache and host."""
        mib = 1 << 20
        return "\n".join([
            f"peak {self.peak_bytes / mib:,.2f} MiB ({self.count} count) at {self.peak_at()}; "
            f"l_peak {self.l_peak_bytes / mib:,.2f} MiB; peak/l_peak {self.ratio:.2f}",
            f"recomputed {self.recompute_count} layer forwards (+{self.extra_flops:,d} FLOPs); "
            f"to host {self.d2h_bytes / mib:,.2f} MiB, back {self.h2d_bytes / mib:,.2f} MiB; "
            f"cache hits {self.cache_hits}, misses {self.cache_misses}; "
            f"host peak {self.host_peak_bytes / mib:,.2f} MiB",
        ])

    def by_kind(self) -> dict[str, tuple[int, int]]:
        """What the peak holds, by kind: ``{kind: (device bytes at the peak, host bytes)}`` for the
        weights (with BatchNorm's buffers), their gradients, the optimizer state (momentum) and the
        rest (the batch, activations, their gradients, workspace and copies in flight). Host bytes are
        the optimizer state waiting in the pinned slab, and for "the rest" whatever else the host
        holds at its own peak (offloaded and evicted tensors, the staged batch)."""
        at = self.steps[self.peak_op].device_bytes if 0 <= self.peak_op < len(self.steps) else {}
        rest = sum(at.get(c, 0) for c in CATEGORIES if c not in PERSISTENT_CATEGORIES)
        return {"weights": (at.get("weights", 0), 0),
                "weight gradients": (at.get("weight_grads", 0), 0),
                "optimizer state": (at.get("optimizer", 0), self.host_optimizer_bytes),
                "activations, gradients, batch, workspace":
                    (rest, self.host_peak_bytes - self.host_optimizer_bytes)}

    def table(self, limit: int | None = None) -> str:
        """One row per op: bytes by category (KiB)."""
        short = {"weights": "wts", "weight_grads": "wgrad", "optimizer": "opt", "input": "input",
                 "activations": "act", "gradients": "grad", "workspace": "wksp", "in_flight": "flight"}
        head = f"{'op':>5} {'step':>5} {'layer':22} {'phase':9}" + \
            "".join(f"{short[c]:>9}" for c in CATEGORIES)
        rows = [head + f"{'host':>9}{'counted':>10}"]
        for r in self.steps[:limit]:
            rows.append(f"{r.op:>5} {r.step:>5} {r.layer[:22]:22} {r.phase:9}"
                        + "".join(f"{r.device_bytes.get(c, 0) // 1024:>9,d}" for c in CATEGORIES)
                        + f"{r.host_bytes // 1024:>9,d}{r.counted_bytes // 1024:>10,d}")
        return "\n".join(rows)


def trace_program(program, count: str = "all") -> Trace:
    """The trace of ``program`` under ``count`` ("all" or "paper"): one :class:`StepRecord` per
    launch (the SGD updates after backward too, as op -1: where the momentum waits on the host each
    fetches its own), taken at its busiest moment (its inputs, outputs and workspace held), the peak and
    what was live there, l_peak, the traffic and the conv choices. Pure: it only reads the program.

    l_peak is the largest working set of one op of the plan (not the SGD updates after backward, whose
    records say theirs): the blocks of the tensors it reads and writes, each
    once (a dx written into dy's buffer is one buffer: :func:`snlite.liveness.step_tensors`), under
    ``count`` (count "all" adds the weights, their gradients, momentum and the op's workspace; count
    "paper" leaves out the batch and the labels). The recompute stage's threshold counts the batch
    (:func:`snlite.recompute.step_bytes`): the paper count's l_peak can be smaller."""
    program = program_of(program)
    with without_cycle_collection():
        return _trace_program(program, count)


class _Memo(dict):
    """A dict that computes a missing value once (``of(key)``): a lookup, not a call, on every hit."""

    def __init__(self, of):
        super().__init__()
        self.of = of

    def __missing__(self, key):
        value = self[key] = self.of(key)
        return value


class _ByName(dict):
    """Tensor name -> what ``about_spec`` says of its spec in ``tensors`` (an incarnation,
    ``relu1#r2``, is its tensor's), worked out on the name's first use."""

    def __init__(self, tensors: dict, about_spec: _Memo):
        super().__init__()
        self.tensors, self.about_spec = tensors, about_spec

    def __missing__(self, name: str):
        value = self[name] = self.about_spec[self.tensors[name.split("#", 1)[0]]]
        return value


_ITEMSIZE = _Memo(lambda dtype: np.dtype(dtype).itemsize)  # dtype name -> bytes per element


class _About(NamedTuple):
    """What the trace needs to know of one tensor (or incarnation), worked out on its first use."""

    kind: str
    category: str
    own: int | None  # the paper's count: its own bytes (None under count "all", and for a workspace)
    in_working_set: bool  # its bytes count in an op's working set (l_i): not persistent, and counted


def _about(cats, spec: tuple) -> _About:
    """What the trace needs to know of a tensor of ``spec`` under the count's categories ``cats``."""
    shape, dtype, kind = spec
    category = KIND_CATEGORY[kind]
    own = None if cats is None or shape is None else math.prod(shape) * _ITEMSIZE[dtype]
    counted_here = cats is None or category in cats
    return _About(kind, category, own, kind not in PERSISTENT_KINDS and counted_here)


def _trace_program(program, count: str) -> Trace:
    reader = _Reader(program, count)
    handlers = {Launch: reader.launch, Alloc: reader.alloc, Free: reader.free, HandOver: reader.hand_over,
                Copy: reader.copy}
    for ins in program.setup:
        handlers[type(ins)](ins)
    reader.body = True
    for ins in program.body:
        handler = handlers.get(type(ins))  # records, waits and host reads hold no memory
        if handler is not None:
            handler(ins)
    return reader.finish()


class _Reader:
    """The device's memory followed instruction by instruction, one handler per kind of instruction
    that holds or moves memory: ``device`` bytes by category, ``held`` bytes by tensor, the pinned
    ``host`` bytes, and a log of the body's allocations to name what was live at the peak."""

    __slots__ = ("count", "tensors", "tr", "cats", "about", "device", "held", "cat_of", "host", "host_state",
                 "resident", "log_tensors", "log_bytes", "peak_log", "body", "counts", "total")

    def __init__(self, program, count: str):
        stats, tensors = program.stats, program.tensors
        self.count, self.tensors = count, tensors
        self.tr = Trace(count=count, arena_bytes=program.arena_bytes,
                        recompute_count=stats.get("recompute_count", 0),
                        extra_flops=stats.get("extra_flops", 0), cache_hits=stats.get("cache_hits", 0),
                        cache_misses=stats.get("cache_misses", 0))
        self.cats = PAPER_CATEGORIES if count == "paper" else None
        # tensor -> what the trace needs to know of it, worked out once per (shape, dtype, kind): deep nets
        # repeat a few of those thousands of times
        self.about = _ByName(tensors, _Memo(functools.partial(_about, self.cats)))  # (not self's: no cycle)
        self.device = dict.fromkeys(CATEGORIES, 0)
        # the categories the count counts, and their bytes now: kept as the bytes move, so that each
        # op's total is a read, not a sum
        self.counts, self.total = frozenset(self.cats or CATEGORIES), 0
        self.held: dict[str, int] = {}  # device tensor -> its bytes (its block's, or its own: paper)
        self.cat_of: dict[str, str] = {}  # device tensor -> the category its bytes count in now
        self.host = self.host_state = self.resident = 0
        # the log of the body's allocations: each tensor and its +bytes / -bytes, in two lists (no pair
        # made per entry: a deep net's body logs hundreds of thousands)
        self.log_tensors: list[str] = []
        self.log_bytes: list[int] = []
        self.peak_log = 0  # how much of the log led up to the peak
        self.body = False

    def launch(self, ins) -> None:
        """An op's busiest moment: its inputs, outputs and workspace held; one StepRecord. The SGD
        step after backward counts too (op and step -1, one record per layer): where the momentum
        waits on the host, each update fetches its own into fresh device blocks."""
        tr, device, held, about = self.tr, self.device, self.held, self.about
        working = 0  # l_i
        for n in step_tensors(ins.reads, ins.writes, ins.inplace):
            if about[n].in_working_set:
                working += held[n]
        if self.count == "all":
            working += device["weights"] + device["weight_grads"] + device["optimizer"]
            working += held[ins.workspace] if ins.workspace else 0
        total = self.total
        tr.steps.append(StepRecord(ins.op, ins.step, ins.layer, ins.phase, dict(device), self.host,
                                   self.resident, total, working))
        if ins.op >= 0:  # l_peak is the route's busiest op; the SGD after backward is no op of it
            tr.l_peak_bytes = max(tr.l_peak_bytes, working)
        if total > tr.peak_bytes:
            tr.peak_bytes, tr.peak_step, tr.peak_op = total, ins.step, len(tr.steps) - 1
            self.peak_log = len(self.log_bytes)
        for op, algo, chunk, nbytes in ins.convs:
            tr.conv_choices.append(ConvChoice(ins.step, ins.layer, op, algo, chunk, nbytes))

    def alloc(self, ins) -> None:
        if ins.space == "slab":
            self.host += ins.nbytes
            self.tr.host_peak_bytes = max(self.tr.host_peak_bytes, self.host)
            if self.about[ins.tensor].kind == "optimizer":
                self.host_state += ins.nbytes
                self.tr.host_optimizer_bytes = max(self.tr.host_optimizer_bytes, self.host_state)
            return
        about = self.about[ins.tensor]
        c = self.cat_of[ins.tensor] = about.category
        n = ins.nbytes if about.own is None else about.own
        self.held[ins.tensor] = n
        self.device[c] += n
        if c in self.counts:
            self.total += n
        self.resident += 1
        if self.body:
            self.log_tensors.append(ins.tensor)
            self.log_bytes.append(n)

    def free(self, ins) -> None:
        if ins.space == "slab":
            self.host -= ins.nbytes
            if self.about[ins.tensor].kind == "optimizer":
                self.host_state -= ins.nbytes
            return
        n, c = self.held.pop(ins.tensor), self.cat_of.pop(ins.tensor)
        self.device[c] -= n
        if c in self.counts:
            self.total -= n
        self.resident -= 1
        self.log_tensors.append(ins.tensor)
        self.log_bytes.append(-n)

    def hand_over(self, ins) -> None:
        n, old = self.held.pop(ins.old), self.cat_of.pop(ins.old)
        self.device[old] -= n
        c = self.cat_of[ins.new] = self.about[ins.new].category
        self.held[ins.new] = n
        self.device[c] += n
        self.total += n * ((c in self.counts) - (old in self.counts))
        self.log_tensors += (ins.old, ins.new)
        self.log_bytes += (-n, n)

    def copy(self, ins) -> None:
        if ins.why in ("input", "result"):  # the batch in, the loss out: not traffic
            return
        if ins.to_host:  # offload, evict, or momentum written back ("state"): in flight until freed
            n, c = self.held[ins.tensor], self.cat_of[ins.tensor]
            self.device[c] -= n
            self.device["in_flight"] += n
            self.total += n * (("in_flight" in self.counts) - (c in self.counts))
            self.cat_of[ins.tensor] = "in_flight"
            self.tr.d2h_bytes += ins.nbytes
        else:  # prefetch, fetch, or momentum read back ("state")
            self.tr.h2d_bytes += ins.nbytes

    def finish(self) -> Trace:
        """The trace, with what was live at the peak, largest first."""
        live: dict[str, int] = {}
        for name, nbytes in zip(self.log_tensors[:self.peak_log], self.log_bytes[:self.peak_log]):
            live[name] = live.get(name, 0) + nbytes
        about, cats = self.about, self.cats
        shown = ((n, b) for n, b in live.items() if b > 0 and (cats is None or about[n].category in cats))
        self.tr.peak_tensors = tuple(sorted(shown, key=lambda p: -p[1]))
        return self.tr
