"""An iteration's estimated timeline in the Chrome trace event format, for the viewers people already
use: Perfetto (ui.perfetto.dev: "Open trace file") and chrome://tracing ("Load").

    tl = timing.estimate(program, graph, "H200")
    write(path, chrome_trace(tl, "alexnet, batch 200", held_bytes(program)))

``snlite plan NET --chrome-trace FILE.json`` writes it, and so does ``snlite train`` for one training
step of the model it trains (with ``--streams`` on a CUDA device, that step as measured too). The file
is one JSON object (the Trace Event Format): the GPU is one process; each CUDA stream of the program
(compute, copy_out, copy_in) is one named track, in that order, with a complete event (``"ph": "X"``)
per kernel launch and per copy, its start and duration in microseconds from the time model
(:mod:`snlite.timing`); a counter track (``"ph": "C"``) draws the device memory in use when each
kernel starts (the weights and what else is held all iteration, plus what the iteration has allocated
by then). Kernel events carry the layer and phase, copy events the tensor and why it moves (offload,
prefetch, evict, fetch...).
"""
from __future__ import annotations

import json

from snlite import files
from snlite.program import STREAMS, Alloc

PID = 1  # the one process: the GPU


def held_bytes(program) -> int:
    """The device bytes the program's setup allocates (weights and what else lives all iteration)."""
    return sum(ins.nbytes for ins in program.setup if isinstance(ins, Alloc) and ins.space != "slab")


def chrome_trace(timeline, title: str, held: int = 0, measured=None) -> dict:
    """``timeline`` (a :class:`snlite.timing.Timeline`) as a Trace Event Format object; ``held``: the
    device bytes in use before the iteration starts (:func:`held_bytes`). ``measured``: a step's
    events as a CUDA device timed them (``Model.stream_events``: stream, label, start_ms, end_ms),
    shown as a second process beside the estimate."""
    events = _tracks(PID, title)
    for stream, start, end, label, kind in timeline.spans:
        events.append({"ph": "X", "name": label, "cat": "kernel" if kind == "kernel" else f"copy,{kind}",
                       "pid": PID, "tid": TID[stream], "ts": _us(start), "dur": _span_us(start, end)})
    if measured:
        events += _tracks(PID + 1, "measured on the device")
        events += [{"ph": "X", "name": e["label"], "cat": "measured", "pid": PID + 1, "tid": TID[e["stream"]],
                    "ts": _us(e["start_ms"]), "dur": _span_us(e["start_ms"], e["end_ms"])} for e in measured]
    for ms, in_use in timeline.memory:
        events.append({"ph": "C", "name": "device memory", "pid": PID, "tid": 0, "ts": _us(ms),
                       "args": {"bytes": held + in_use}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"profile": timeline.profile, "step_ms": timeline.step_ms,
                          "source": "snlite.timing: estimated, not measured"}}


TID = {stream: k for k, stream in enumerate(STREAMS, 1)}  # a stream's track


def _tracks(pid: int, title: str) -> list[dict]:
    """A process named ``title`` with one named track per stream, in the program's order."""
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": title}}]
    for stream, k in TID.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": k, "args": {"name": stream}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": k,
                       "args": {"sort_index": k}})
    return events


def _us(ms: float) -> float:
    return round(ms * 1000.0, 3)  # microseconds, to the nanosecond: the format's unit


def _span_us(start_ms: float, end_ms: float) -> float:
    """A span's duration as its rounded end less its rounded start: rounded apart, a kernel could end a
    nanosecond after the next one on its stream began, and a viewer nests the two."""
    return round(_us(end_ms) - _us(start_ms), 3)


def write(path: str, trace: dict) -> None:
    """Write ``trace`` to ``path`` as JSON (whole or not at all: :mod:`snlite.files`)."""
    files.write_text(path, json.dumps(trace))
