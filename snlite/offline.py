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
   first), greedy by breadth (the busiest moment first, its blocks largest first), by area and by
   lifetime, the smallest arena kept;
3. :func:`pack` keeps them where that arena is smaller than the walk's own, and :func:`relocate` writes
   them into the program; nothing else changes.

A deep network has 100,000 blocks, so the greedy's inner loops are compiled for the CPU (Numba, cached
on disk) and look only at what they must: where a block meets few others, a segment tree over the
placed blocks' ends finds those; where most blocks meet most others (nothing evicted), going through
the placed blocks in offset order costs less; and once an order reaches the lower bound, no other is
tried. ``_greedy`` is the same greedy on a list of blocks, for reading and testing.

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
import functools
from dataclasses import dataclass

import numpy as np
from numba import njit

from snlite.program import Alloc, Copy, Free, HandOver, program_of

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
    program = program_of(program)
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
    at the same instruction never overlap: greedy in each order of :func:`orders`, the smallest arena
    kept (the first such order on a tie)."""
    if not blocks:
        return []
    if min(b.nbytes for b in blocks) <= 0:
        raise ValueError("every block takes at least one byte (the pool reserves whole blocks)")
    ranked = sorted(range(len(blocks)), key=lambda k: blocks[k].start)  # in time order from here on
    starts, ends, sizes = _arrays([blocks[k] for k in ranked])
    lower, best = lower_bound(blocks), None
    for order in orders(starts, ends, sizes).values():
        offsets = _placed(starts, ends, sizes, order)
        if best is None or (offsets + sizes).max() < (best + sizes).max():
            best = offsets
        if (best + sizes).max() == lower:  # no order can do better
            break
    offsets = [0] * len(blocks)
    for rank, k in enumerate(ranked):
        offsets[k] = int(best[rank])
    return offsets


def orders(starts, ends, sizes) -> dict:
    """The orders :func:`assign` places blocks in (blocks in time order, as arrays; each order an
    array of block indices), each one that wins somewhere in the zoo: largest first with equal sizes
    in time order (which colours a run of equal blocks as tightly as their overlaps allow); largest
    first with equal sizes longest-lived first (TensorFlow Lite's); by breadth (:func:`_by_breadth`);
    by area, bytes times instructions (a long-lived block placed before the large short ones it would
    otherwise have to sit above); longest-lived first, equal lifetimes largest first. Remaining ties
    in time order."""
    k, lives = np.arange(len(starts)), ends - starts + 1
    return {"size": np.lexsort((k, -sizes)), "size, longest first": np.lexsort((k, -lives, -sizes)),
            "breadth": _by_breadth(starts, ends, sizes), "area": np.lexsort((k, -lives * sizes)),
            "lifetime": np.lexsort((k, -sizes, -lives))}


def _by_breadth(starts, ends, sizes):
    """The busiest moment first (the most bytes live at a block's allocation), each moment's blocks
    largest first: the blocks that decide the peak are placed while the arena is still empty."""
    k = np.arange(len(starts))
    by_end = np.argsort(ends, kind="stable")
    ended = np.concatenate(([0], np.cumsum(sizes[by_end])))[np.searchsorted(ends[by_end], starts)]
    live = np.cumsum(sizes) - ended  # every block begun by each start, less those ended before it
    by_rank = np.lexsort((k, -sizes))  # largest first, then the earliest
    rank = np.empty_like(by_rank)
    rank[by_rank] = k
    return _moments_in_order(starts, ends, rank, by_rank, np.lexsort((k, -live)))


def _arrays(blocks: list[Block]) -> tuple:
    """The blocks' starts, ends and sizes, as three arrays."""
    return tuple(np.array([getattr(b, f) for b in blocks], dtype=np.int64)
                 for f in ("start", "end", "nbytes"))


def _greedy(blocks: list[Block], order: list[int], scan: bool | None = None) -> list[int]:
    """Place ``blocks`` (in time order) in ``order``: each goes into the smallest gap, among the placed
    blocks whose lifetimes meet its own, that holds it (the lowest such gap on a tie), else above them.
    The blocks that meet block k are the earlier ones still live at its start, which a segment tree
    of the placed blocks' ends finds without looking at the others, and the later ones that start
    before its end, a range (starts are sorted); or, where most blocks meet most (``scan``, chosen by
    :func:`_placed` unless given), every placed block, kept in offset order."""
    starts, ends, sizes = _arrays(blocks)
    return _placed(starts, ends, sizes, np.array(order, dtype=np.int64), scan).tolist()


def _placed(starts, ends, sizes, order, scan: bool | None = None):
    """:func:`_greedy` on arrays: the offsets of the blocks (in time order) placed in ``order``. Going
    through every placed block costs about n * n / 2 cheap steps; finding the ones a block meets costs
    about 16 times as much per block met (a tree walk, then a sort): the cheaper is taken."""
    n = len(starts)
    last = np.searchsorted(starts, ends, side="right")  # blocks k + 1 .. last[k] - 1 start while k lives
    met = (last - np.arange(n) - 1).sum() * 2  # every pair of blocks that meet, counted from both ends
    return _place_in_order(starts, ends, sizes, last, order, 16 * met > n * n / 2 if scan is None else scan)


# The greedy's inner loops, compiled for the CPU and cached on disk beside this file: in NumPy every
# block costs a dozen calls (tens of microseconds), and a deep ResNet has 100,000 blocks, placed five
# times.
compiled = functools.partial(njit, cache=True)


@compiled
def _tree(values):
    """A max segment tree over ``values`` (leaves from index ``size``): any range's largest value in
    O(log n), so a query can skip whole ranges of blocks that cannot meet its own."""
    size = 1
    while size < len(values):
        size *= 2
    tree = np.full(2 * size, -1, dtype=np.int64)
    for i in range(len(values)):
        tree[size + i] = values[i]
    for node in range(size - 1, 0, -1):
        tree[node] = _larger(tree[2 * node], tree[2 * node + 1])
    return tree


@compiled
def _larger(a, b):
    return a if a > b else b  # not the builtin max, whose generic version takes seconds to compile


@compiled
def _set(tree, i, value):
    """Leaf ``i`` of ``tree`` set to ``value``, its ancestors' maxima updated."""
    node = len(tree) // 2 + i
    tree[node] = value
    while node > 1:
        node //= 2
        tree[node] = _larger(tree[2 * node], tree[2 * node + 1])


@compiled
def _report(tree, lo, hi, least, out):
    """Into ``out``, every leaf index in [lo, hi) whose value is at least ``least``; their count. A
    walk down from the root that enters only the ranges whose maximum reaches ``least``."""
    size, count = len(tree) // 2, 0
    stack = np.empty((2 * 64, 3), dtype=np.int64)  # node, and the leaves [first, end) it covers
    stack[0, 0], stack[0, 1], stack[0, 2] = 1, 0, size
    depth = 1
    while depth:
        depth -= 1
        node, first, end = stack[depth, 0], stack[depth, 1], stack[depth, 2]
        if end <= lo or first >= hi or tree[node] < least:
            continue
        if node >= size:
            out[count] = node - size
            count += 1
            continue
        middle = (first + end) // 2
        stack[depth, 0], stack[depth, 1], stack[depth, 2] = 2 * node + 1, middle, end
        stack[depth + 1, 0], stack[depth + 1, 1], stack[depth + 1, 2] = 2 * node, first, middle
        depth += 2
    return count


@compiled
def _place_in_order(starts, ends, sizes, last, order, scan):
    """Each block in ``order`` into the smallest gap, among the placed blocks whose lifetimes meet its
    own, that holds it (the lowest such gap on a tie), else above them all (see :func:`_greedy`).
    With ``scan``, by going through every placed block in offset order (where most meet most, that
    costs less than finding the ones that meet and sorting them by offset); else by finding them."""
    n = len(starts)
    placed = _tree(np.full(n, -1, dtype=np.int64))  # a placed block's end; -1 while unplaced
    offsets = np.full(n, -1, dtype=np.int64)
    # with scan, the placed blocks lowest offset first: their offsets, ends in bytes, starts and ends
    # in instructions, side by side so that going through them reads memory in order
    low, top = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    first, final = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    met = np.empty(n, dtype=np.int64)
    for done in range(n):
        k = order[done]
        if scan:
            offsets[k] = _lowest_gap(low[:done], top[:done], first[:done], final[:done], k, starts, ends,
                                     sizes)
            _insert(low, top, first, final, done, k, offsets, starts, ends, sizes)
            continue
        count = _report(placed, 0, k, starts[k], met)  # earlier, still live at k's start
        for j in range(k + 1, last[k]):                # later, starting while k lives
            if offsets[j] >= 0:
                met[count] = j
                count += 1
        near = met[:count][np.argsort(offsets[met[:count]])]
        offsets[k] = _lowest_gap(offsets[near], offsets[near] + sizes[near], starts[near], ends[near], k,
                                 starts, ends, sizes)
        _set(placed, k, ends[k])
    return offsets


@compiled
def _insert(low, top, first, final, count, k, offsets, starts, ends, sizes):
    """Block k into the first ``count`` rows of the placed blocks' columns (in offset order), after
    those at its offset or lower."""
    lo, hi = 0, count
    while lo < hi:
        middle = (lo + hi) // 2
        if low[middle] <= offsets[k]:
            lo = middle + 1
        else:
            hi = middle
    for i in range(count, lo, -1):
        low[i], top[i], first[i], final[i] = low[i - 1], top[i - 1], first[i - 1], final[i - 1]
    low[lo], top[lo], first[lo], final[lo] = offsets[k], offsets[k] + sizes[k], starts[k], ends[k]


@compiled
def _lowest_gap(low, top, first, final, k, starts, ends, sizes):
    """Where block k goes among the placed blocks whose offsets are ``low`` (in order, ending at
    ``top``) and lifetimes ``first`` to ``final`` (those that do not meet k's are passed over): into
    the smallest gap below one of them that holds it (the lowest on a tie), else above them all. The
    gap below a block runs from the highest end of the blocks before it (sizes are positive, so of
    blocks at one offset only the first can have room below)."""
    floor, best, offset = 0, -1, 0
    for i in range(len(low)):
        if first[i] > ends[k] or final[i] < starts[k]:
            continue
        gap = low[i] - floor
        if gap == sizes[k]:
            return floor  # an exact fit: no gap is smaller, and this is the lowest such
        if gap > sizes[k] and (best < 0 or gap < best):
            best, offset = gap, floor
        floor = _larger(floor, top[i])
    return offset if best >= 0 else floor


@compiled
def _moments_in_order(starts, ends, rank, by_rank, busiest):
    """The blocks in :func:`_by_breadth`'s order: for each block of ``busiest`` in turn, the blocks
    live at its start not yet taken (the earlier ones still live, and itself) in ``rank`` order
    (``by_rank[r]`` is the block of rank ``r``)."""
    unseen = _tree(ends)  # a block's end until it is taken, then -1
    order = np.empty(len(starts), dtype=np.int64)
    here = np.empty(len(starts), dtype=np.int64)
    taken = 0
    for k in busiest:
        count = _report(unseen, 0, k + 1, starts[k], here)
        for r in np.sort(rank[here[:count]]):
            order[taken] = by_rank[r]
            taken += 1
            _set(unseen, by_rank[r], -1)
    return order


@dataclass(frozen=True)
class Packing:
    """What :func:`pack` chose for a program: the smaller ``arena`` it reaches (the walk's own where
    that is as small; then ``offsets`` is None), the ``lower`` bound no placement beats (both with the
    persistent tensors), and each body block's new offset with the block each instruction names."""

    arena: int
    lower: int
    which: list
    offsets: list | None = None


def pack(program) -> Packing:
    """The offsets :func:`assign` chooses for ``program``'s body blocks (above the persistent
    tensors) where that arena is smaller than the walk's own; :func:`relocate` writes them."""
    blocks, which, base = lifetimes(program)
    lower = base + lower_bound(blocks)
    if program.arena_bytes <= lower:  # the walk's own placement is already the best
        return Packing(program.arena_bytes, lower, which)
    offsets = assign(blocks)
    arena = base + arena_of(blocks, offsets)
    if arena >= program.arena_bytes:  # the walk's own placement is as good
        return Packing(program.arena_bytes, lower, which)
    return Packing(arena, lower, which, [base + o for o in offsets])


def relocate(program, packing: Packing):
    """``program`` with its body's arena blocks where :func:`pack` put them; nothing else changes."""
    return program if packing.offsets is None else with_offsets(program, packing.which, packing.offsets)


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
