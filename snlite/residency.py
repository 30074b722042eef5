"""Where each tensor is, and the moves between: the placement pass's bookkeeping.

A tensor's state (:class:`~snlite.tensor.Tensor`) says where its data is: on the device, being copied
out, on the host, being copied back, dropped or freed. Each move here changes one tensor's state and
writes what the move costs into the program: a block of the arena (:mod:`snlite.pool`) taken or given
back, a pinned slot of the slab (:mod:`snlite.slab`), a copy and its events (:mod:`snlite.copies`),
its place in the LRU order (:mod:`snlite.cache`). An allocation that does not fit evicts with the
cache on, or raises :class:`~snlite.errors.BudgetError` with the live tensors named.

:class:`~snlite.placement.Placer` sets up what these moves use (``tensors``, ``pool``, ``host``,
``layout``, ``emit``, ``lru``, ``stats``...) and decides when each happens.
"""
from __future__ import annotations

from snlite.cache import Eviction, Fetch, choose_victim
from snlite.errors import BudgetError, HostBudgetError, PlanError, device_message, host_message
from snlite.pool import PoolFullError
from snlite.program import COMPUTE, Alloc, Free, HandOver
from snlite.recompute import base_name
from snlite.tensor import State, Tensor


class Residency:
    """The moves of the placement pass's tensors (see the module docstring)."""

    def reserved(self, nbytes: int) -> int:
        """The bytes the pool reserves for ``nbytes`` (memoised: the pass asks about a million times)."""
        r = self._reserved.get(nbytes)
        if r is None:
            r = self._reserved[nbytes] = self.pool.reserved_bytes(max(nbytes, 1))
        return r

    def _tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            base = base_name(name) if "#" in name else name
            t = self.tensors[name] = Tensor(name=name, nbytes=self.nbytes[base], kind=self.kinds[base])
        return t

    def _take_block(self, t: Tensor, step) -> int:
        """A block for ``t``; with the cache on, a full pool evicts tensors until it fits. Raises
        BudgetError when nothing more can leave."""
        nbytes = max(t.nbytes, 1)
        while True:
            try:
                offset = self.pool.alloc(nbytes, t.name, step)
                break
            except PoolFullError as e:
                victim = None  # without the cache, nothing leaves to make room
                if self.config.cache:
                    victim = choose_victim(self.lru, self.tensors, self.planned_evictions.get(self.op_index),
                                           self.behind_in_flight, self.rank, self.op_index)
                if victim is None:
                    live = [(n, self.nbytes[n]) for n in self.persistent]  # then the rest, in the order made
                    live += [(x.name, x.nbytes) for x in self.tensors.values() if x.resident]
                    raise BudgetError(self._budget_message(t.name, step, e, live)) from None
                self._evict(victim, step)
        self.out.append(Alloc(t.name, self.emit.space, offset, self.reserved(nbytes),
                              COMPUTE if self.raw else None))
        return offset

    def _alloc(self, t: Tensor, step) -> None:
        t.allocate(self._take_block(t, step))
        base = base_name(t.name)
        if base in self.evictable:
            self.lru.add(t.name, base)

    def _release_block(self, t: Tensor, offset) -> None:
        self.emit.release(t.name)  # a copy still reads this block: reuse only after it
        self.pool.free(offset)
        self.out.append(Free(t.name, self.emit.space, offset, self.reserved(t.nbytes)))
        self.lru.remove(t.name)

    def _host_slot(self, name: str, nbytes: int, step) -> int:
        """A pinned slot for a tensor going to the host, from the host pool (after the fixed part)."""
        try:
            offset = self.layout.staging_bytes + self.host.alloc(nbytes, name, step)
        except PoolFullError as e:
            raise HostBudgetError(host_message(
                self.graph, self.config.describe(), self.config.host_budget_bytes, name, nbytes, step,
                e.stats.largest_free_bytes, list(self.host.allocations().values()),
                [(s.name, s.nbytes) for s in self.layout.staging.values()])) from None
        self.out.append(Alloc(name, "slab", offset, self.host.reserved_bytes(nbytes)))
        return offset

    def _free_host_slot(self, name: str, offset: int, nbytes: int, stream: str = COMPUTE) -> None:
        if name not in self.layout.staging:
            self.host.free(offset - self.layout.staging_bytes)
        self.out.append(Free(name, "slab", offset, self.host.reserved_bytes(nbytes), stream))

    def _hand_over(self, new: Tensor, old: Tensor) -> None:
        """An in-place write: ``new`` takes over ``old``'s block (and its place in the cache);
        ``old`` is dead, and so is any host copy it had."""
        new.take_buffer(old)
        self.out.append(HandOver(new.name, old.name))
        self.emit.rename(new.name, old.name)
        host = old.release_host()
        if host is not None:
            self._free_host_slot(old.name, host, old.nbytes)
        if self.lru.remove(old.name):
            self.lru.add(new.name, base_name(new.name))

    def _free(self, name: str) -> None:
        t = self.tensors.get(name)
        if t is None or t.state in (State.FREED, State.UNALLOCATED):
            return
        if t.state is State.OFFLOADING:
            self._finish_offload(t)
        was_resident = t.resident
        drop = t.state is State.ON_DEVICE and "#" not in name and name in self.dropped
        offset = t.drop() if drop else t.free()
        if was_resident:
            self._release_block(t, offset)
        if t.host_offset is not None:
            self._free_host_slot(t.name, t.release_host(), t.nbytes)

    def _start_offload(self, t: Tensor, step, why: str) -> None:
        if t.host_offset is None:
            t.host_offset = self._host_slot(t.name, t.nbytes, step)
        if t.start_offload(t.host_offset):  # False: a clean eviction, the host copy is still valid
            self.emit.to_host(t.name, why, t.offset, t.host_offset, t.nbytes)
        self.lru.remove(t.name)

    def _finish_offload(self, t: Tensor) -> None:
        self.behind_in_flight.pop(t.name, None)
        self._release_block(t, t.finish_offload())

    def _start_prefetch(self, t: Tensor, step, why: str) -> None:
        t.start_prefetch(self._take_block(t, step))
        self.emit.to_device(t.name, why, t.host_offset, t.offset, t.nbytes)

    def _fetch(self, t: Tensor, step) -> None:
        """A cache miss: ``t`` comes back from the host."""
        self.stats["cache_misses"] += 1
        self.fetches.append(Fetch(t.name, self.op_index))
        self._start_prefetch(t, step, "fetch")

    def _make_readable(self, t: Tensor, step) -> None:
        cache = self.config.cache
        if t.state is State.ON_HOST and t.name in self.host_state:  # momentum not fetched ahead: now
            self._start_prefetch(t, step, "state")
        elif t.state is State.ON_HOST:
            if not cache:
                raise PlanError(f"op {step} reads {t.name}, which is on the host and nothing prefetched it")
            self._fetch(t, step)
        elif cache and t.state is State.OFFLOADING:  # its write-behind copy still running: on the device
            self.stats["cache_hits"] += 1
        if t.state is State.PREFETCHING:
            self.emit.landed(t.name)  # read only once the copy has landed
            t.finish_prefetch()
            if base_name(t.name) in self.evictable:
                self.lru.add(t.name, base_name(t.name))
        if not t.readable:
            raise PlanError(f"op {step} reads {t.name}, which is {t.state.name}: the plan is wrong")
        self.lru.touch(t.name)

    def _evict(self, t: Tensor, step) -> None:
        """``t`` to the host (unless a valid copy is there already) and its block freed, to make room
        at ``step``."""
        self.evictions.append(Eviction(t.name, self.op_index, self.last_use.get(t.name, -1)))
        if t.state is State.ON_DEVICE:
            self._start_offload(t, step, "evict")
        self._finish_offload(t)

    def _budget_message(self, name: str, step, err: PoolFullError, live) -> str:
        nbytes = (self.nbytes.get(base_name(name), 0) if name not in self.tensors
                  else self.tensors[name].nbytes)
        return device_message(self.graph, self.config.describe(), self.capacity, name, nbytes, step,
                              err.stats.largest_free_bytes, live)
