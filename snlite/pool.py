"""The Unified Tensor Pool's allocators (docs/paper.md section 4): pure bookkeeping, no device calls.

SuperNeurons never calls ``cudaMalloc`` on the training path. It makes one big device
allocation up front (the *arena*) and hands out pieces of it; the runtime turns each offset
this module returns into a view of that arena.

- :class:`TensorPool`: the device arena. Requests are rounded up to whole blocks (1 KB, as in
  the paper); free space is a sorted list of ``(offset, size)`` regions; ``alloc`` takes the
  first region that fits (``fit="first"``, the paper's choice) or the smallest one
  (``fit="best"``); ``free`` looks the allocation up by offset in a hash table (a ``dict``)
  and *coalesces* it with free neighbours, so after every tensor is freed the arena is one
  region again.
- :class:`HostPool`: the same logic over a pinned host slab, with 256-byte granularity.
- :class:`RawAllocator`: the baseline SuperNeurons measured against (Table 2): one
  ``cudaMalloc``/``cudaFree`` per tensor. It only accounts; the runtime makes one device
  allocation per handle it returns.
- :func:`format_map`: the arena as one line of text, to *see* fragmentation.

Everything is deterministic: the same sequence of calls returns the same offsets.

    pool = TensorPool(8 * 1024)
    a = pool.alloc(1500, "conv1")      # 0: rounded up to 2 blocks (2048 bytes)
    b = pool.alloc(100, "relu1")       # 2048
    pool.free(a)
    format_map(pool, width=8)          # '..#.....'
"""
from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass

from snlite.device import ALIGNMENT_BYTES, align_up

FITS = ("first", "best")
ADVICE = "a larger memory budget, or turning on liveness, offload or recompute, would help"


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool. ``fragmentation = 1 - largest_free / free`` (0 when nothing is free):
    0 means all free bytes are one region; near 1 means free space is scattered in small holes."""

    capacity_bytes: int | None  # None: unlimited (a RawAllocator without a budget)
    in_use_bytes: int  # sum of the reserved (rounded) sizes of live allocations
    peak_in_use_bytes: int  # highest in_use_bytes since creation or reset_peak()
    free_bytes: int | None
    largest_free_bytes: int | None
    fragmentation: float
    allocations: int  # live allocations
    total_allocs: int  # successful alloc() calls, ever
    high_water_bytes: int  # highest end offset ever allocated: the arena this placement needed


class PoolFullError(MemoryError):
    """An allocation that does not fit. Names the request, the step and the pool's state."""

    def __init__(self, name: str, nbytes: int, step, stats: PoolStats, what: str = "device pool",
                 advice: str = ADVICE, reserved_bytes: int | None = None):
        self.name, self.nbytes, self.step, self.stats = name, nbytes, step, stats
        self.reserved_bytes = nbytes if reserved_bytes is None else reserved_bytes
        at = "" if step is None else f" at step {step!r}"
        rounded = "" if self.reserved_bytes == nbytes else f", {_fmt_bytes(self.reserved_bytes)} reserved"
        super().__init__(
            f"{what} full: cannot allocate {name!r} ({_fmt_bytes(nbytes)} bytes{rounded}){at}; "
            f"capacity {_fmt_bytes(stats.capacity_bytes)} bytes, in use {_fmt_bytes(stats.in_use_bytes)}, "
            f"largest free block {_fmt_bytes(stats.largest_free_bytes)}, free {_fmt_bytes(stats.free_bytes)} "
            f"(fragmentation {stats.fragmentation:.0%}); {advice}")


def _fmt_bytes(n) -> str:
    return "unlimited" if n is None else f"{n:,}"


def _check_nbytes(nbytes, what: str = "a request") -> int:
    try:
        nbytes = operator.index(nbytes)
    except TypeError:
        raise TypeError(f"{what} must be a whole number of bytes (an int), got {type(nbytes).__name__} "
                        f"{nbytes!r}") from None
    if nbytes < 0:
        raise ValueError(f"{what} must be >= 0 bytes, got {nbytes}")
    return nbytes


