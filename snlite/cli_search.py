"""``snlite maxbatch NET`` and ``snlite maxdepth``: the paper's Tables 5 and 4, simulated. A binary
search (:mod:`snlite.search`) on the meta device for the largest batch, or the deepest ImageNet
ResNet, that fits a budget under each strategy, with what each found peak holds by kind and the
paper's figures alongside."""
from __future__ import annotations

import argparse
import os
import time

from snlite import measure, search
from snlite.config import CHOICES
from snlite.cli_args import (EXIT_DOES_NOT_FIT, Status, _batch, _budget, _host_budget, _positive_int,
                             UsageError, add_quiet_flag)
from snlite.cli_common import (KIND_NOTE, add_json_flag, add_net_argument, builder_of, kind_table, net_json,
                               text_table, write_json)

PAPER_GPU = "12 GB K40"


# ---------------------------------------------------------------- the arguments
def add_search_commands(sub) -> None:
    """``maxbatch`` and ``maxdepth``: what each searches over, then the flags they share."""
    p = _search_parser(sub, "maxbatch", "the largest batch", 5)
    add_net_argument(p)
    p.add_argument("--max-batch", type=_batch, default=search.MAX_BATCH,
                   help=f"the ceiling: search no further (default {search.MAX_BATCH:,d})")
    _add_search_flags(p)
    p = _search_parser(sub, "maxdepth", "the deepest ImageNet ResNet", 4)
    p.add_argument("--batch", type=_batch, default=16, help="images per step (default 16, the paper's)")
    p.add_argument("--max-units", type=_max_units, default=search.MAX_UNITS,
                   help=f"the ceiling: search no deeper than this many residual units (at least "
                        f"{search.MIN_UNITS}, ResNet-50's; default {search.MAX_UNITS:,d}: depth "
                        f"{3 * search.MAX_UNITS + 2:,d}, a search of about a minute; lower where the "
                        f"planner would need more of this machine's memory than is free)")
    _add_search_flags(p)


def _search_parser(sub, name: str, what: str, table: int):
    return sub.add_parser(name, help=f"{what} that fits a budget, per strategy (the paper's Table {table})",
                          description=f"Binary search, on the meta device, for {what} that fits --budget "
                                      "under baseline, liveness, + offload, + recompute (cost_aware) and "
                                      "superneurons (with the cache and dynamic workspace). Everything "
                                      "counts (count all): a GPU holds the weights, gradients and momentum "
                                      f"too. The paper's figures ({PAPER_GPU}) are shown alongside.")


def _add_search_flags(p) -> None:
    p.add_argument("--host-budget", type=_host_budget, metavar="SIZE", default=None,
                   help="pinned host memory (offloaded and cached tensors, momentum on the host): a plan "
                        "that needs more does not fit (default: unlimited)")
    p.add_argument("--budget", type=_budget, metavar="SIZE", default=measure.parse_size("12GiB"),
                   help="device memory (default 12GiB)")
    p.add_argument("--fit", choices=CHOICES["fit"], default="first",
                   help="how every strategy's arena offsets are chosen: first fit (the paper's, the "
                        "default), best fit, or offline (after the walk, knowing every lifetime: a smaller "
                        "arena)")
    add_json_flag(p)
    add_quiet_flag(p)


def _max_units(text: str) -> int:
    value = _positive_int(text)
    if value < search.MIN_UNITS:
        raise argparse.ArgumentTypeError(f"expected at least {search.MIN_UNITS} (ResNet-50's residual units, "
                                         f"the shallowest ImageNet ResNet), got {value}")
    return value


