"""The tensor state machine of the Unified Tensor Pool (docs/paper.md section 4).

A tensor's data lives on the device, on the host, in flight between them, or nowhere. Every
move between those states is a method that first checks the move is legal, so a scheduler bug
("read a tensor whose prefetch has not finished", "offload a tensor the running layer locked")
fails loudly at the move, naming the tensor, instead of silently reading garbage later::

    UNALLOCATED --allocate--> ON_DEVICE --start_offload--> OFFLOADING --finish_offload--> ON_HOST
                                 ^  |                                                        |
                finish_prefetch  |  +--drop--> DROPPED                                       start_prefetch
                                 +------------------------- PREFETCHING <--------------------+
    ON_DEVICE / ON_HOST / DROPPED --free--> FREED (dead after its last use; allocate revives it)

A DROPPED tensor is not rebuilt in place: recomputation writes a new incarnation of it (``relu1#r2``,
a Tensor of its own: :mod:`snlite.recompute`), and the dropped one is only freed at the end.

This module only keeps the books: offsets are numbers the caller got from a
:class:`snlite.pool.TensorPool` (device) or :class:`snlite.pool.HostPool` (pinned host), and a
method that releases device memory *returns* the offset for the caller to free.
``print(describe_transitions())`` prints the table the methods enforce.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

KINDS = ("input", "weight", "weight_grad", "buffer", "optimizer", "activation", "gradient", "workspace")


class State(enum.Enum):
    __hash__ = object.__hash__  # members are singletons: hash by identity (Enum's own hash is Python code)

    UNALLOCATED = "unallocated"  # never had memory
    ON_DEVICE = "on_device"  # a device block holds the data
    OFFLOADING = "offloading"  # device copy still held, copy to host in flight
    ON_HOST = "on_host"  # only the host copy holds the data; the device block was released
    PREFETCHING = "prefetching"  # device block allocated, copy to device in flight
    DROPPED = "dropped"  # device block freed for recomputation; will be rebuilt
    FREED = "freed"  # dead after its last use


S = State
# move (the method's name) -> (states it may start from, the state it ends in)
MOVES: dict[str, tuple[frozenset[State], State]] = {
    "allocate": (frozenset({S.UNALLOCATED, S.FREED, S.DROPPED}), S.ON_DEVICE),
    "take_buffer": (frozenset({S.UNALLOCATED, S.FREED, S.DROPPED}), S.ON_DEVICE),  # the receiver's side
    "give_buffer": (frozenset({S.ON_DEVICE}), S.FREED),  # the giver's side of take_buffer
    "start_offload": (frozenset({S.ON_DEVICE}), S.OFFLOADING),
    "finish_offload": (frozenset({S.OFFLOADING}), S.ON_HOST),
    "start_prefetch": (frozenset({S.ON_HOST}), S.PREFETCHING),
    "finish_prefetch": (frozenset({S.PREFETCHING}), S.ON_DEVICE),
    "drop": (frozenset({S.ON_DEVICE}), S.DROPPED),
    "free": (frozenset({S.ON_DEVICE, S.ON_HOST, S.DROPPED}), S.FREED),
}
# state -> the states one move can reach from it (drawn from MOVES, so it cannot drift)
TRANSITIONS: dict[State, frozenset[State]] = {
    s: frozenset(dst for srcs, dst in MOVES.values() if s in srcs) for s in State}
RESIDENT = frozenset({S.ON_DEVICE, S.OFFLOADING, S.PREFETCHING})  # these hold a device block
READABLE = frozenset({S.ON_DEVICE, S.OFFLOADING})  # a kernel may read the device data now


def describe_transitions() -> str:
    """The state machine as a table, one line per state: ``STATE  move -> NEXT, ...``."""
    rows = []
    for s in State:
        moves = [f"{m} -> {dst.name}" for m, (srcs, dst) in MOVES.items() if s in srcs]
        rows.append(f"{s.name:12} {', '.join(moves) or '(no moves)'}")
    return "\n".join(rows)


class IllegalTransition(ValueError):
    """A move the state machine forbids; names the tensor, its state and the move."""

    def __init__(self, tensor: "Tensor", move: str, reason: str | None = None):
        self.tensor_name, self.state, self.move = tensor.name, tensor.state, move
        if reason is None:
            allowed = sorted(s.name for s in MOVES[move][0])
            reason = f"{move}() is only legal from {', '.join(allowed)}"
        super().__init__(f"tensor {tensor.name!r} is {tensor.state.name}: cannot {move}(): {reason}")


@dataclass(eq=False, slots=True)
class Tensor:
    """One tensor's bookkeeping: where its data is, and whether a host copy matches it.

    ``offset`` is the device offset (or a :class:`~snlite.pool.RawAllocator` handle); it is
    set exactly when the tensor is ``resident``. ``host_offset`` names its pinned host slot,
    which stays bound to the tensor across moves (so one slot is reused every iteration) until
    :meth:`release_host` hands it back. ``host_valid`` says the host slot holds the current data.
    ``locked`` is set by the placement pass while an op that reads or writes it runs: a locked
    tensor cannot be evicted by the tensor cache (offloaded or dropped). (The cache's LRU order is
    its own: :mod:`snlite.cache`.)
    """

    name: str
    nbytes: int
    kind: str = "activation"
    state: State = State.UNALLOCATED
    offset: int | None = None
    host_offset: int | None = None
    host_valid: bool = False
    locked: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"tensor {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.nbytes < 0:
            raise ValueError(f"tensor {self.name!r}: nbytes must be >= 0, got {self.nbytes}")

    @property
    def resident(self) -> bool:
        """Holds device memory (ON_DEVICE, OFFLOADING, PREFETCHING): counts against the budget."""
        return self.state in RESIDENT

    @property
    def readable(self) -> bool:
        """A kernel may read the device data now: ON_DEVICE, or OFFLOADING (a copy only reads it).
        PREFETCHING is resident but not readable: wait for the copy's event, then
        :meth:`finish_prefetch`."""
        return self.state in READABLE

    def _check(self, move: str) -> State:
        if self.state not in MOVES[move][0]:
            raise IllegalTransition(self, move)
        return MOVES[move][1]

    def _check_unlocked(self, move: str) -> None:
        if self.locked:
            raise IllegalTransition(self, move, "it is locked by the running layer; unlock it first")

    # ------------------------------------------------------------ getting device memory
    def allocate(self, offset: int) -> None:
        """UNALLOCATED / FREED / DROPPED -> ON_DEVICE at ``offset``. The new block's contents are
        about to be written, so any host copy is no longer valid."""
        self.state = self._check("allocate")
        self.offset, self.host_valid = offset, False

    def take_buffer(self, other: "Tensor") -> None:
        """In-place handover: ``self`` becomes ON_DEVICE at ``other``'s offset and ``other`` becomes
        FREED *without* releasing the block (an in-place layer writes its output over its input)."""
        new_state = self._check("take_buffer")
        if other is self:
            raise IllegalTransition(self, "take_buffer", "a tensor cannot take its own buffer")
        other.state = other._check("give_buffer")
        self.state, self.offset, self.host_valid = new_state, other.offset, False
        other.offset, other.host_valid, other.locked = None, False, False

    # ------------------------------------------------------------ offload and prefetch
    def start_offload(self, host_offset: int | None = None) -> bool:
        """ON_DEVICE -> OFFLOADING, copying to the host slot ``host_offset`` (default: the slot it
        already has). Returns whether a copy must run: False is a *clean eviction*, the host copy
        is still valid, so the caller may call :meth:`finish_offload` at once."""
        self._check("start_offload")
        self._check_unlocked("start_offload")
        if host_offset is None:
            host_offset = self.host_offset
        if host_offset is None:
            raise ValueError(f"tensor {self.name!r}: start_offload() needs a host slot (host_offset)")
        if self.host_offset is not None and host_offset != self.host_offset:
            raise ValueError(f"tensor {self.name!r} already has host slot {self.host_offset}; "
                             f"release_host() it before offloading to {host_offset}")
        self.state, self.host_offset = State.OFFLOADING, host_offset
        return not self.host_valid

    def finish_offload(self) -> int:
        """OFFLOADING -> ON_HOST once the copy's event completed; returns the device offset to free.
        Not while the running layer holds it locked: it reads that block."""
        state = self._check("finish_offload")
        self._check_unlocked("finish_offload")
        self.state = state
        offset, self.offset, self.host_valid = self.offset, None, True
        return offset

    def start_prefetch(self, offset: int) -> None:
        """ON_HOST -> PREFETCHING: a device block at ``offset`` is allocated, the copy starts."""
        self.state = self._check("start_prefetch")
        self.offset = offset

    def finish_prefetch(self) -> None:
        """PREFETCHING -> ON_DEVICE once the copy's event completed; the host copy stays valid."""
        self.state = self._check("finish_prefetch")

    # ------------------------------------------------------------ recompute and death
    def drop(self) -> int:
        """ON_DEVICE -> DROPPED, to be recomputed later; returns the device offset to free."""
        self._check("drop")
        self._check_unlocked("drop")
        self.state, offset, self.offset = State.DROPPED, self.offset, None
        return offset

    def free(self) -> int | None:
        """ON_DEVICE / ON_HOST / DROPPED -> FREED after the last use; returns the device offset to
        free (None when it held none). The host slot stays bound; :meth:`release_host` returns it."""
        self.state = self._check("free")
        offset, self.offset, self.host_valid, self.locked = self.offset, None, False, False
        return offset

    def mark_written(self) -> None:
        """The device data changed: the host copy no longer matches. Only legal ON_DEVICE (writing
        while a copy is in flight would tear it)."""
        if self.state is not State.ON_DEVICE:
            raise IllegalTransition(self, "mark_written", "only ON_DEVICE data may be written")
        self.host_valid = False

    def release_host(self) -> int | None:
        """Unbind the host slot and return it (None if there was none), for the caller to free.
        Illegal while the host copy is needed (ON_HOST) or a copy is in flight."""
        if self.state in (State.OFFLOADING, State.ON_HOST, State.PREFETCHING):
            raise IllegalTransition(self, "release_host", "the host copy is in use")
        host_offset, self.host_offset, self.host_valid = self.host_offset, None, False
        return host_offset