class _Books:
    """What every allocator counts: live allocations by key (offset or handle), bytes in use
    (reserved sizes), their peak, the highest end reached, and successful allocs."""

    what = "device pool"  # words for error messages
    advice = ADVICE

    def _open_books(self) -> None:
        self._live: dict[int, tuple[str, int, int, object]] = {}  # key -> (name, nbytes, reserved, step)
        self.in_use_bytes = self.peak_in_use_bytes = self.high_water_bytes = self.total_allocs = 0

    def _full(self, name, nbytes, step, need) -> PoolFullError:
        return PoolFullError(name, nbytes, step, self.stats(), self.what, self.advice, need)

    def _record(self, key: int, name: str, nbytes: int, need: int, step, end: int) -> int:
        self._live[key] = (name, nbytes, need, step)
        self.in_use_bytes += need
        if self.in_use_bytes > self.peak_in_use_bytes:  # (not max(): every allocation of a walk comes here)
            self.peak_in_use_bytes = self.in_use_bytes
        if end > self.high_water_bytes:
            self.high_water_bytes = end
        self.total_allocs += 1
        return key

    def _release(self, key: int) -> int:
        """Forget the allocation at ``key``; return its reserved size."""
        rec = self._live.pop(key, None)
        if rec is None:
            raise ValueError(f"{self.what}: free({key!r}) but no live allocation has that offset/handle "
                             f"(a double free, or an offset/handle from another pool?); "
                             f"live: {sorted(self._live)[:8]}{'...' if len(self._live) > 8 else ''}")
        self.in_use_bytes -= rec[2]
        return rec[2]

    def alloc_all(self, requests, step=None) -> list[int]:
        """``[alloc(nbytes, name, step) for name, nbytes in requests]``."""
        return [self.alloc(nbytes, name, step) for name, nbytes in requests]

    def allocations(self) -> dict[int, tuple[str, int]]:
        """Live allocations: ``offset (or handle) -> (name, reserved bytes)``, in order."""
        return {key: (rec[0], rec[2]) for key, rec in sorted(self._live.items())}

    def reset_peak(self) -> None:
        """Start a new peak measurement from what is in use now (high water is lifetime)."""
        self.peak_in_use_bytes = self.in_use_bytes


