"""``snlite optimal NET``: SuperNeurons' recomputation and sqrt(N) checkpointing against the exact planner
(:mod:`snlite.optimal`, :mod:`snlite.gap`). Needs scipy (``pip install -e '.[optimal]'``)."""
from __future__ import annotations

import argparse
import time

from snlite import gap, measure
from snlite.cli_args import Status, _batch, _budget, add_quiet_flag
from snlite.cli_common import (BATCH_HELP, add_json_flag, add_net_argument, draw, graph_of, net_json,
                               text_table, write_json)
from snlite.errors import BudgetError


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a time limit > 0 seconds, got {text!r}")
    return value


def add_optimal_command(sub) -> None:
    p = sub.add_parser("optimal",
                       help="the exact least-memory recomputation plan vs the heuristics (needs scipy)",
                       description="Solve an integer program (HiGHS, through scipy) for the best plan that "
                                   "drops layers' outputs after forward and re-runs them in backward, with "
                                   "memory counted as the trace counts it, and print it next to "
                                   "SuperNeurons' speed-/memory-centric and cost-aware recomputation and "
                                   "sqrt(N) checkpointing (liveness on, nothing offloaded): each one's peak, "
                                   "extra FLOPs, bytes moved, the least peak any plan reaches with the same "
                                   "extra FLOPs, and the gap. Practical for small networks (LeNet, AlexNet, "
                                   "VGG-16, mini_inception at a small batch; CIFAR ResNet-20's least peak in "
                                   "seconds, its FLOP-limited questions not); a larger one stops at "
                                   "--time-limit with the best plan found and its gap.")
    add_net_argument(p)
    p.add_argument("--batch", type=_batch, default=None, help=BATCH_HELP)
    p.add_argument("--budget", type=_budget, metavar="SIZE", default=None,
                   help="the optimum row: the fewest extra FLOPs with a peak of at most SIZE (default: the "
                        "least peak); the peak in --count, not the arena, which fragmentation can make "
                        "larger")
    p.add_argument("--count", choices=("all", "paper"), default="all",
                   help="what a peak counts: all (every pool block, weights included; default) or paper "
                        "(activations and gradients at their own sizes)")
    p.add_argument("--reruns", choices=("any", "once"), default="any",
                   help="the plans searched: any (a dropped layer re-run before any step that needs it, as "
                        "often as it pays; holds speed- and memory-centric; default) or once (each re-run "
                        "once, just in time, kept until its last use: a smaller program)")
    p.add_argument("--time-limit", type=_seconds, default=60.0, metavar="SECONDS",
                   help="per solver call (default 60); a call that stops there reports its gap")
    p.add_argument("--offload", action="store_true",
                   help="also the second exact model, offload only: SuperNeurons' offload of CONV outputs "
                        "against the least peak for its bytes moved, and the offload optimum (any activation "
                        "may go)")
    add_json_flag(p)
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the exact peak vs extra-FLOP frontier (sampled at 0 to 100%% of a forward "
                        "pass) with each heuristic as a point (.png, .svg or .pdf; needs matplotlib)")
    add_quiet_flag(p)