# ---------------------------------------------------------------- how deep maxdepth may look
def free_memory_bytes() -> int | None:
    """This machine's memory available to a new process (Linux: MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def planner_ceiling(max_units: int, free: int | None = -1) -> tuple[int, str]:
    """(the deepest ResNet maxdepth probes, in residual units, and why there): ``max_units``, or fewer
    where planning that network would hold more of this machine's memory than is free (the planner
    keeps the whole program, about PLANNER_BYTES_PER_UNIT a residual unit, in host RAM)."""
    free = free_memory_bytes() if free == -1 else free
    reach = search.MIN_UNITS if free is None else max(search.MIN_UNITS, free // search.PLANNER_BYTES_PER_UNIT)
    if free is not None and reach < max_units:
        return reach, (f"planning a deeper ResNet would hold more than the {measure.format_size(free)} of "
                       "this machine's memory that is free, about "
                       f"{measure.format_size(search.PLANNER_BYTES_PER_UNIT)} a residual unit")
    if max_units == search.MAX_UNITS:
        return max_units, f"--max-units, default {search.MAX_UNITS:,d}, so that a search ends in about a " \
                          "minute"
    return max_units, f"--max-units {max_units:,d}"


# ---------------------------------------------------------------- the commands
def found_json(rows, key: str) -> list[dict]:
    """The rows of a search (search.Found) as plain data, the value found under ``key``."""
    return [{"strategy": r.label, "config": r.config.describe(), key: r.value, "next": r.next_value,
             "capped": r.capped, "stopped_by": r.stopped_by,
             "peak_bytes": r.trace.peak_bytes if r.trace else None,
             "host_peak_bytes": r.host_peak_bytes, "by_kind": measure.by_kind_json(r.trace),
             "probes": r.probes, "seconds": r.seconds} for r in rows]


def host_words(args) -> str:
    """What --host-budget adds to "does not fit": " and SIZE of pinned host memory", or nothing."""
    return f" and {measure.format_size(args.host_budget)} of pinned host memory" if args.host_budget else ""


def fit_words(args) -> str:
    """What --fit adds to the heading: where the offsets are not first fit's, how they are chosen."""
    return "" if args.fit == "first" else f", every arena offset by fit={args.fit}"


def found_cell(r) -> str:
    return "none" if r.value is None else (f">= {r.value:,d}" if r.capped else f"{r.value:,d}")


def stopped_cells(args, r) -> list[str]:
    """Under --host-budget, the memory the next candidate ran out of (device or host), as a cell."""
    return [r.stopped_by or "-"] if args.host_budget else []


def cmd_maxbatch(args) -> int:
    build = builder_of(args)
    lo, why = search.smallest_batch(build)  # an unknown name fails here, before the search
    if args.max_batch < lo:
        raise UsageError(f"--max-batch {args.max_batch} is below {args.net}'s smallest valid batch, {lo} "
                         f"(a batch of 1 is no valid input here: {why}); give --max-batch {lo} or more")
    t0 = time.perf_counter()
    status = Status("snlite maxbatch", args.quiet)
    rows = search.max_batch_table(build, args.budget, args.max_batch, progress=status,
                                  host_budget_bytes=args.host_budget, fit=args.fit, lo=lo)
    status.clear()
    seconds = time.perf_counter() - t0
    status_code = 0 if any(r.value is not None for r in rows) else EXIT_DOES_NOT_FIT
    if args.json:
        write_json(args.json, {**net_json(args), "budget_bytes": args.budget,
                               "host_budget_bytes": args.host_budget, "count": "all", "fit": args.fit,
                               "smallest_batch": lo, "rows": found_json(rows, "batch"), "seconds": seconds})
        if args.json == "-":
            return status_code
    paper = search.PAPER_BATCH.get(args.net.lower())
    other = search.PAPER_BEST_OTHER_BATCH.get(args.net.lower())
    print(f"largest batch of {args.net} in {measure.format_size(args.budget)}{host_words(args)}, simulated "
          "on the meta device (count all: weights, gradients, momentum, the batch, activations and workspace "
          "all on the device)" + fit_words(args))
    head = ["strategy", "batch", "peak", "host memory", "probes"]
    head += (["stopped by"] if args.host_budget else []) + (["paper"] if paper else [])
    table = [[r.label, found_cell(r), measure.format_size(r.trace.peak_bytes if r.trace else None),
              measure.format_size(r.host_peak_bytes), r.probes] + stopped_cells(args, r)
             + ([f"{paper:,d}" if r.label == "superneurons" else ""] if paper else []) for r in rows]
    print(text_table(head, table))
    print("\n" + kind_table([(r.label, r.trace) for r in rows]) + "\n" + KIND_NOTE)
    if paper:
        print(f"paper ({PAPER_GPU}, docs/paper.md section 7): SuperNeurons {paper:,d}; the best other "
              f"framework {other:,d}")
    if any(r.capped for r in rows):
        print(f">=: still fits at the ceiling, batch {args.max_batch:,d} (--max-batch, default "
              f"{search.MAX_BATCH:,d}: the search probes no further); raise it with --max-batch")
    if why:
        print(f"the search starts at batch {lo}: a batch of 1 is no valid input here ({why})")
    if status_code:
        print(f"not even a batch of {lo} fits {measure.format_size(args.budget)} under any strategy"
              + host_words(args))
    print(f"took {seconds:.1f} s")
    return status_code