class TensorPool(_Books):
    """Bookkeeping for one device arena of ``capacity_bytes``, cut into ``block_bytes`` blocks.

    Requirements it keeps (and the tests check):

    - every offset is a multiple of ``block_bytes``, itself a multiple of 256
      (:data:`snlite.device.ALIGNMENT_BYTES`), so every tensor view is 256-byte aligned;
    - live allocations never overlap, and ``free + in_use == capacity`` at all times;
    - a 0-byte request still takes one block, so every live tensor has its own offset;
    - a request that does not fit raises :class:`PoolFullError` and changes nothing;
    - ``alloc`` costs O(number of free regions); ``free`` a dict lookup plus a bisect.

    ``capacity_bytes`` is rounded *down* to whole blocks: the runtime should allocate
    ``pool.capacity_bytes`` for the arena.
    """

    def __init__(self, capacity_bytes: int, fit: str = "first", block_bytes: int = 1024):
        block_bytes = operator.index(block_bytes)
        if block_bytes <= 0 or block_bytes % ALIGNMENT_BYTES:
            raise ValueError(f"block_bytes must be a positive multiple of {ALIGNMENT_BYTES} "
                             f"(so every offset stays aligned), got {block_bytes}")
        if fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {fit!r}")
        capacity_bytes = _check_nbytes(capacity_bytes, "a pool's capacity")
        self.block_bytes, self.fit = block_bytes, fit
        self.capacity_bytes = capacity_bytes // block_bytes * block_bytes
        self._free: list[tuple[int, int]] = [(0, self.capacity_bytes)] if self.capacity_bytes else []
        self._open_books()

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.capacity_bytes:,} bytes, fit={self.fit!r}, "
                f"{len(self._live)} live, {self.in_use_bytes:,} in use)")

    # ------------------------------------------------------------ queries
    def reserved_bytes(self, nbytes: int) -> int:
        """The bytes a request of ``nbytes`` really takes: whole blocks, at least one."""
        return max(1, -(-_check_nbytes(nbytes) // self.block_bytes)) * self.block_bytes

    def free_regions(self) -> tuple[tuple[int, int], ...]:
        """The free list: sorted, non-adjacent ``(offset, size)`` regions."""
        return tuple(self._free)

    def largest_free_block(self) -> int:
        return max((size for _, size in self._free), default=0)

    def can_fit(self, nbytes: int) -> bool:
        return self._find(self.reserved_bytes(nbytes)) is not None

    def stats(self) -> PoolStats:
        free = self.capacity_bytes - self.in_use_bytes
        largest = self.largest_free_block()
        return PoolStats(self.capacity_bytes, self.in_use_bytes, self.peak_in_use_bytes, free, largest,
                         1.0 - largest / free if free else 0.0, len(self._live), self.total_allocs,
                         self.high_water_bytes)

    # ------------------------------------------------------------ alloc / free
    def _find(self, need: int) -> int | None:
        """Index in the free list of the region to carve ``need`` bytes from, or None.

        Assignment 2 (first/best-fit pool allocator with coalescing), part 1. Requirements
        (``pytest -m a2`` checks all but the cost):

        - ``fit == "first"``: the lowest-address region of ``self._free`` with at least ``need``
          bytes (the paper's policy); ``fit == "best"``: the smallest such region, ties going to
          the lowest address;
        - None when no region is large enough;
        - reads the free list and changes nothing; O(number of free regions).
        """
        # BEGIN ASSIGNMENT 2: first/best-fit pool allocator with coalescing
        if self.fit == "first":  # the lowest-address region that fits
            for i, (_, size) in enumerate(self._free):
                if size >= need:
                    return i
            return None
        fits = [(size, off, i) for i, (off, size) in enumerate(self._free) if size >= need]
        return min(fits)[2] if fits else None  # smallest region; ties go to the lowest address
        # END ASSIGNMENT 2

    def alloc(self, nbytes: int, name: str, step=None) -> int:
        """Reserve room for ``nbytes`` for tensor ``name``; return its offset into the arena.

        Assignment 2 (first/best-fit pool allocator with coalescing), part 2. Requirements
        (``pytest -m a2`` checks them):

        - takes ``self.reserved_bytes(nbytes)`` bytes (whole blocks, at least one) from the start
          of the region :meth:`_find` picks; the rest of that region stays free, and a region
          used up leaves the free list;
        - books the allocation with ``self._record(offset, name, nbytes, reserved, step,
          end=offset + reserved)`` and returns its offset;
        - a request that fits nowhere raises ``self._full(name, nbytes, step, reserved)`` (a
          :class:`PoolFullError`) and changes nothing;
        - live allocations never overlap, and free + in use == capacity after every call.
        """
        # BEGIN ASSIGNMENT 2: first/best-fit pool allocator with coalescing
        need = self.reserved_bytes(nbytes)
        i = self._find(need)
        if i is None:
            raise self._full(name, nbytes, step, need)
        off, size = self._free[i]
        if size == need:
            del self._free[i]
        else:  # carve from the region's start; the rest stays free
            self._free[i] = (off + need, size - need)
        return self._record(off, name, nbytes, need, step, end=off + need)
        # END ASSIGNMENT 2

    def free(self, offset: int) -> None:
        """Return the allocation at ``offset``, merging it with free neighbours.

        Assignment 2 (first/best-fit pool allocator with coalescing), part 3. Requirements
        (``pytest -m a2`` checks all but the cost):

        - ``self._release(offset)`` forgets the allocation and returns its reserved size (it
          raises on a double free, before anything changes);
        - coalesces with both neighbours: a free region that ends at ``offset`` and one that
          starts where the allocation ends merge with it into one region, so the free list stays
          sorted with no two regions touching, and once every allocation is freed it is one
          region, ``(0, capacity_bytes)``, again;
        - finds its place in the sorted free list by bisection (``bisect``), not a scan.
        """
        # BEGIN ASSIGNMENT 2: first/best-fit pool allocator with coalescing
        start, end = offset, offset + self._release(offset)
        i = bisect.bisect_left(self._free, (offset,))  # its place in the sorted list: (o,) < (o, size)
        if i < len(self._free) and self._free[i][0] == end:  # free region right after: absorb it
            end += self._free.pop(i)[1]
        if i > 0 and sum(self._free[i - 1]) == start:  # free region right before: extend it
            i -= 1
            start = self._free.pop(i)[0]
        self._free.insert(i, (start, end - start))
        # END ASSIGNMENT 2

    def alloc_all(self, requests, step=None) -> list[int]:
        """``[alloc(nbytes, name, step) for name, nbytes in requests]``, in one pass when the pool is
        empty and everything fits (then first and best fit both lay the blocks end to end from offset
        0): how the persistent tensors are placed, tens of thousands of them for a deep network."""
        requests = list(requests)
        if self._live or not self._free:
            return super().alloc_all(requests, step)
        reserved = {n: self.reserved_bytes(n) for n in {nbytes for _, nbytes in requests}}  # a few sizes
        needs = [reserved[nbytes] for _, nbytes in requests]
        if sum(needs) > self.capacity_bytes:
            return super().alloc_all(requests, step)  # fails at the right one
        offsets, offset = [], 0
        for (name, nbytes), need in zip(requests, needs):  # what _record books, for all of them at once
            self._live[offset] = (name, nbytes, need, step)
            offsets.append(offset)
            offset += need
        self.in_use_bytes = offset  # the pool was empty
        self.peak_in_use_bytes = max(self.peak_in_use_bytes, offset)
        self.high_water_bytes = max(self.high_water_bytes, offset)
        self.total_allocs += len(offsets)
        self._free = [(offset, self.capacity_bytes - offset)] if offset < self.capacity_bytes else []
        return offsets


class LivePool(TensorPool):
    """The walk's pool under ``fit="offline"`` and a budget: an allocation fits when the bytes in use
    plus its own stay within ``limit_bytes``, wherever the holes are, because the offsets it returns
    are only provisional (:mod:`snlite.offline` chooses the real ones after the walk). First fit over
    ``room_bytes``, enough for every allocation at once, keeps them provisional but distinct. "The
    largest free block" (what the dynamic workspace asks) is ``limit_bytes`` minus the bytes in use
    and minus ``spare_bytes``: a workspace that fills every free byte makes each conv step a moment
    where the blocks must tile the budget exactly, which no placement manages at every such moment."""

    def __init__(self, limit_bytes: int, room_bytes: int, spare_bytes: int = 0, block_bytes: int = 1024):
        super().__init__(max(limit_bytes, room_bytes), "first", block_bytes)
        self.limit_bytes = limit_bytes // self.block_bytes * self.block_bytes
        self.spare_bytes = spare_bytes

    def _find(self, need: int) -> int | None:
        return None if self.in_use_bytes + need > self.limit_bytes else super()._find(need)

    def largest_free_block(self) -> int:
        return max(0, self.limit_bytes - self.in_use_bytes - self.spare_bytes)

    def alloc_all(self, requests, step=None) -> list[int]:
        requests = list(requests)
        if sum(self.reserved_bytes(n) for _, n in requests) > self.limit_bytes:
            return [self.alloc(nbytes, name, step) for name, nbytes in requests]  # fails at the right one
        return super().alloc_all(requests, step)

    def stats(self) -> PoolStats:
        free = self.limit_bytes - self.in_use_bytes
        return PoolStats(self.limit_bytes, self.in_use_bytes, self.peak_in_use_bytes, free, free, 0.0,
                         len(self._live), self.total_allocs, self.high_water_bytes)


class HostPool(TensorPool):
    """Pinned host buffers: one slab taken once (pinning is slow), carved and reused like the arena.

    Same interface and logic as :class:`TensorPool` (first fit by default), but with 256-byte granularity
    instead of 1 KB blocks: host copies are fewer and larger, so there is no need for coarse
    blocks, and 256 bytes keeps every host view aligned for DMA the same way as on the device.
    """

    what = "host pool"
    advice = "a larger pinned host slab would help, or offloading fewer tensors"

    def __init__(self, capacity_bytes: int, fit: str = "first"):
        super().__init__(capacity_bytes, fit=fit, block_bytes=ALIGNMENT_BYTES)


class RawAllocator(_Books):
    """The no-pool baseline: one ``cudaMalloc`` per tensor, one ``cudaFree`` per free.

    There is no arena, so no offsets and no fragmentation to model: ``alloc`` returns a fresh
    handle id (1, 2, 3, ...; never reused, so a stale handle is caught) and only counts bytes.
    Each request is rounded up to 256 bytes, the alignment ``cudaMalloc`` guarantees, with at
    least 256 so the accounting matches the pool's "every tensor takes room" rule.
    ``capacity_bytes=None`` means unlimited; then ``free_bytes`` and ``largest_free_bytes``
    are None. ``high_water_bytes`` is the peak in use, the memory this run needed.
    """

    what = "raw allocator"

    def __init__(self, capacity_bytes: int | None = None):
        if capacity_bytes is not None:
            capacity_bytes = _check_nbytes(capacity_bytes, "a pool's capacity")
        self.capacity_bytes = capacity_bytes
        self._open_books()
        self._next_handle = 1

    def reserved_bytes(self, nbytes: int) -> int:
        return max(ALIGNMENT_BYTES, align_up(_check_nbytes(nbytes)))

    def largest_free_block(self) -> int | None:
        return None if self.capacity_bytes is None else self.capacity_bytes - self.in_use_bytes

    def can_fit(self, nbytes: int) -> bool:
        room = self.largest_free_block()
        return room is None or self.reserved_bytes(nbytes) <= room

    def stats(self) -> PoolStats:
        room = self.largest_free_block()
        return PoolStats(self.capacity_bytes, self.in_use_bytes, self.peak_in_use_bytes, room, room, 0.0,
                         len(self._live), self.total_allocs, self.high_water_bytes)

    def alloc(self, nbytes: int, name: str, step=None) -> int:
        """Account for one ``cudaMalloc``; return a new handle."""
        need = self.reserved_bytes(nbytes)
        if not self.can_fit(nbytes):
            raise self._full(name, nbytes, step, need)
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        return self._record(handle, name, nbytes, need, step, end=self.in_use_bytes + need)

    def free(self, handle: int) -> None:
        """Account for one ``cudaFree``."""
        self._release(handle)


def format_map(pool: TensorPool, width: int = 64) -> str:
    """The arena as one line: ``#`` a fully used cell, ``.`` a free one, ``+`` partly used.

    Each of the ``width`` cells covers about ``capacity / width`` bytes (at least one block).
    """
    if not isinstance(pool, TensorPool):
        raise TypeError(f"format_map draws an arena (TensorPool or HostPool), not a {type(pool).__name__}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    cap = pool.capacity_bytes
    width = min(width, cap // pool.block_bytes)
    cells = []
    for c in range(width):
        lo, hi = c * cap // width, (c + 1) * cap // width
        free = sum(max(0, min(hi, off + size) - max(lo, off)) for off, size in pool.free_regions())
        cells.append("." if free == hi - lo else "#" if free == 0 else "+")
    return "".join(cells)
