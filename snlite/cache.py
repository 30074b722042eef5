"""The LRU tensor cache of the Unified Tensor Pool (docs/paper.md section 4, Algorithm 2).

Tensors stay on the device until an allocation fails; then unlocked tensors leave from the least
recently used end until the request fits. A lookup that finds its tensor on the device is a hit;
one that finds it on the host is a miss (the tensor is fetched back). The runtime locks the
tensors the current step depends on, and decides what a move costs; this class only keeps the
order: two queues, so that with offload on the CONV outputs are evicted first (the paper offloads
only them eagerly), and so that every operation is O(1) however many tensors are cached.

Which unlocked tensor leaves is ``MemoryConfig.evict`` (:func:`victim_rank`): the least recently used
(the paper's), the largest, or the one whose next use is furthest away (Belady's rule, known here
because the plan is fixed before anything runs).

The cache's moves are records (:class:`Eviction`, :class:`Fetch`): the placement pass lists them, and
:mod:`snlite.overlap` turns them into :class:`Hints` for a second, time-aware placement.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from snlite.tensor import State


class Eviction(NamedTuple):
    """The cache moved ``tensor`` to the host at op ``at``; ``last_use``: its last use before (-1: none)."""

    tensor: str
    at: int
    last_use: int


class Fetch(NamedTuple):
    """The cache brought ``tensor`` back at op ``at``."""

    tensor: str
    at: int


class ReadAhead(NamedTuple):
    """Fetch ``tensor`` from op ``earliest`` on, where its block fits, before op ``need`` reads it."""

    earliest: int
    tensor: str
    need: int


@dataclass(frozen=True)
class Hints:
    """What a second placement repeats and moves (:func:`snlite.overlap.cache_hints`): copies out to
    start after an op (``behind``), the first placement's evictions by op, read-aheads by earliest op."""

    behind: dict = field(default_factory=dict)  # op -> tensors
    evictions: dict = field(default_factory=dict)  # op -> tensors
    ahead: tuple = ()


class LRUCache:
    """Resident evictable tensors in least-recently-used order; ``preferred`` ones leave first."""

    def __init__(self, preferred=frozenset()):
        self.preferred = frozenset(preferred)
        self._first: OrderedDict[str, None] = OrderedDict()  # preferred tensors (CONV outputs)
        self._rest: OrderedDict[str, None] = OrderedDict()
        self._queue: dict[str, OrderedDict] = {}  # cached tensor -> its queue: one lookup per question

    def add(self, name: str, base: str | None = None) -> None:
        """``name`` is resident now (most recently used); ``base`` is the tensor it incarnates."""
        q = self._queue.get(name)
        if q is None:
            q = self._queue[name] = self._first if (base or name) in self.preferred else self._rest
        q[name] = None

    def touch(self, name: str) -> bool:
        """``name`` was just used: move it to the most recently used end. True if it is cached."""
        q = self._queue.get(name)
        if q is None:
            return False
        q.move_to_end(name)
        return True

    def remove(self, name: str) -> bool:
        """Forget ``name`` (it left the device); True if it was cached."""
        q = self._queue.pop(name, None)
        if q is None:
            return False
        del q[name]
        return True

    def __contains__(self, name: str) -> bool:
        return name in self._queue

    def __len__(self) -> int:
        return len(self._queue)

    def eviction_order(self):
        """Names in the order they should leave: preferred first, each queue oldest first.
        (A generator: the runtime stops at the first unlocked one.)"""
        yield from self._first
        yield from self._rest

    def clear(self) -> None:
        self._first.clear()
        self._rest.clear()
        self._queue.clear()


class NextUse:
    """Belady's clairvoyance: ``rank(t, now)`` is the index of the next op after ``now`` that reads or
    writes ``t`` (infinity: none), so the tensor needed furthest in the future leaves first."""

    def __init__(self, ops):
        self.uses: dict[str, list[int]] = {}  # tensor (incarnation) -> the ops using it, in order
        for op in ops:
            for name in dict.fromkeys((*op.reads, *op.writes)):
                self.uses.setdefault(name, []).append(op.index)

    def __call__(self, t, now: int) -> float:
        uses = self.uses.get(t.name, ())
        i = bisect_right(uses, now)
        return uses[i] if i < len(uses) else math.inf


def victim_rank(policy: str, ops=()):
    """How the cache picks among the unlocked tensors on the device (``MemoryConfig.evict``): None for
    the paper's LRU (the first in :meth:`LRUCache.eviction_order`), else ``rank(tensor, op index)``,
    the highest rank leaving first, ties in LRU order. ``ops``: the plan's ops (Belady reads ahead)."""
    if policy == "lru":
        return None
    if policy == "largest":
        return lambda t, now: t.nbytes
    if policy == "belady":
        return NextUse(ops)
    raise ValueError(f"unknown eviction policy {policy!r}")


def choose_victim(cache: LRUCache, tensors: dict, planned: list | None = None, in_flight=(), rank=None,
                  now: int = -1):
    """The tensor to evict when an allocation does not fit, or None if nothing can leave: in the
    time-aware second placement first the tensors the first one evicted at this op (``planned``,
    consumed; their copies may already be running: write-behind), then the unlocked tensor on the
    device that ``rank`` (:func:`victim_rank`, at op ``now``) puts first, the least recently used
    where it is None, then one whose write-behind copy is still running (``in_flight``); never a
    locked one (the running layer reads or writes it)."""
    while planned:
        t = tensors.get(planned.pop(0))
        if t is not None and not t.locked and t.state in (State.ON_DEVICE, State.OFFLOADING):
            return t
    movable = (t for t in map(tensors.__getitem__, cache.eviction_order())
               if not t.locked and t.state is State.ON_DEVICE)
    # max keeps the first of equals: ties leave in LRU order
    best = next(movable, None) if rank is None else max(movable, key=lambda t: rank(t, now), default=None)
    if best is not None:
        return best
    # (not one the running layer reads: its block must stay until the layer is done)
    return next((t for t in map(tensors.__getitem__, in_flight) if not t.locked), None)
