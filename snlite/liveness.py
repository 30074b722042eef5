"""Liveness analysis (PAPER.md section 3), on plain data.

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


def first_and_last_use(steps, persistent=frozenset()) -> tuple[dict[str, int], dict[str, int]]:
    """Index of the first and last step that reads or writes each non-persistent tensor."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for t in (*step.reads, *step.writes):
            if t in persistent:
                continue
            first.setdefault(t, i)
            last[t] = i
    return first, last


def frees_after(steps, persistent=frozenset()) -> dict[int, list[str]]:
    """step -> the tensors to free right after it (their last use), in order of first use.
    What the scheduler needs, in O(total uses): no live sets are built."""
    first, last = first_and_last_use(steps, persistent)
    out: dict[int, list[str]] = {}
    for t in sorted(last, key=first.__getitem__):
        out.setdefault(last[t], []).append(t)
    return out


def analyze(steps, persistent=frozenset()) -> list[StepLiveness]:
    """In/out sets and frees for every step. ``steps`` need ``reads`` and ``writes``."""
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


def format_table(result: list[StepLiveness], labels=None) -> str:
    """The in/out table of PAPER.md's Fig. 4, one row per step."""
    rows = [f"{'step':>4}  {'':16} {'in':40} out"]
    for r in result:
        label = labels[r.step] if labels else ""
        rows.append(f"{r.step:>4}  {label:16} {'{' + ','.join(r.live_in) + '}':40} {'{' + ','.join(r.live_out) + '}'}")
    return "\n".join(rows)
