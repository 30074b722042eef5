"""Liveness analysis (docs/paper.md section 3), on plain data.

Each route step has an ``in`` set (tensors live before it) and an ``out`` set (live after it).
A tensor enters the live set at its first use and leaves it right after the last step, forward
or backward, that reads or writes it. The paper builds the sets in O(N^2); here one pass records
every tensor's last use, and a second pass builds the sets, so the work is O(N + total uses)
(plus the size of the sets themselves when they are materialised for printing).

Persistent tensors (weights, their gradients, optimizer state) are excluded: they live for the
whole run and liveness never frees them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepLiveness:
    """What liveness decides for one step: the live sets, and what it frees after the step."""

    step: int
    live_in: tuple[str, ...]
    live_out: tuple[str, ...]
    frees: tuple[str, ...]  # tensors whose last use is this step


def step_tensors(reads, writes, inplace=()) -> set[str]:
    """The tensors one step holds at once, each once: what it reads and what it writes, where a
    tensor written into another's buffer (``inplace``: (new, old) pairs, e.g. dx into dy's) is the
    same buffer and counted once. Their bytes are the step's working set, the paper's l_i, and the
    largest over the route is l_peak (:func:`snlite.recompute.step_bytes`,
    :func:`snlite.trace.trace_program`)."""
    if not inplace:  # most steps: nothing to leave out
        return {*reads, *writes}
    new = {n for n, _ in inplace}
    return {t for t in (*reads, *writes) if t not in new}


def first_and_last_use(steps, persistent=frozenset()) -> tuple[dict[str, int], dict[str, int]]:
    """Index of the first and last step that reads or writes each non-persistent tensor.

    Assignment 1 (liveness analysis), part 1. Requirements, checked by ``pytest -m a1``:

    - ``first[t]`` and ``last[t]`` are the positions in ``steps`` of the first and the last step
      whose ``reads`` or ``writes`` name ``t``, forward or backward;
    - a tensor in ``persistent`` is in neither dict (weights live for the whole run);
    - O(N + total uses): one pass over the route records the last uses; the paper's construction,
      which rescans the route for every step, is O(N^2).
    """
    # BEGIN ASSIGNMENT 1: liveness analysis
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for t in (*step.reads, *step.writes):
            if t in persistent:
                continue
            first.setdefault(t, i)
            last[t] = i
    return first, last
    # END ASSIGNMENT 1


def frees_after(steps, persistent=frozenset()) -> dict[int, list[str]]:
    """step -> the tensors to free right after it (their last use), in order of first use.
    What the scheduler needs, in O(total uses): no live sets are built."""
    first, last = first_and_last_use(steps, persistent)
    out: dict[int, list[str]] = {}
    for t in sorted(last, key=first.__getitem__):
        out.setdefault(last[t], []).append(t)
    return out


def analyze(steps, persistent=frozenset()) -> list[StepLiveness]:
    """In/out sets and frees for every step. ``steps`` need ``reads`` and ``writes``.

    Assignment 1 (liveness analysis), part 2. Requirements, checked by ``pytest -m a1``:

    - one :class:`StepLiveness` per step, in route order, ``step`` being its position;
    - a tensor enters the live set at its first use and leaves it right after its last use:
      ``live_in`` of step i holds the tensors with first use < i <= last use, ``live_out`` those
      with first use <= i < last use, so ``live_out`` of a step is ``live_in`` of the next and
      the route ends with nothing live (the Fig. 4 table of docs/paper.md section 3, exactly);
    - ``frees`` of step i: the tensors whose last use is step i, so each tensor is freed once,
      right after its last use, and a freed tensor is never in ``live_out``;
    - persistent tensors never appear;
    - every tuple lists its tensors in order of first use, ties in the order they appear in
      the step (its reads, then its writes), so plans are deterministic;
    - O(N + total uses + size of the sets): one pass to record the last uses (use
      :func:`first_and_last_use`), one to walk the route with a live set; no rescans.
    """
    # BEGIN ASSIGNMENT 1: liveness analysis
    first, last = first_and_last_use(steps, persistent)
    frees_at: dict[int, list[str]] = {}
    for t, i in last.items():
        frees_at.setdefault(i, []).append(t)
    live: dict[str, None] = {}  # insertion-ordered set: tensors in order of first use
    out = []
    for i, step in enumerate(steps):
        live_in = tuple(live)
        for t in (*step.reads, *step.writes):
            if t not in persistent:
                live.setdefault(t)
        frees = tuple(sorted(frees_at[i], key=first.__getitem__)) if i in frees_at else ()
        for t in frees:
            del live[t]
        out.append(StepLiveness(i, live_in, tuple(live), frees))
    return out
    # END ASSIGNMENT 1


def format_table(result: list[StepLiveness], labels=None) -> str:
    """The in/out table of the paper's Fig. 4 (docs/paper.md section 3), one row per step."""
    rows = [f"{'step':>4}  {'':16} {'in':40} out"]
    for r in result:
        label = labels[r.step] if labels else ""
        rows.append(f"{r.step:>4}  {label:16} {'{' + ','.join(r.live_in) + '}':40} "
                    f"{'{' + ','.join(r.live_out) + '}'}")
    return "\n".join(rows)
