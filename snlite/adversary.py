"""The adversarial stream device: a host device on which a missing wait gives wrong numbers.

The CUDA simulator and the host device run every stream at once, in program order, so a copy that
a kernel forgot to wait for has always finished by the time the kernel runs: the bug is invisible
until a real GPU runs the two at the same time. This device keeps each stream as a queue and runs
nothing until the CPU has to wait (an event's ``synchronize``, a read, the end of an iteration);
then it drains the queues in the most hostile order CUDA allows: ``Wait`` entries block their
stream until the recorded mark has run, and nothing else orders two streams.

- ``order="late"``: the compute stream runs as far ahead as it can; copies run as late as the
  events allow (a kernel that should have waited for a prefetch reads the block's stale bytes; a
  block released without waiting for its offload copy is overwritten before the copy reads it).
- ``order="early"``: copies run as early as they can and compute waits as long as it can (an
  offload copy that should have waited for the kernel producing its tensor copies stale bytes).
- ``order="random"`` (with ``seed``): any legal interleaving, for fuzzing.

``copies`` breaks the ties ``late`` and ``early`` leave between the two copy streams, both ready
at once: ``"out_first"`` (the default; before this option it was the only rule) runs the
``copy_out`` stream's next entry (an offload or an eviction) before ``copy_in``'s (a prefetch or a
fetch), ``"in_first"`` the other way round, ``"random"`` either, drawn from ``seed``. An eviction
and a fetch of the same bytes that forgot to wait for each other give the right numbers under one
rule and wrong ones under the other, so the mutation tests run every rule.

Any of these orders is one a GPU may choose, so a correct program trains bit-identically to the
host device under every one of them (the tests check all flag combinations), and removing a needed
wait changes the numbers (the mutation tests check the release and prefetch waits)::

    Model(graph, config, device=AdversarialDevice("late"))
"""
from __future__ import annotations

import random
from collections import deque

import numpy as np

from snlite.device import HostDevice
from snlite.program import COMPUTE, COPY_IN, COPY_OUT

ORDERS = ("late", "early", "random")
COPY_TIES = ("out_first", "in_first", "random")  # which copy stream goes first when both could


class QueueStream:
    """A stream whose work waits in a queue until the device drains it."""

    raw = 0

    def __init__(self, device: "AdversarialDevice", name: str):
        self.device, self.name, self.queue = device, name, deque()

    def synchronize(self) -> None:
        self.device.drain(lambda: not self.queue)


class QueueEvent:
    """A CUDA event on queues: ``record`` enqueues a mark; ``wait`` blocks a stream until that mark
    (the latest record when ``wait`` was called) has run; never recorded, ``wait`` is a no-op."""

    def __init__(self, device: "AdversarialDevice"):
        self.device, self.recorded, self.done = device, 0, 0

    def record(self, stream: QueueStream) -> None:
        self.recorded += 1
        stream.queue.append(("record", self, self.recorded))

    def wait(self, stream: QueueStream) -> None:
        if self.recorded:
            stream.queue.append(("wait", self, self.recorded))

    def query(self) -> bool:
        return self.done >= self.recorded

    def synchronize(self) -> None:
        self.device.drain(self.query)

    def elapsed_ms(self, end: "QueueEvent") -> float:
        return 0.0


class AdversarialDevice(HostDevice):
    """NumPy arrays and references (as :class:`~snlite.device.HostDevice`), with queued streams
    drained in ``order``, ties between the copy streams broken by ``copies`` (see the module
    docstring); ``seed`` drives ``order="random"`` and ``copies="random"``."""

    name = "adversarial"

    def __init__(self, order: str = "late", seed: int = 0, copies: str = "out_first"):
        super().__init__()
        if order not in ORDERS:
            raise ValueError(f"unknown order {order!r}; choose one of {ORDERS}")
        if copies not in COPY_TIES:
            raise ValueError(f"unknown copies {copies!r}: how ties between the copy streams break; choose "
                             f"one of {COPY_TIES}")
        self.order, self.copies, self.rng = order, copies, random.Random(seed)
        self.streams: list[QueueStream] = []
        self.deferred = 0  # operations that waited in a queue: how much reordering was possible

    # ------------------------------------------------------------ streams and events
    def stream(self, name: str = "default"):
        s = QueueStream(self, name)
        self.streams.append(s)
        return s

    def event(self, timing: bool = False):
        return QueueEvent(self)

    def _enqueue(self, stream, work) -> None:
        if stream is None:  # the default stream: outside an iteration, everything before it first
            self.drain()
            work()
        else:
            self.deferred += 1
            stream.queue.append(("work", work))

    def _rank(self, s: QueueStream) -> int:
        compute = s.name == COMPUTE
        return (not compute) if self.order == "late" else compute

    def _pick(self, ready: list[QueueStream]) -> QueueStream:
        """The stream whose next entry runs: by ``order``, then, between copy streams, ``copies``."""
        if self.order == "random":
            return self.rng.choice(ready)
        best = min(map(self._rank, ready))
        tied = [s for s in ready if self._rank(s) == best]
        if len(tied) == 1 or self.copies == "out_first":
            # then creation order, the rule before ``copies``
            return min(tied, key=lambda s: s.name != COPY_OUT)
        if self.copies == "in_first":
            return min(tied, key=lambda s: s.name != COPY_IN)
        return self.rng.choice(tied)

    def drain(self, until=None) -> None:
        """Run queued work, one entry at a time, until ``until()`` holds (or every queue is empty)."""
        while until is None or not until():
            ready = [s for s in self.streams if s.queue and self._ready(s.queue[0])]
            if not ready:
                if any(s.queue for s in self.streams):
                    blocked = {s.name: s.queue[0][0] for s in self.streams if s.queue}
                    raise RuntimeError("every stream waits for an event that can no longer be "
                                       f"recorded: {blocked}")
                if until is not None:
                    raise RuntimeError("the host waits for an event that was never recorded on any stream")
                return
            s = self._pick(ready)
            entry = s.queue.popleft()
            if entry[0] == "work":
                entry[1]()
            elif entry[0] == "record":
                entry[1].done = max(entry[1].done, entry[2])

    @staticmethod
    def _ready(entry) -> bool:
        return entry[0] != "wait" or entry[1].done >= entry[2]

    def synchronize(self) -> None:
        self.drain()

    # ------------------------------------------------------------ work that waits in a queue
    def _alloc(self, nbytes, pinned, stream):
        buf = np.empty(nbytes, dtype=np.uint8)
        self._enqueue(stream, lambda: buf.fill(0xFF))  # NaN bytes, written when the stream gets there
        return buf

    def _copy_to_host(self, src, dst, stream):
        self._enqueue(stream, lambda: np.copyto(dst, src))

    _copy_to_device = _copy_to_host

    def _run(self, op, args, stream, kwargs):
        self._enqueue(stream, lambda: HostDevice._run(self, op, args, None, kwargs))

    def read(self, array):
        self.drain()
        return super().read(array)

    def write(self, src, dst):
        self.drain()
        super().write(src, dst)
