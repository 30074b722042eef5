"""The pinned slab's layout and the planner's upper bounds.

The slab is one pinned host buffer. From its start: the optimizer state waiting there between its
updates (``optimizer_state="host"``), the staging area (the batch and labels the host writes before
they are uploaded, the loss and the logits it reads back), then the host pool, where offloaded and
evicted tensors wait. The first two sit at the same offsets in every mode, so a train, a grads and
an update program of one net can share one slab.

Without a budget the arena and the host pool are given room for everything at once
(:func:`arena_upper_bound`, :func:`host_upper_bound`); the program then records the high-water mark
the placement reached, which is what a device allocates.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from snlite.pool import HostPool, TensorPool
from snlite.records import record

SLOT_BYTES = 256  # the slab's granule: pinned slots are whole multiples of it
slot_bytes = HostPool(SLOT_BYTES).reserved_bytes
block_bytes = TensorPool(1024).reserved_bytes


@record
class Slot:
    """A fixed pinned slot: ``tensor`` staged ``way`` ("in": the host writes it, "out": the host reads it)."""

    tensor: str
    way: str
    offset: int
    nbytes: int  # reserved: whole slab granules

    @property
    def name(self) -> str:
        """The slot's name in a program: ``data:in``, ``fc3.loss:out``."""
        return f"{self.tensor}:{self.way}"


@dataclass(frozen=True)
class Layout:
    """Where the fixed parts of the slab sit: ``state`` (momentum name -> offset), then ``staging``."""

    state: dict
    state_bytes: int
    staging: dict  # slot name -> Slot
    staging_bytes: int  # the state and the staging area: where the host pool starts


def layout(graph, nbytes: dict, host_state, train: bool) -> Layout:
    """The slab's fixed part for ``graph``: ``host_state`` (the momentum buffers waiting on the
    host, in ``nbytes`` order) first, then the batch (and labels, if ``train``) in and the results out."""
    state, offset = {}, 0
    for name in (n for n in nbytes if n in host_state):
        state[name] = offset
        offset += slot_bytes(max(nbytes[name], 1))
    state_bytes = offset
    logits = graph.output_tensor(graph.inputs[graph.loss_layer][0])
    staged = [("data", "in"), ("labels", "in"), (f"{graph.loss_layer}.loss", "out"), (logits, "out")] \
        if train else [("data", "in"), (logits, "out")]
    staging = {}
    for tensor, way in staged:
        slot = Slot(tensor, way, offset, slot_bytes(nbytes[tensor]))
        staging[slot.name] = slot
        offset += slot.nbytes
    return Layout(state, state_bytes, staging, offset)


def incarnations(specs: dict, plan) -> list[str]:
    """The original tensor of every tensor and incarnation of the iteration (the graph's, the
    optimizer's, every recomputed one), once per incarnation."""
    return list(specs) + [t.split("#", 1)[0] for p in plan.ops if p.op.phase == "recompute"
                          for t in p.op.writes]


def arena_upper_bound(nbytes: dict, bases: list[str], largest_workspace: int) -> int:
    """Enough for every tensor and incarnation at once plus the largest workspace: what an unlimited
    budget means (the baseline needs at most this)."""
    sizes = Counter(map(nbytes.__getitem__, bases))  # deep nets repeat a few sizes
    return sum(block_bytes(n) * k for n, k in sizes.items()) + block_bytes(largest_workspace)


def host_upper_bound(nbytes: dict, bases: list[str], evictable) -> int:
    """Room in the host pool for every tensor (and incarnation) that may go to the host, all at once."""
    sizes = Counter(nbytes[b] for b in bases if b in evictable)
    return sum(slot_bytes(n) * k for n, k in sizes.items())
