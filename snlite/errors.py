"""What a plan that does not fit says: the two errors of the planner and the messages that explain
a budget too small (where it ran out, what needed room, what was live there).

The messages are built from plain data (names and byte counts), so a student can call them alone and
a search can show them unchanged.
"""
from __future__ import annotations

SHOWN = 8  # live tensors named in a message; the rest are counted


class BudgetError(MemoryError):
    """The plan does not fit the memory budget; says where, what was live, and what would fit."""


class HostBudgetError(BudgetError):
    """What ran out is the pinned host memory budget (``host_budget_bytes``), not the device's."""


class PlanError(RuntimeError):
    """A plan asked an op to read a tensor that is not resident (a scheduler bug)."""


def where(graph, step) -> str:
    """``at step 12 (conv3 backward)``; step -1 is the SGD updates after backward."""
    if step == -1:
        return "in the SGD updates after backward"
    s = graph.steps()[step]
    return f"at step {step} ({s.layer} {s.phase})"


def _named(held: list[tuple[str, int]]) -> str:
    more = f" and {len(held) - SHOWN} more" if len(held) > SHOWN else ""
    return ", ".join(f"{n} ({b:,d} B)" for n, b in held[:SHOWN]) + more


def device_message(graph, describe: str, capacity: int, tensor: str, nbytes: int, step, largest: int,
                   live: list[tuple[str, int]]) -> str:
    """The arena is full: ``tensor`` needs ``nbytes`` at ``step`` but the largest free block is
    ``largest``; ``live`` names what was resident there, (name, bytes) pairs."""
    at = "while placing the weights and optimizer state" if step == "setup" else where(graph, step)
    live = sorted(live, key=lambda p: -p[1])
    return (f"{graph.name} does not fit a budget of {capacity:,d} bytes under {describe}: {at}, {tensor} "
            f"needs {nbytes:,d} bytes but the largest free block is {largest:,d} bytes. "
            + (f"Live there: {_named(live)}." if live else "Nothing else was live there."))


def host_message(graph, describe: str, host_budget: int, tensor: str, nbytes: int, step, largest: int,
                 held: list[tuple[str, int]], staging: list[tuple[str, int]]) -> str:
    """The pinned slab is full: ``held`` is what waits on the host, ``staging`` the fixed slots."""
    held = sorted(held, key=lambda p: -p[1]) + staging
    return (f"{graph.name} does not fit a host budget of {host_budget:,d} bytes of pinned memory under "
            f"{describe}: {where(graph, step)}, {tensor} needs {nbytes:,d} bytes but the largest free slot "
            f"is {largest:,d} bytes. "
            + (f"On the host there: {_named(held)}." if held else "Nothing else was on the host there."))


def staging_message(graph, describe: str, host_budget: int, state_bytes: int, staging_bytes: int) -> str:
    """The pinned slab cannot even hold its fixed slots (the batch in, the results out)."""
    state = f"with the optimizer state waiting there ({state_bytes:,d} bytes), " if state_bytes else ""
    return (f"{graph.name} does not fit a host budget of {host_budget:,d} bytes of pinned memory under "
            f"{describe}: {state}while staging the batch, the input, its labels and the results need "
            f"{staging_bytes:,d} bytes")