def cmd_maxdepth(args) -> int:
    t0 = time.perf_counter()
    units, why = planner_ceiling(args.max_units)
    status = Status("snlite maxdepth", args.quiet)
    rows = search.max_depth_table(args.batch, args.budget, units, progress=status,
                                  host_budget_bytes=args.host_budget, fit=args.fit)
    status.clear()
    seconds = time.perf_counter() - t0
    status_code = 0 if any(r.value is not None for r in rows) else EXIT_DOES_NOT_FIT
    if args.json:
        write_json(args.json, {"batch": args.batch, "budget_bytes": args.budget,
                               "host_budget_bytes": args.host_budget, "count": "all", "fit": args.fit,
                               "rows": found_json(rows, "depth"), "seconds": seconds})
        if args.json == "-":
            return status_code
    print(f"deepest ImageNet ResNet (depth = 3 * residual units + 2) at batch {args.batch} in "
          f"{measure.format_size(args.budget)}{host_words(args)}, simulated on the meta device (count all: "
          "weights, gradients, momentum, the batch, activations and workspace all on the device)"
          + fit_words(args))
    paper = search.PAPER_DEPTH_AT_BATCH.get(args.batch)
    head = ["strategy", "depth", "units", "peak", "host memory", "probes", "time"]
    head += (["stopped by"] if args.host_budget else []) + (["paper"] if paper else [])
    table = [[r.label, found_cell(r), "-" if r.value is None else f"{(r.value - 2) // 3:,d}",
              measure.format_size(r.trace.peak_bytes if r.trace else None),
              measure.format_size(r.host_peak_bytes), r.probes, f"{r.seconds:.1f} s"]
             + stopped_cells(args, r)
             + ([f"{paper:,d}" if r.label == "superneurons" else ""] if paper else []) for r in rows]
    print(text_table(head, table))
    print("\n" + kind_table([(r.label, r.trace) for r in rows]) + "\n" + KIND_NOTE)
    deepest = search.resnet_units(units)[-1]  # the deepest valid ResNet within the ceiling
    within = "" if deepest == units else f", the deepest valid ResNet within {units:,d}"
    if any(r.capped for r in rows):
        print(f">=: still fits at the ceiling {3 * deepest + 2:,d} ({deepest:,d} residual units{within}; "
              f"{why}); raise it with --max-units")
    elif units < args.max_units:
        print(f"(the search's ceiling was {3 * deepest + 2:,d}, {deepest:,d} residual units: {why})")
    print(f"paper ({PAPER_GPU}, docs/paper.md section 7): at batch 16 "
          + ", ".join(f"{k} {v:,d}" for k, v in search.PAPER_DEPTH.items())
          + f"; at batch 1 SuperNeurons {search.PAPER_DEPTH_AT_BATCH[1]:,d} (2,500 residual units)")
    if status_code:
        print(f"not even ResNet-50 fits {measure.format_size(args.budget)} at batch {args.batch} under any "
              "strategy" + host_words(args))
    print(f"took {seconds:.1f} s")
    return status_code
