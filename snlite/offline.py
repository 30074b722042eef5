"""Offline placement (``fit="offline"``): every arena offset chosen after the walk, knowing every lifetime.

The paper's pool decides each offset online, when the allocation happens, without knowing the future;
first fit then leaves holes that the next large tensor cannot use (fragmentation). snlite writes the
whole program before anything runs, so it knows when each block is taken and given back, and can do
what compilers that plan memory ahead do (TensorFlow Lite's arena planner, XLA's heap simulator):

1. :func:`lifetimes` reads the program: each body allocation of the arena is a :class:`Block` that lives
   from its ``Alloc`` to its ``Free`` (an in-place ``HandOver`` passes the block on, it does not end it);
2. :func:`assign` gives each block an offset such that two blocks whose lifetimes meet never share a
   byte. It is one pure function, lifetimes in, offsets out: greedy by size (largest block first, each
   into the tightest gap that fits among the blocks it meets; equal sizes in time order, or longest
   first) and greedy by breadth (the busiest moment first, its blocks largest first), the smallest
   arena kept;
3. :func:`relocate` writes the offsets back into the program; nothing else changes.

Why reuse is safe across streams: the walk emits a block's ``Free`` only after compute has waited for
any copy still reading it (:meth:`snlite.copies.Emitter.release`), and every later user of the bytes
(a kernel, a copy in after a ``reuse`` wait, a copy out after a ``ready`` wait) is ordered after that
point in the program. A lifetime that runs to the ``Free`` therefore ends exactly where the online pool
would have allowed reuse, and the race checker proves each program again.

The weights, their gradients and momentum live all iteration: they stay where the walk packed them,
end to end from offset 0, and the body's blocks are placed above them. :func:`lower_bound` is the most
reserved bytes live at once, which no placement can beat; arena minus lower bound is the fragmentation.
"""
from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass

import numpy as np

from snlite.program import Alloc, Copy, Free, HandOver

ARENA = "arena"


@dataclass(frozen=True)
class Block:
    """One body allocation of the arena: reserved ``nbytes``, live from instruction ``start`` (its
    ``Alloc``) to instruction ``end`` (its ``Free``), both inclusive."""

    start: int
    end: int
    nbytes: int


def lifetimes(program) -> tuple[list[Block], list[int | None], int]:
    """The body's arena blocks in order of allocation; for each body instruction the block whose offset
    it names (None where it names no arena offset); and the persistent bytes at the arena's start."""
    base = max((a.offset + a.nbytes for a in program.setup if isinstance(a, Alloc) and a.space == ARENA),
               default=0)
    starts, sizes, ends, owner, which = [], [], {}, {}, []
    for i, ins in enumerate(program.body):
        k = None
        if isinstance(ins, Alloc) and ins.space == ARENA:
            k = owner[ins.tensor] = len(starts)
            starts.append(i)
            sizes.append(ins.nbytes)
        elif isinstance(ins, HandOver) and ins.old in owner:
            owner[ins.new] = owner.pop(ins.old)
        elif isinstance(ins, Free) and ins.space == ARENA:
            k = owner.pop(ins.tensor)
            ends[k] = i
        elif isinstance(ins, Copy) and ARENA in (ins.src, ins.dst):
            k = owner[ins.tensor]
        which.append(k)
    last = len(program.body)  # a block never freed in the body lives to the iteration's end
    return [Block(s, ends.get(k, last), n) for k, (s, n) in enumerate(zip(starts, sizes))], which, base


def lower_bound(blocks: list[Block]) -> int:
    """The most reserved bytes live at once: no placement of these blocks needs less."""
    events = sorted([(b.start, b.nbytes) for b in blocks] + [(b.end + 1, -b.nbytes) for b in blocks],
                    key=lambda e: (e[0], e[1]))  # at one instant, a block ends before the next begins
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    return best


def bounds(program) -> tuple[int, int]:
    """``(arena, lower bound)`` of a program: the arena it asks for, and the most reserved bytes live
    at once in it (the persistent tensors included); their gap is the placement's fragmentation."""
    blocks, _, base = lifetimes(program)
    return program.arena_bytes, base + lower_bound(blocks)


def arena_of(blocks: list[Block], offsets: list[int]) -> int:
    """The bytes the blocks at ``offsets`` span: the highest end offset."""
    return max((o + b.nbytes for o, b in zip(offsets, blocks)), default=0)


def assign(blocks: list[Block]) -> list[int]:
    """Offsets for ``blocks`` (multiples of 1 KiB, as the blocks' sizes are) such that two blocks live
    at the same instruction never overlap. Greedy in three orders, the smallest arena kept: by size
    with equal sizes in time order (which colours a run of equal blocks as tightly as their overlaps
    allow), by size with equal sizes longest-lived first (TensorFlow Lite's), and by breadth."""
    if not blocks:
        return []
    ranked = sorted(range(len(blocks)), key=lambda k: blocks[k].start)  # in time order from here on
    timed = [blocks[k] for k in ranked]
    tries = [_greedy(timed, order) for order in (
        _by_size(timed, "start"), _by_size(timed, "longest"), _by_breadth(timed))]
    best = min(tries, key=lambda offsets: arena_of(timed, offsets))
    offsets = [0] * len(blocks)
    for rank, k in enumerate(ranked):
        offsets[k] = best[rank]
    return offsets


