"""The race checker: proves, without a GPU, that a program's streams cannot race.

CUDA orders work by these rules only (see :mod:`snlite.program`): one stream runs in order; a
``Wait`` orders later work on its stream after the ``Record`` it names; ``HostWait`` orders the CPU
after it; everything the CPU enqueues starts after what the CPU did before. Two accesses to
overlapping bytes, at least one a write, that no chain of those rules orders, are a **race**: on a
GPU either may run first, and the simulator (which runs streams one at a time, in order) never shows
it. Freeing a block is a write (the next tenant may overwrite it), as is a raw allocation's NaN fill.

:func:`find_races` gives every instruction a vector clock (one counter per stream, joined at each
wait) and every byte range of the arena, the slab and each raw buffer its last writer and latest
reader per stream; one pass, linear in the program. :func:`races_by_definition` checks the same
definition the slow, obvious way (explicit happens-before graph, every pair), for the tests.
The program is checked over two consecutive iterations, so work left running at the end of one
iteration is checked against the next.

    check(program)                  # raises RaceError (every race, explained) or ProgramError
    for race in find_races(program.without(41)):
        print(race)                 # the two instructions, the tensor, the wait that is missing

A :class:`ProgramError` is a placement bug rather than a race: two live tensors overlap, an op
touches a freed tensor, a wait names an event never recorded, or a number of the program contradicts
the rest of it (:mod:`snlite.validate`, run first: the search trusts no size or offset it has not checked).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from snlite.dataflow import DataflowError, check_dataflow
from snlite.program import (HOST, STREAMS, Alloc, Copy, Free, HandOver, HostRead, HostWait, HostWrite,
                            Launch, Record, Wait, stream_of, without_cycle_collection)
from snlite.records import record
from snlite.validate import ProgramError, validate

ALL_STREAMS = (*STREAMS, HOST)


class RaceError(AssertionError):
    """Races were found; ``races`` lists them, the message explains each."""

    def __init__(self, races: list, program):
        self.races = races
        shown = "\n\n".join(r.explain(program) for r in races[:5])
        more = f"\n\n... and {len(races) - 5} more" if len(races) > 5 else ""
        super().__init__(f"{len(races)} race(s) in {program.net}'s program "
                         f"({program.config}, {program.mode}):\n\n{shown}{more}")


@record
class Access:
    """One instruction touching one byte range: ``at`` = (iteration, body index)."""

    at: tuple
    stream: str
    tick: int  # the stream's own counter at this instruction
    tensor: str
    write: bool
    free: bool = False  # a Free: the block may be reused from here (not a read or write of its bytes)


@dataclass(frozen=True)
class Race:
    """Two unordered accesses to overlapping bytes, at least one a write."""

    first: Access
    second: Access
    space: str
    lo: int
    hi: int

    @property
    def on_data(self) -> bool:
        """Both accesses touch the bytes (no Free among them): a wrong number on some GPU, not only a
        block released too early (which breaks as soon as anything reuses it sooner)."""
        return not (self.first.free or self.second.free)

    @property
    def kind(self) -> str:
        a, b = self.first, self.second
        if b.free:
            return f"freed while another stream may still {'write' if a.write else 'read'} it"
        if a.free:
            return f"{'written' if b.write else 'read'} by its next user before the free is ordered"
        if a.write:
            return "write after write" if b.write else "read after write"
        return "write after read"

    def explain(self, program) -> str:
        def show(acc):
            it, i = acc.at
            return f"#{i} {program.body[i]} (on {acc.stream}" + (f", iteration {it + 1})" if it else ")")

        a, b = self.first, self.second
        same = a.tensor == b.tensor
        what = f"{a.tensor}" if same else f"{a.tensor} and {b.tensor} (the same bytes, reused)"
        return (f"race on {what}, {self.space} bytes [{self.lo:#x}, {self.hi:#x}): {self.kind}\n"
                f"  first:  {show(a)}\n  second: {show(b)}\n"
                f"  nothing orders the second after the first: record an event on {a.stream} after the first "
                f"and make {b.stream} wait for it before the second")

    def __str__(self) -> str:
        return (f"{self.kind} on {self.first.tensor} / {self.second.tensor} "
                f"({self.space} [{self.lo:#x}, {self.hi:#x})): "
                f"#{self.first.at[1]} on {self.first.stream} vs #{self.second.at[1]} on {self.second.stream}")


def check(program, iterations: int = 2, *, graph=None) -> None:
    """Raise :class:`RaceError` if the program can race, :class:`ProgramError` if it is malformed (a
    number that contradicts the rest of it, or ``graph``, the net it was planned for, when given:
    :mod:`snlite.validate`) or reads a value it never wrote (:mod:`snlite.dataflow`, checked once no
    race is left)."""
    races = find_races(program, iterations, graph=graph)
    if races:
        raise RaceError(races, program)
    try:
        check_dataflow(program, iterations)
    except DataflowError as e:
        raise ProgramError(str(e)) from None


# ---------------------------------------------------------------------------- where each tensor is
class _Memory:
    """Live allocations per space (to resolve names to byte ranges and catch overlaps and use after free)."""

    def __init__(self):
        self.where: dict[tuple, tuple] = {}  # (space, tensor) -> (space key, lo, hi)
        self.sorted: dict[str, list] = {}  # space key -> sorted [(lo, hi, tensor)]

    def alloc(self, space_key: str, tensor: str, lo: int, hi: int, at) -> None:
        key = (_kind(space_key), tensor)
        held = self.where.get(key)
        if held is not None:  # (validate refuses it within an iteration; a body that never frees it, twice)
            raise ProgramError(f"instruction {at}: allocates {tensor} again while it is still live at "
                               f"{held[0]} [{held[1]:#x}, {held[2]:#x}): a Free is missing before it")
        spans = self.sorted.setdefault(space_key, [])
        k = bisect.bisect_left(spans, (lo,))
        for other in spans[max(k - 1, 0):k + 1]:
            if other[0] < hi and lo < other[1]:
                raise ProgramError(f"instruction {at}: {tensor} at {space_key} [{lo:#x}, {hi:#x}) overlaps "
                                   f"{other[2]}, which is still live at [{other[0]:#x}, {other[1]:#x})")
        spans.insert(k, (lo, hi, tensor))
        self.where[key] = (space_key, lo, hi)

    def free(self, space: str, tensor: str, at) -> tuple:
        loc = self.where.pop((space, tensor), None)
        if loc is None:
            raise ProgramError(f"instruction {at}: frees {tensor} in the {space}, where it is not allocated")
        spans = self.sorted[loc[0]]
        del spans[bisect.bisect_left(spans, (loc[1], loc[2], tensor))]
        return loc

    def rename(self, new: str, old: str, at) -> None:
        for space in ("arena", "raw"):
            loc = self.where.pop((space, old), None)
            if loc is not None:
                spans = self.sorted[loc[0]]
                spans[bisect.bisect_left(spans, (loc[1], loc[2], old))] = (loc[1], loc[2], new)
                self.where[space, new] = loc
                return
        raise ProgramError(f"instruction {at}: {new} takes over the block of {old}, which holds none")

    def device(self, tensor: str, at) -> tuple:
        loc = self.where.get(("arena", tensor)) or self.where.get(("raw", tensor))
        if loc is None:
            raise ProgramError(f"instruction {at}: touches {tensor}, which holds no device memory there "
                               f"(never allocated, or already freed)")
        return loc

    def inside(self, space: str, offset: int, nbytes: int, tensor: str, at) -> tuple:
        """The range a copy touches; it must lie inside one live allocation of ``space``."""
        if space == "raw":
            key = f"raw#{offset}"
            spans = self.sorted.get(key)
            if not spans:
                raise ProgramError(f"instruction {at}: copies {tensor} to or from raw buffer #{offset}, "
                                   "which is not live")
            return key, 0, nbytes
        spans = self.sorted.get(space, [])
        k = bisect.bisect_right(spans, (offset, float("inf"))) - 1
        if k < 0 or not (spans[k][0] <= offset and offset + nbytes <= spans[k][1]):
            raise ProgramError(f"instruction {at}: copies {tensor} at {space} "
                               f"[{offset:#x}, {offset + nbytes:#x}), "
                               f"which is not inside a live allocation")
        return space, offset, offset + nbytes


def _kind(space_key: str) -> str:
    return "raw" if space_key.startswith("raw#") else space_key


def _accesses(ins, mem: _Memory, at) -> list:
    """(space key, lo, hi, tensor, write) for every byte range ``ins`` touches."""
    t = type(ins)
    if t is Launch:
        inplace = dict(ins.inplace)
        out = [(*mem.device(n, at), n, False) for n in ins.reads]
        out += [(*mem.device(inplace.get(n, n), at), n, True) for n in ins.writes]
        if ins.workspace:
            out.append((*mem.device(ins.workspace, at), ins.workspace, True))
        return out
    if t is Copy:
        src = mem.inside(ins.src, ins.src_offset, ins.nbytes, ins.tensor, at)
        dst = mem.inside(ins.dst, ins.dst_offset, ins.nbytes, ins.tensor, at)
        return [(*src, ins.tensor, False), (*dst, ins.tensor, True)]
    if t is HostWrite or t is HostRead:
        return [(*mem.inside("slab", ins.offset, ins.nbytes, ins.tensor, at), ins.tensor, t is HostWrite)]
    return []


# ---------------------------------------------------------------------------- the fast checker
class _Ranges:
    """One space's byte ranges: sorted boundaries; each segment keeps its last writer, its latest
    reader on each stream (later reads on a stream are ordered after earlier ones) and its latest
    free. A free is checked as a write but keeps the history: the next tenant's accesses are still
    checked against the old tenant's (a free run early often hides a real overwrite behind it)."""

    def __init__(self):
        self.starts = [0]
        self.segs = [(None, {}, None)]  # (last write, {stream: latest read}, latest free)

    def _split(self, x: int) -> int:
        k = bisect.bisect_right(self.starts, x) - 1
        if self.starts[k] == x:
            return k
        last, reads, free = self.segs[k]
        self.starts.insert(k + 1, x)
        self.segs.insert(k + 1, (last, dict(reads), free))
        return k + 1

    def access(self, lo: int, hi: int, acc: Access, vc: list, index: dict, space: str, races: list) -> None:
        a, b = self._split(lo), self._split(hi)
        seen = set()
        for k in range(a, b):
            last, reads, free = self.segs[k]
            earlier = [e for e in (last, free) if e is not None]
            if acc.write:
                earlier += reads.values()
            for e in earlier:
                if e.stream != acc.stream and vc[index[e.stream]] < e.tick and (e.at, acc.at) not in seen:
                    seen.add((e.at, acc.at))
                    races.append(Race(e, acc, space, max(lo, self.starts[k]), min(hi, self.starts[k + 1])))
            if acc.free:
                self.segs[k] = (last, reads, acc)
            elif not acc.write:
                reads[acc.stream] = acc
        if acc.write and not acc.free:  # one segment now: everything in it was last written here
            del self.starts[a + 1:b]
            self.segs[a:b] = [(acc, {}, None)]