def cmd_optimal(args) -> int:
    try:
        import scipy  # noqa: F401
    except ImportError:
        raise ImportError("snlite optimal needs scipy >= 1.11: pip install -e '.[optimal]'") from None
    _, graph, batch = graph_of(args)
    status = Status("snlite optimal", args.quiet)
    t0 = time.perf_counter()
    try:
        rows = gap.gap_rows(graph, args.count, args.budget, args.time_limit, progress=status,
                            reruns=args.reruns)
    except BudgetError as e:  # no plan within --budget: --json says so too, then exit 3 with the line
        status.clear()
        if args.json:
            write_json(args.json, {**net_json(args), "batch": batch, "count": args.count,
                                   "reruns": args.reruns, "budget_bytes": args.budget, "fits": False,
                                   "error": str(e), "least_peak_bytes": getattr(e, "least_peak_bytes", None)})
        raise
    moves = []
    if args.offload:
        status(f"{graph.name}: the offload program")
        moves = gap.offload_rows(graph, args.count, args.time_limit)
    points = []
    if args.plot:
        status(f"{graph.name}: the exact frontier")
        points = gap.frontier(graph, args.count, time_limit=args.time_limit, reruns=args.reruns)
    status.clear()
    seconds = time.perf_counter() - t0
    fwd = graph.flops()
    if args.json:
        write_json(args.json, {**net_json(args), "batch": batch, "count": args.count, "reruns": args.reruns,
                               "budget_bytes": args.budget, "fits": True, "forward_flops": fwd,
                               "seconds": seconds,
                               "rows": [dict(vars(r), gap_pct=r.gap_pct) for r in rows],
                               "offload_rows": [dict(vars(r), gap_pct=r.gap_pct) for r in moves],
                               "frontier": [{"peak_bytes": p.peak_bytes, "extra_flops": p.extra_flops,
                                             "status": p.status} for p in points]})
    if args.plot:
        pts = [{"label": f"exact {i + 1}", "peak_bytes": p.peak_bytes, "extra_flops": p.extra_flops,
                "base_flops": fwd} for i, p in enumerate(points) if p.plan is not None]
        pts += [{"label": r.label, "peak_bytes": r.peak_bytes, "extra_flops": r.extra_flops,
                 "base_flops": fwd} for r in rows]
        draw(args, "plot", "plot_tradeoff", pts,
             title=f"{graph.name}, batch {batch}: exact frontier and heuristics")
    if args.json == "-":
        return 0
    print_recompute_rows(args, graph, batch, rows, seconds)
    if moves:
        print_offload_rows(moves)
    unproven = [r.label for r in rows + moves if r.status != "optimal"]
    if unproven:
        print(f"not proven ({len(unproven)} of {len(rows) + len(moves)} rows): the solver stopped at "
              f"--time-limit {args.time_limit:g} s; their least peaks and fewest FLOPs are the best plans "
              "found, not the optimum, and a gap there can be negative. A smaller batch does not help (the "
              "program's size depends on the layers); a longer --time-limit may.")
    return 0


def print_recompute_rows(args, graph, batch: int, rows, seconds: float) -> None:
    """Each recomputation strategy against the exact planner, and what the gap means."""
    fwd = graph.flops()
    best = rows[-1]
    print(f"{graph.name}, batch {batch}: {len(graph.layers)} layers, {fwd / 1e9:,.2f} GFLOPs forward; peaks "
          f"in the {args.count} count; liveness on, nothing offloaded")
    head = ["strategy", "peak", "extra FLOPs", "moved", "least peak, same FLOPs", "gap",
            "fewest FLOPs, same peak", "solver"]
    table = [[r.label, measure.format_size(r.peak_bytes), f"{100 * r.extra_flops / fwd:.1f}%",
              measure.format_size(r.moved_bytes), measure.format_size(r.best_peak_bytes),
              "-" if r.gap_pct is None else f"{r.gap_pct:+.1f}%",
              "-" if r.fewest_flops is None else f"{100 * r.fewest_flops / fwd:.1f}%",
              r.status + ("" if r.gap in (None, 0.0) else f" (gap {100 * r.gap:.1f}%)")] for r in rows]
    print(text_table(head, table))
    space = ("re-runs each dropped layer as often as it pays (this holds speed- and memory-centric's plans, "
             "so the gap is never negative)" if args.reruns == "any" else
             "re-runs each dropped layer once (memory-centric re-runs layers several times, so it can be "
             "below: a negative gap)")
    print(f"gap: how far a peak is above the least peak of any plan that {space}, with at most the same "
          f"extra FLOPs. The optimum, {'proven' if best.status == 'optimal' else best.status}, took "
          f"{best.solve_s:.1f} s; all rows {seconds:.1f} s.")


def print_offload_rows(moves) -> None:
    """SuperNeurons' offload against the exact offload model (--offload)."""
    head = ["offload", "peak", "moved", "least peak, same bytes moved", "gap",
            "fewest bytes moved, same peak", "solver"]
    print()
    print(text_table(head, [[r.label, measure.format_size(r.peak_bytes), measure.format_size(r.moved_bytes),
                             measure.format_size(r.best_peak_bytes), f"{r.gap_pct:+.1f}%",
                             measure.format_size(r.fewest_moved), r.status] for r in moves]))
    print("offload: nothing recomputed; the exact model may send any activation to the host (copied out "
          "right after its write, released after its last forward read) and picks when each comes back.")
