"""Offload and prefetch of CONV outputs (PAPER.md section 4), on plain data.

Only CONV forward outputs go to the host: the cheap layers' outputs are too large for their
compute to hide the copy. The schedule, for CONV outputs c_1..c_m in forward order:

- right after conv_k's forward, start copying c_k to a pinned host buffer on a copy stream;
- release c_k's device memory when conv_{k+1}'s forward step begins (waiting for the copy there
  if it is still running);
- in backward, start copying c_k back when backward reaches conv_{k+1} (on the other copy
  stream), or earlier if a step reads c_k before that; c_k counts as resident from that step,
  and a step waits for the copy only if it reads c_k.

The last CONV's output is not offloaded (backward needs it at once), nor is an output that no
op reads after its release, nor one that a forward op still reads after its release.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transfer:
    """One tensor's trip to the host and back, as op indices of the plan."""

    tensor: str
    offload_after: int  # start the device-to-host copy after this op
    release_before: int  # free the device copy before this op
    prefetch_before: int | None  # start the host-to-device copy before this op (None: never needed again)


def schedule(ops, graph) -> list[Transfer]:
    """The transfers for the plan's ``ops`` (see the module docstring)."""
    conv_fwd = [op for op in ops if op.phase == "forward" and graph.layers[op.layer].kind == "conv2d"]
    conv_bwd = {op.layer: op.index for op in ops if op.phase == "backward"}
    readers: dict[str, list[int]] = {}
    for op in ops:
        for t in op.reads:
            readers.setdefault(t, []).append(op.index)
    out = []
    for this, nxt in zip(conv_fwd, conv_fwd[1:]):
        t = graph.output_tensor(this.layer)
        later = [i for i in readers.get(t, []) if i >= nxt.index]
        if not later:
            continue  # nothing needs it after the release: liveness frees it
        first_backward = min(later)
        if ops[first_backward].phase == "forward":
            continue  # a forward op still reads it after the next conv starts: keep it
        prefetch = min(conv_bwd[nxt.layer], first_backward)
        out.append(Transfer(t, this.index, nxt.index, prefetch))
    return out