def find_races(program, iterations: int = 2, *, graph=None) -> list[Race]:
    """Every race of ``program`` run ``iterations`` times in a row (see the module docstring), once
    :func:`snlite.validate.validate` has found its numbers consistent (with ``graph``: with the net's)."""
    with without_cycle_collection():
        validate(program, graph)
        return _find_races(program, iterations)


def _find_races(program, iterations: int) -> list[Race]:
    index = {s: i for i, s in enumerate(ALL_STREAMS)}
    clocks = {s: [0] * len(ALL_STREAMS) for s in ALL_STREAMS}
    events: dict[str, list] = {}
    mem = _Memory()
    ranges: dict[str, _Ranges] = {}
    races: list[Race] = []
    for ins in program.setup:
        _bookkeeping(ins, mem, ("setup", 0), ranges)
    for it in range(iterations):
        for i, ins in enumerate(program.body):
            at = (it, i)
            s = stream_of(ins)
            if s is None:
                _bookkeeping(ins, mem, at, ranges)
                continue
            vc = clocks[s]
            if s != HOST:  # the CPU enqueued it after everything the CPU did before
                _join(vc, clocks[HOST])
            vc[index[s]] += 1
            t = type(ins)
            if t is Record:
                events[f"{ins.event}@{it}"] = list(vc)
                continue
            if t is Wait or t is HostWait:
                mark = events.get(f"{ins.event}@{it}")
                if mark is None:
                    raise ProgramError(f"instruction {at}: waits for {ins.event}, which was not "
                                       "recorded before it")
                _join(clocks[HOST] if t is HostWait else vc, mark)
                continue
            if t is Alloc:  # a raw allocation: its NaN fill writes the new buffer on its stream
                key = _bookkeeping(ins, mem, at, ranges)
                acc = Access(at, s, vc[index[s]], ins.tensor, True)
                ranges[key].access(0, ins.nbytes, acc, vc, index, key, races)
                continue
            if t is Free:
                key, lo, hi = mem.free(ins.space, ins.tensor, at)
                acc = Access(at, s, vc[index[s]], ins.tensor, True, free=True)  # the block is reusable now
                ranges.setdefault(key, _Ranges()).access(lo, hi, acc, vc, index, key, races)
                continue
            for key, lo, hi, tensor, write in _accesses(ins, mem, at):
                acc = Access(at, s, vc[index[s]], tensor, write)
                ranges.setdefault(key, _Ranges()).access(lo, hi, acc, vc, index, key, races)
    return races


