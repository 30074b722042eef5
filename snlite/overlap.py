"""Copies hidden behind compute: the eager offload schedule moved in time for a GPU (``schedule``).

The paper's schedule (:mod:`snlite.offload`) says *where* in the route each CONV output leaves and comes
back: out after its forward, its block released when the next CONV starts, back when backward reaches
the CONV after it. Whether the compute stream then waits depends on time: a 220 MiB copy takes 4 ms over
PCIe, the three cheap layers after AlexNet's conv1 a fraction of that, so compute stalls at the release.
With ``MemoryConfig(schedule="H200")`` (a GPU of :data:`snlite.timing.PROFILES`) the plan is retimed
against that GPU's estimated timeline (:func:`retime`):

- **release**: at the first op at or after the paper's release point where the copy out has finished
  (the copy stream runs its copies one after another);
- **prefetch**: at the latest op from which the copy back lands before the first op that reads the
  tensor, the copy-in stream's earlier copies included: no earlier (the block would be held for
  nothing), no later (compute would wait);

and kept only if the program's peak does not rise: a retimed transfer whose held window covers the
new peak goes back to the paper's points, and the check repeats. The numbers never change (the same
ops, the same copies, only their positions), which every flag-combination test checks.
"""
from __future__ import annotations

import bisect

from snlite import timing
from snlite.offload import Transfer
from snlite.program import Launch

MAX_ROUNDS = 6  # peak checks before giving up on the transfers that still raise it


def retime(graph, config, plan, costs=None) -> object:
    """``plan`` with its transfers retimed for the GPU ``config.schedule`` (see the module docstring);
    the plan itself where there is nothing to retime or every retiming would raise the peak."""
    if config.schedule == "paper" or not plan.transfers:
        return plan
    from snlite import placement
    from snlite.trace import trace_program

    paper = config.replace(schedule="paper")
    mode = "train" if any(p.op.phase == "update" for p in plan.ops) else "grads"  # updates inside backward: train
    program = placement.place(graph, paper, mode, plan=plan, costs=costs)
    peak = trace_program(program, "all").peak_bytes
    start = _op_starts(program, graph, config.schedule, len(plan.ops))
    prof = timing.profile(config.schedule)
    nbytes = {tr.tensor: graph.tensors()[tr.tensor].nbytes for tr in plan.transfers}
    moved = _queue_prefetches(_releases(plan, start, nbytes, prof), plan, start, nbytes, prof)
    for _ in range(MAX_ROUNDS):
        if moved == plan.transfers:
            return plan
        candidate = plan.with_transfers(moved)
        try:
            trace = trace_program(placement.place(graph, paper, mode, plan=candidate, costs=costs), "all")
        except placement.BudgetError:  # held longer, a block no longer fits the budget somewhere
            trace = None
        if trace is not None and trace.peak_bytes <= peak:
            return candidate
        at = trace.steps[trace.peak_op].op if trace is not None else None
        reverted = [old if at is None or _holds(new, old, at) else new for new, old in zip(moved, plan.transfers)]
        if reverted == moved:
            return plan
        moved = reverted
    return plan


def _holds(new: Transfer, old: Transfer, op: int) -> bool:
    """Whether the retimed transfer holds its device block at ``op`` where the paper's did not."""
    late_release = old.release_before <= op < new.release_before
    early_prefetch = new.prefetch_before is not None and new.prefetch_before <= op < old.prefetch_before
    return late_release or early_prefetch


def _op_starts(program, graph, gpu: str, n_ops: int) -> list[float]:
    """Estimated start time (ms) of every op of the plan if compute never waited: the sum of the
    kernel times of the ops before it (``start[n_ops]``: the end of the last)."""
    costs = timing._Costs(graph, program, timing.profile(gpu))
    ms = [0.0] * n_ops
    for ins in program.body:
        if type(ins) is Launch and ins.op >= 0:
            ms[ins.op] = costs.launch(ins)[0]
    start = [0.0]
    for d in ms:
        start.append(start[-1] + d)
    return start


def _copy_ms(nbytes: int, gbs: float, prof) -> float:
    return prof.copy_latency_us * 1e-3 + nbytes / (gbs * 1e6)


def _releases(plan, start, nbytes: dict, prof) -> list[Transfer]:
    """Each release moved to the first op at which the copy out has landed (copies out run one after
    another on copy_out, in forward order), never past the tensor's prefetch."""
    out, free = [], 0.0
    for tr in plan.transfers:
        begin = max(start[tr.offload_after + 1], free)
        free = end = begin + _copy_ms(nbytes[tr.tensor], prof.d2h_gbs, prof)
        limit = tr.prefetch_before if tr.prefetch_before is not None else len(plan.ops)
        release = bisect.bisect_left(start, end, lo=tr.release_before, hi=max(limit - 1, tr.release_before))
        out.append(Transfer(tr.tensor, tr.offload_after, release, tr.prefetch_before))
    return out


def _queue_prefetches(moved, plan, start, nbytes: dict, prof) -> list[Transfer]:
    """Each prefetch at the latest op from which it lands before its first reader, taking the copy-in
    stream's queue into account (planned backwards from the last one needed)."""
    first_read = {}
    for tr in moved:
        if tr.prefetch_before is None:
            continue
        first_read[tr.tensor] = next((p.op.index for p in plan.ops[tr.release_before:]
                                      if tr.tensor in p.op.reads), tr.prefetch_before)
    order = sorted((tr for tr in moved if tr.prefetch_before is not None), key=lambda t: first_read[t.tensor])
    out = {tr.tensor: tr for tr in moved}
    next_begin = float("inf")
    for tr in reversed(order):
        need = first_read[tr.tensor]
        land = min(start[need], next_begin)
        begin = land - _copy_ms(nbytes[tr.tensor], prof.h2d_gbs, prof)
        op = bisect.bisect_right(start, begin, hi=need) - 1  # the latest op starting at or before it
        op = min(max(op, tr.release_before + 1), need)
        next_begin = start[op]
        out[tr.tensor] = Transfer(tr.tensor, tr.offload_after, tr.release_before, op)
    return [out[tr.tensor] for tr in moved]
