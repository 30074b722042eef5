"""Copies and events: how the placement pass writes CUDA's ordering rules into a program.

Three streams (:mod:`snlite.program`): ``compute`` runs kernels, ``copy_out`` copies to the host,
``copy_in`` copies to the device. Nothing orders two streams but an event, so every copy gets its:

- a copy out of a block starts after an event recorded on compute (the kernels that wrote it are done);
- a copy into a block starts after an event recorded on compute (the block's previous users are done);
- compute waits for a copy's own event only where it must: before it reads what a copy brought in
  (``landed``), and before it frees a block a copy still reads (``release``);
- the iteration ends with compute waiting for both copy streams, then the host waiting for compute.

:class:`Emitter` holds the instruction list and the events still pending per tensor; the placement
pass decides *what* moves and *when*, the emitter writes *how*.
"""
from __future__ import annotations

from snlite.program import COMPUTE, COPY_IN, COPY_OUT, Copy, HostWait, HostWrite, Record, Wait


class Emitter:
    """The instructions of one iteration, in order, and the copies each tensor still waits on."""

    def __init__(self, space: str):
        self.space = space  # where device tensors live: "arena" or "raw"
        self.out: list = []
        self.pending: dict[str, str] = {}  # tensor -> the event of a copy still using its device block
        self.n_events = 0

    def record(self, stream: str) -> str:
        """A new event marking everything enqueued on ``stream`` so far."""
        self.n_events += 1
        event = f"e{self.n_events}"
        self.out.append(Record(event, stream))
        return event

    def to_host(self, name: str, why: str, offset: int, host_offset: int, nbytes: int) -> None:
        """Copy a device tensor to its pinned slot once the kernels that wrote it are done."""
        self.out.append(Wait(self.record(COMPUTE), COPY_OUT, "ready"))
        self.out.append(Copy(name, why, self.space, offset, "slab", host_offset, nbytes, COPY_OUT))
        self.pending[name] = self.record(COPY_OUT)

    def to_device(self, name: str, why: str, host_offset: int, offset: int, nbytes: int) -> None:
        """Copy a pinned tensor into a fresh block once the block's previous users are done."""
        self.out.append(Wait(self.record(COMPUTE), COPY_IN, "reuse"))
        self.out.append(Copy(name, why, "slab", host_offset, self.space, offset, nbytes, COPY_IN))
        self.pending[name] = self.record(COPY_IN)

    def landed(self, name: str) -> None:
        """Compute reads ``name`` only once its copy in has landed."""
        self.out.append(Wait(self.pending.pop(name), COMPUTE, "landed"))

    def release(self, name: str) -> None:
        """Before ``name``'s block is freed: compute waits for a copy still reading it, if any."""
        event = self.pending.pop(name, None)
        if event is not None:
            self.out.append(Wait(event, COMPUTE, "release"))

    def rename(self, new: str, old: str) -> None:
        """An in-place write: the copy pending on ``old``'s block is now pending on ``new``'s."""
        if old in self.pending:
            self.pending[new] = self.pending.pop(old)

    def upload(self, staged: list[tuple[str, int, int, int]]) -> None:
        """The batch (and labels): the host writes each pinned slot, then ``copy_in`` uploads them
        to their blocks, and compute reads them once they have landed. ``staged``: (tensor, slot,
        device offset, bytes)."""
        for name, slot, _, nbytes in staged:
            self.out.append(HostWrite(name, slot, nbytes))
        self.out.append(Wait(self.record(COMPUTE), COPY_IN, "reuse"))
        for name, slot, offset, nbytes in staged:
            self.out.append(Copy(name, "input", "slab", slot, self.space, offset, nbytes, COPY_IN))
        self.out.append(Wait(self.record(COPY_IN), COMPUTE, "landed"))

    def result(self, name: str, offset: int, slot: int, nbytes: int) -> None:
        """A result (the loss, the logits) leaves for its pinned slot on ``copy_out``."""
        self.out.append(Wait(self.record(COMPUTE), COPY_OUT, "ready"))
        self.out.append(Copy(name, "result", self.space, offset, "slab", slot, nbytes, COPY_OUT))
        self.pending[name] = self.record(COPY_OUT)

    def end(self) -> None:
        """The iteration's end: compute waits for both copy streams, the host for compute."""
        for stream in (COPY_OUT, COPY_IN):
            self.out.append(Wait(self.record(stream), COMPUTE, "end"))
        self.out.append(HostWait(self.record(COMPUTE)))