def _join(into: list, other: list) -> None:
    for k, v in enumerate(other):
        if v > into[k]:
            into[k] = v


def _bookkeeping(ins, mem: _Memory, at, ranges) -> str | None:
    """Allocations and hand-overs: where tensors are (no bytes are touched, except a raw fill)."""
    t = type(ins)
    if t is Alloc:
        key = f"raw#{ins.offset}" if ins.space == "raw" else ins.space
        if ins.space == "raw":
            ranges[key] = _Ranges()
        mem.alloc(key, ins.tensor, 0 if ins.space == "raw" else ins.offset,
                  ins.nbytes if ins.space == "raw" else ins.offset + ins.nbytes, at)
        return key
    if t is HandOver:
        mem.rename(ins.new, ins.old, at)
    return None


# ---------------------------------------------------------------------------- the definition, slowly
def races_by_definition(program, iterations: int = 2) -> list[tuple]:
    """The same races as :func:`find_races`, as ``((iteration, index), (iteration, index))`` pairs,
    computed from the definition: build the happens-before graph explicitly (program order per
    stream, record -> wait, host -> everything enqueued after), take its transitive closure, and test
    every pair of conflicting accesses. Quadratic: for checking the checker on small programs."""
    validate(program)
    nodes, pred = [], []  # per instruction: (at, stream, accesses); bitset of instructions ordered before it
    last = {}  # stream -> its latest node
    recorded = {}
    mem = _Memory()
    ranges: dict[str, _Ranges] = {}
    for ins in program.setup:
        _bookkeeping(ins, mem, ("setup", 0), ranges)
    for it in range(iterations):
        for i, ins in enumerate(program.body):
            at, s = (it, i), stream_of(ins)
            if s is None:
                _bookkeeping(ins, mem, at, ranges)
                continue
            before = 0
            for src in {s, HOST}:
                if src in last:
                    n = last[src]
                    before |= pred[n] | (1 << n)
            t = type(ins)
            acc = []
            if t is Wait or t is HostWait:
                n = recorded.get(f"{ins.event}@{it}")
                if n is None:
                    raise ProgramError(f"instruction {at}: waits for {ins.event}, which was not "
                                       "recorded before it")
                before |= pred[n] | (1 << n)
            elif t is Alloc:
                key = _bookkeeping(ins, mem, at, ranges)
                acc = [(key, 0, ins.nbytes, ins.tensor, True)]
            elif t is Free:
                key, lo, hi = mem.free(ins.space, ins.tensor, at)
                acc = [(key, lo, hi, ins.tensor, True)]
            else:
                acc = _accesses(ins, mem, at)
            node = len(nodes)
            nodes.append((at, s if t is not HostWait else HOST, acc))
            pred.append(before)
            last[HOST if t is HostWait else s] = node
            if t is Record:
                recorded[f"{ins.event}@{it}"] = node
    out = []
    for b, (at_b, _, acc_b) in enumerate(nodes):
        for a in range(b):
            if pred[b] >> a & 1:
                continue
            at_a, _, acc_a = nodes[a]
            if any(x[0] == y[0] and x[1] < y[2] and y[1] < x[2] and (x[4] or y[4])
                   for x in acc_a for y in acc_b):
                out.append((at_a, at_b))
    return out


__all__ = ["Access", "ProgramError", "Race", "RaceError", "check", "find_races", "races_by_definition"]
