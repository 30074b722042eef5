"""A program's device memory as a PyTorch memory snapshot, for the viewer people already read memory
in: pytorch.org/memory_viz (drag the file onto it) or ``python -m torch.cuda._memory_viz trace_plot
FILE.pickle -o FILE.html``.

    write(path, snapshot(place(graph, config)))

``snlite plan NET --memory-snapshot FILE.pickle`` writes it. The arena is one segment, taken once
(``segment_alloc``) as the tensor pool takes it; every allocation of the program (the setup's, then
the iteration's, in order) is an ``alloc`` at the arena's address plus its offset, and every free a
``free_requested`` followed by a ``free_completed`` (snlite frees when the block may be reused, so
the two coincide). Each event's one frame names the tensor and its kind, where PyTorch would show
the Python stack that allocated it. ``segments`` is the arena at the end of the iteration: what the
next one starts with (the persistent tensors) and the free space between. The format is PyTorch's
``torch.cuda.memory._snapshot()``: plain dicts, lists, strings and integers, pickled with protocol 4;
snlite needs no torch to write it.
"""
from __future__ import annotations

import pickle

from snlite import files
from snlite.program import COMPUTE, STREAMS, Alloc, Free, HandOver, program_of

BASE_ADDRESS = 0x7F0000000000  # where the viewer puts the arena's offset 0: a made-up device address


class SnapshotError(ValueError):
    """A program the snapshot format cannot show."""


def check_allocator(allocator: str) -> None:
    """SnapshotError unless programs placed with ``allocator`` can be shown (the pool's one arena)."""
    if allocator != "pool":
        raise SnapshotError(f"a memory snapshot shows addresses in one arena, and --allocator {allocator} "
                            "has none (one device allocation per tensor): use the pool (--allocator pool)")


def snapshot(program) -> dict:
    """``program`` (a :class:`~snlite.program.Program` placed with the pool) as a PyTorch memory snapshot."""
    program = program_of(program)
    check_allocator(program.allocator)
    stream = {s: k for k, s in enumerate(STREAMS)}
    trace = [{"action": "segment_alloc", "addr": BASE_ADDRESS, "size": program.arena_bytes, "stream": 0,
              "time_us": 0, "frames": []}]
    live: dict[int, tuple[str, int]] = {}  # offset -> (tensor, bytes)
    offset_of: dict[str, int] = {}  # tensor -> the offset of its block, while it holds one
    for step, ins in enumerate(program.setup + program.body, 1):
        if type(ins) is HandOver and ins.old in offset_of:
            # an in-place write: the block is the new tensor's now, shown as the old one's freed and the
            # new one's allocated at the same address (the viewer then names the right tensor for it)
            offset = offset_of.pop(ins.old)
            nbytes = live[offset][1]
            old, new = ({"addr": BASE_ADDRESS + offset, "size": nbytes, "stream": stream[COMPUTE],
                         "time_us": step, "frames": [_frame(program, name, step)]}
                        for name in (ins.old, ins.new))
            trace += [{"action": "free_requested", **old}, {"action": "free_completed", **old},
                      {"action": "alloc", **new}]
            live[offset], offset_of[ins.new] = (ins.new, nbytes), offset
            continue
        if type(ins) not in (Alloc, Free) or ins.space != "arena":
            continue
        event = {"addr": BASE_ADDRESS + ins.offset, "size": ins.nbytes,
                 "stream": stream[ins.stream or COMPUTE], "time_us": step,
                 "frames": [_frame(program, ins.tensor, step)]}
        if isinstance(ins, Alloc):
            live[ins.offset], offset_of[ins.tensor] = (ins.tensor, ins.nbytes), ins.offset
            trace.append({"action": "alloc", **event})
        else:
            del live[ins.offset]
            offset_of.pop(ins.tensor, None)
            trace += [{"action": "free_requested", **event}, {"action": "free_completed", **event}]
    return {"segments": [_segment(program, live)], "device_traces": [trace]}


def _frame(program, tensor: str, step: int) -> dict:
    kind = program.tensors.get(tensor.split("#", 1)[0], (None, None, "?"))[2]
    return {"filename": f"snlite program of {program.net}", "line": step, "name": f"{tensor} ({kind})"}


def _segment(program, live: dict) -> dict:
    """The arena as it stands: each live allocation a block, the gaps between them inactive blocks."""
    blocks, at = [], 0
    for offset, (tensor, nbytes) in sorted(live.items()):
        if offset > at:
            blocks.append(_block(at, offset - at, "inactive", []))
        blocks.append(_block(offset, nbytes, "active_allocated", [_frame(program, tensor, 0)]))
        at = offset + nbytes
    if at < program.arena_bytes:
        blocks.append(_block(at, program.arena_bytes - at, "inactive", []))
    used = sum(nbytes for _, nbytes in live.values())
    return {"device": 0, "address": BASE_ADDRESS, "total_size": program.arena_bytes, "stream": 0,
            "segment_type": "large", "allocated_size": used, "active_size": used, "requested_size": used,
            "blocks": blocks}


def _block(offset: int, size: int, state: str, frames: list) -> dict:
    return {"address": BASE_ADDRESS + offset, "size": size, "requested_size": size if frames else 0,
            "state": state, "frames": frames}


def write(path: str, data: dict) -> None:
    """Pickle ``data`` to ``path`` with protocol 4, as PyTorch's ``_dump_snapshot`` does."""
    with files.replacing(path, "wb") as f:  # whole or not at all
        pickle.dump(data, f, protocol=4)
