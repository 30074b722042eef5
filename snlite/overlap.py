"""Copies hidden behind compute: the eager offload schedule moved in time for a GPU (``schedule``).

The paper's schedule (:mod:`snlite.offload`) says *where* in the route each CONV output leaves and comes
back: out after its forward, its block released when the next CONV starts, back when backward reaches
the CONV after it. Whether the compute stream then waits depends on time: a 220 MiB copy takes 4 ms over
PCIe, the three cheap layers after AlexNet's conv1 a fraction of that, so compute stalls at the release.
With ``MemoryConfig(schedule="H200")`` (a GPU of :data:`snlite.timing.PROFILES`) the plan is retimed
against that GPU's estimated timeline (:func:`retime`):

- **release**: at the first op at or after the paper's release point where the copy out has finished
  (the copy stream runs its copies one after another);
- **prefetch**: at the latest op from which the copy back lands before the first op that reads the
  tensor, the copy-in stream's earlier copies included: no earlier (the block would be held for
  nothing), no later (compute would wait);

and kept only if the program's peak does not rise: a retimed transfer whose held window covers the
new peak goes back to the paper's points, and the check repeats. The numbers never change (the same
ops, the same copies, only their positions), which every flag-combination test checks.

With the LRU cache the moves are the placement's own (evictions when an allocation does not fit,
fetches when a read misses); :func:`cache_hints` turns a first placement's moves into hints for a
second one: write-behind (each eviction's copy starts right after the tensor's last use before it)
and read-ahead (each fetch starts as early as its block fits, no earlier than it must to land in time).

Pure: plans, start times and byte counts in, plans and hints out. Whether a retimed plan raises the
peak is asked of a function the caller passes (:mod:`snlite.pipeline` places it).
"""
from __future__ import annotations

import bisect

from snlite.cache import Eviction, Fetch, Hints, ReadAhead
from snlite.offload import Transfer
from snlite.timing import copy_ms

MAX_ROUNDS = 6  # peak checks before giving up on the transfers that still raise it


def retime(plan, start: list[float], nbytes: dict, prof, peak: int, peak_of) -> object:
    """``plan`` with its transfers retimed for the GPU ``prof`` (see the module docstring), given
    each op's estimated ``start`` time (ms; :func:`snlite.timing.op_starts`) and the plan's ``peak``.
    ``peak_of(plan)`` places a candidate and returns ``(peak bytes, the op at the peak)``, or None
    where it does not fit the budget. Returns the plan itself where there is nothing to retime or
    every retiming would raise the peak."""
    moved = _queue_prefetches(_releases(plan, start, nbytes, prof), plan, start, nbytes, prof)
    for _ in range(MAX_ROUNDS):
        if moved == plan.transfers:
            return plan
        candidate = plan.with_transfers(moved)
        found = peak_of(candidate)
        if found is not None and found[0] <= peak:
            return candidate
        at = found[1] if found is not None else None
        reverted = [old if at is None or _holds(new, old, at) else new
                    for new, old in zip(moved, plan.transfers)]
        if reverted == moved:
            return plan
        moved = reverted
    return plan


def cache_hints(evictions: list[Eviction], fetches: list[Fetch], start: list[float], nbytes: dict,
                prof) -> list[Hints]:
    """The hints to try for a second placement, best first: write-behind with read-ahead, then
    write-behind alone (the caller keeps the first that moves no more bytes at no higher peak)."""
    planned: dict[int, list[str]] = {}
    behind: dict[int, list[str]] = {}
    for e in evictions:
        planned.setdefault(e.at, []).append(e.tensor)
        if e.last_use < e.at:
            behind.setdefault(e.last_use, []).append(e.tensor)
    ahead = []
    for f in fetches:
        land = start[f.at] - copy_ms(prof, nbytes[f.tensor.split("#", 1)[0]], to_host=False)
        ahead.append(ReadAhead(max(0, bisect.bisect_right(start, land, hi=f.at) - 1), f.tensor, f.at))
    return [Hints(behind, planned, tuple(sorted(ahead))), Hints(behind, planned, ())]


def _holds(new: Transfer, old: Transfer, op: int) -> bool:
    """Whether the retimed transfer holds its device block at ``op`` where the paper's did not."""
    late_release = old.release_before <= op < new.release_before
    early_prefetch = new.prefetch_before is not None and new.prefetch_before <= op < old.prefetch_before
    return late_release or early_prefetch


def _releases(plan, start, nbytes: dict, prof) -> list[Transfer]:
    """Each release moved to the first op at which the copy out has landed (copies out run one after
    another on copy_out, in forward order), never past the tensor's prefetch."""
    out, free = [], 0.0
    for tr in plan.transfers:
        begin = max(start[tr.offload_after + 1], free)
        free = end = begin + copy_ms(prof, nbytes[tr.tensor], to_host=True)
        limit = tr.prefetch_before if tr.prefetch_before is not None else len(plan.ops)
        release = bisect.bisect_left(start, end, lo=tr.release_before, hi=max(limit - 1, tr.release_before))
        out.append(Transfer(tr.tensor, tr.offload_after, release, tr.prefetch_before))
    return out


def _queue_prefetches(moved, plan, start, nbytes: dict, prof) -> list[Transfer]:
    """Each prefetch at the latest op from which it lands before its first reader, taking the copy-in
    stream's queue into account (planned backwards from the last one needed)."""
    first_read = {}
    for tr in moved:
        if tr.prefetch_before is None:
            continue
        first_read[tr.tensor] = next((p.op.index for p in plan.ops[tr.release_before:]
                                      if tr.tensor in p.op.reads), tr.prefetch_before)
    order = sorted((tr for tr in moved if tr.prefetch_before is not None), key=lambda t: first_read[t.tensor])
    out = {tr.tensor: tr for tr in moved}
    next_begin = float("inf")
    for tr in reversed(order):
        need = first_read[tr.tensor]
        land = min(start[need], next_begin)
        begin = land - copy_ms(prof, nbytes[tr.tensor], to_host=False)
        op = bisect.bisect_right(start, begin, hi=need) - 1  # the latest op starting at or before it
        op = min(max(op, tr.release_before + 1), need)
        next_begin = start[op]
        out[tr.tensor] = Transfer(tr.tensor, tr.offload_after, tr.release_before, op)
    return [out[tr.tensor] for tr in moved]