def _by_size(blocks: list[Block], ties: str) -> list[int]:
    """Largest first; among equal sizes the earliest first (``ties="start"``) or the longest-lived
    first, then the earliest (``"longest"``)."""
    if ties == "start":
        return sorted(range(len(blocks)), key=lambda k: (-blocks[k].nbytes, blocks[k].start))
    return sorted(range(len(blocks)),
                  key=lambda k: (-blocks[k].nbytes, blocks[k].start - blocks[k].end, blocks[k].start))


def _by_breadth(blocks: list[Block]) -> list[int]:
    """The busiest moment first (the most bytes live at a block's allocation), each moment's blocks
    largest first: the blocks that decide the peak are placed while the arena is still empty.
    ``blocks`` in time order."""
    starts, ends, sizes = _arrays(blocks)
    live, total, gone = [], 0, []  # the bytes live at each block's start: one sweep, a heap of ends
    for k, b in enumerate(blocks):
        while gone and gone[0][0] < b.start:
            total -= heapq.heappop(gone)[1]
        total += b.nbytes
        live.append(total)
        heapq.heappush(gone, (b.end, b.nbytes))
    order, seen = [], np.zeros(len(blocks), bool)
    for k in sorted(range(len(blocks)), key=lambda k: (-live[k], k)):
        here = np.flatnonzero((ends[:k + 1] >= starts[k]) & ~seen[:k + 1])
        seen[here] = True
        order.extend(sorted(here.tolist(), key=lambda j: (-blocks[j].nbytes, j)))
    return order


def _arrays(blocks: list[Block]) -> tuple:
    """The blocks' starts, ends and sizes, as three arrays."""
    return tuple(np.array([getattr(b, f) for b in blocks], dtype=np.int64)
                 for f in ("start", "end", "nbytes"))


def _greedy(blocks: list[Block], order: list[int]) -> list[int]:
    """Place ``blocks`` (in time order) in ``order``: each goes into the smallest gap, among the placed
    blocks whose lifetimes meet its own, that holds it (the lowest such gap on a tie), else above them.
    In NumPy, one block at a time: those that meet it are the earlier ones still live at its start
    and the later ones that start before its end (a slice, starts being sorted); the placed ones
    sorted by offset, the floor below each (the highest top before it), the gaps, the smallest that
    fits."""
    starts, ends, sizes = _arrays(blocks)
    last = np.searchsorted(starts, ends, side="right")  # blocks [k + 1, last[k]) start while k lives
    offsets = np.full(len(blocks), -1, dtype=np.int64)
    never = np.iinfo(np.int64).max
    for k in order:
        nb = np.concatenate((np.flatnonzero(ends[:k] >= starts[k]), np.arange(k + 1, last[k])))
        nb = nb[offsets[nb] >= 0]
        if not len(nb):
            offsets[k] = 0
            continue
        lows, tops = offsets[nb], offsets[nb] + sizes[nb]
        by = np.lexsort((tops, lows))
        lows, tops = lows[by], tops[by]
        floors = np.concatenate(([0], np.maximum.accumulate(tops)[:-1]))
        gaps = np.where(lows - floors >= sizes[k], lows - floors, never)
        best = int(np.argmin(gaps))
        offsets[k] = floors[best] if gaps[best] != never else max(floors[-1], tops[-1])
    return offsets.tolist()


def relocate(program):
    """``program`` with its body's arena blocks at the offsets :func:`assign` chooses (above the
    persistent tensors), where that arena is smaller than the walk's own; nothing else changes."""
    blocks, which, base = lifetimes(program)
    if program.arena_bytes <= base + lower_bound(blocks):  # the walk's own placement is already the best
        return program
    offsets = assign(blocks)
    if base + arena_of(blocks, offsets) >= program.arena_bytes:  # the walk's own placement is as good
        return program
    return with_offsets(program, which, [base + o for o in offsets])


def with_offsets(program, which: list[int | None], offsets: list[int]):
    """``program`` with each body instruction that names block ``k`` moved to ``offsets[k]``, and its
    arena the highest end offset reached (the persistent tensors' included)."""
    body = list(program.body)
    for i, k in enumerate(which):
        if k is None:
            continue
        ins = body[i]
        if isinstance(ins, Copy):
            moved = ({"src_offset": offsets[k]} if ins.src == ARENA else {"dst_offset": offsets[k]})
            body[i] = dataclasses.replace(ins, **moved)
        else:
            body[i] = dataclasses.replace(ins, offset=offsets[k])
    setup_top = max((a.offset + a.nbytes for a in program.setup if isinstance(a, Alloc) and a.space == ARENA),
                    default=0)
    tops = [ins.offset + ins.nbytes for ins in body if isinstance(ins, Alloc) and ins.space == ARENA]
    return dataclasses.replace(program, body=tuple(body), arena_bytes=max([setup_top, *tops]))
