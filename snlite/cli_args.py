"""Pieces every ``snlite`` subcommand shares: the one-line error, argument types, and the
memory flags (one flag per MemoryConfig field, read in one place)."""
from __future__ import annotations

import argparse

import numpy as np

from snlite import measure
from snlite.config import CHOICES, MemoryConfig

EXIT_DOES_NOT_FIT = 3


class CliError(Exception):
    """A problem the user can fix, reported as one line."""


# ---------------------------------------------------------------- argument types
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _float_in(low, high, low_open=False, what="a number"):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not np.isfinite(value) or value < low or (low_open and value == low) or (high is not None and value >= high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value
    return parse


def _size(text: str) -> int:
    try:
        return measure.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---------------------------------------------------------------- the memory flags (one place)
MEMORY_FLAGS = ("liveness", "offload", "cache", "recompute", "workspace", "allocator", "fit", "count")


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`MemoryConfig` field, plus ``--preset``; see :func:`memory_config`."""
    g = parser.add_argument_group("memory configuration (snlite.MemoryConfig; a flag overrides --preset, "
                                  "wherever it appears)")
    g.add_argument("--preset", choices=("baseline", "superneurons"), default="baseline",
                   help="start from MemoryConfig.baseline() (nothing on, the default) or .superneurons() "
                        "(liveness, offload, cache, cost_aware recompute, dynamic workspace)")
    for name, what in (("liveness", "free each tensor after its last use"),
                       ("offload", "copy CONV outputs to pinned host memory and back"),
                       ("cache", "LRU tensor cache: move data only when an allocation would fail")):
        g.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None, help=what)
    helps = {"recompute": "drop cheap layers' outputs, rebuild them in backward",
             "workspace": "convolution workspace: none (direct), fastest, dynamic (fastest that fits now)",
             "allocator": "pool (one arena, the paper's) or raw (one allocation per tensor)",
             "fit": "the pool's free-block search", "count": "what the trace's peak counts: all "
             "(everything on the device) or paper (activations + gradients)"}
    for name, text in helps.items():
        g.add_argument(f"--{name}", choices=CHOICES[name], default=None, help=text)
    g.add_argument("--budget", type=_size, metavar="SIZE", default=None,
                   help="device memory budget, e.g. 12GiB, 1.5GB, 500MB, 4096 (default: unlimited)")
    g.add_argument("--host-budget", type=_size, metavar="SIZE", default=None,
                   help="pinned host memory budget (offloaded tensors, the staged batch, results; default: "
                        "unlimited)")


def memory_config(args) -> MemoryConfig:
    """The MemoryConfig the flags of :func:`add_memory_flags` ask for."""
    base = MemoryConfig.superneurons() if args.preset == "superneurons" else MemoryConfig.baseline()
    changes = {n: getattr(args, n) for n in MEMORY_FLAGS if getattr(args, n) is not None}
    if args.budget is not None:
        changes["budget_bytes"] = args.budget
    if args.host_budget is not None:
        changes["host_budget_bytes"] = args.host_budget
    return base.replace(**changes)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
