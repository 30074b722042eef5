"""``snlite compare NET``: one row per memory strategy (baseline, liveness, + offload, + the cache,
+ each recomputation, sqrt(N) checkpointing; with --optimal, the exact planner's plan), simulated on
the meta device: the peak in both counts, recomputation, bytes moved, the estimated step time, what
each peak holds by kind, and the smallest budget superneurons() runs in."""
from __future__ import annotations

import time

from snlite import budget, measure, offline, optimal, search, timing
from snlite.cli_args import EXIT_DOES_NOT_FIT, CliError, Status, _batch, _budget, _host_budget, add_quiet_flag
from snlite.cli_common import (BATCH_HELP, GPU_HELP, KIND_NOTE, add_json_flag, add_net_argument, draw,
                               graph_of, kind_table, net_json, net_words, ordinal, text_table, write_json)
from snlite.config import CHOICES, MemoryConfig
from snlite.errors import HostBudgetError


def add_compare_command(sub) -> None:
    compare = sub.add_parser("compare", help="one row per memory strategy: peak, recomputation, bytes moved",
                             description="Simulate NET under each strategy: baseline, liveness, + offload, "
                                         "+ offload + cache, + recompute speed / memory / cost_aware (on top "
                                         "of liveness + offload), and sqrt(N) checkpointing (Chen et al. "
                                         "2016) as a reference.")
    add_net_argument(compare)
    compare.add_argument("--batch", type=_batch, default=None, help=BATCH_HELP)
    compare.add_argument("--budget", type=_budget, metavar="SIZE", default=None,
                         help="run every strategy under this budget and say which fit (the cache only moves "
                              "data when memory runs short)")
    compare.add_argument("--host-budget", type=_host_budget, metavar="SIZE", default=None,
                         help="pinned host memory (offloaded and cached tensors, momentum on the host, the "
                              "staged batch): run every strategy under it too, and say which fit and which "
                              "memory ran out")
    compare.add_argument("--plot", metavar="FILE.png",
                         help="draw the trade-off: peak vs extra work (.png, .svg or .pdf; needs matplotlib)")
    compare.add_argument("--gpu", default="H200", metavar="GPU", help=GPU_HELP.format(default="H200"))
    add_json_flag(compare)
    compare.add_argument("--optimal", action="store_true",
                         help="add a row: the exact planner's least-peak recomputation plan, liveness on, "
                              "nothing offloaded (snlite optimal NET says more; needs scipy)")
    compare.add_argument("--fit", nargs="+", choices=CHOICES["fit"], default=["first"], metavar="FIT",
                         help="place every strategy with each FIT (first, best, offline; default first, the "
                              "paper's): the table is the first one's, then each strategy's arena per fit "
                              "against the bytes live at once, and superneurons()' smallest budget per fit")
    add_quiet_flag(compare)


def cmd_compare(args) -> int:
    _, graph, batch = graph_of(args)
    t0 = time.perf_counter()
    status = Status("snlite compare", args.quiet)
    fits_asked = list(dict.fromkeys(args.fit))  # in the order given, each once
    by_fit = {fit: measure.compare(graph, args.budget, status, fit, host_budget_bytes=args.host_budget)
              for fit in fits_asked}
    rows = list(by_fit[fits_asked[0]])  # the main table (with --optimal, one row more)
    if args.optimal:
        status(f"{graph.name}: the exact recomputation plan (snlite optimal)")
        rows.append(optimal_row(graph, args.budget, fits_asked[0], args.host_budget))
    smallest = {}  # fit -> superneurons()' smallest device budget, or the HostBudgetError that rules all out
    for fit in fits_asked:
        status(f"{graph.name}: the smallest budget of {superneurons_label(fit)}")
        config = MemoryConfig.superneurons(fit=fit, host_budget_bytes=args.host_budget)
        try:
            smallest[fit] = search.min_budget(graph, config, superneurons_label(fit))
        except HostBudgetError as e:
            smallest[fit] = e
    preset_fits = {}  # fit -> whether superneurons() fits the budgets asked (no row of the table is it)
    if budgeted(args):
        for fit in fits_asked:
            status(f"{graph.name}: {superneurons_label(fit)} under the budgets")
            preset_fits[fit] = budget.fits(graph, MemoryConfig.superneurons(
                fit=fit, budget_bytes=args.budget, host_budget_bytes=args.host_budget))
    status(f"{graph.name}: step times on the {args.gpu} profile")
    prof = timing.profile(args.gpu)
    timelines = [r.timeline(prof) for r in rows]
    resident = measure.all_resident_ms(graph, prof)
    status.clear()
    seconds = time.perf_counter() - t0
    fitting = [r.label if fit == fits_asked[0] else f"{r.label} (fit={fit})"
               for fit in fits_asked for r in (rows if fit == fits_asked[0] else by_fit[fit]) if r.fits]
    fitting += [superneurons_label(fit) for fit, ok in preset_fits.items() if ok]
    fits = not budgeted(args) or bool(fitting)
    if args.json:
        write_json(args.json, compare_json(args, batch, rows, timelines, prof, resident, smallest, by_fit,
                                           preset_fits))
    if args.plot:
        points = [{"label": r.label, "peak_bytes": r.peak_bytes, "extra_flops": r.trace.extra_flops,
                   "moved_bytes": r.moved_bytes} for r in rows]
        draw(args, "plot", "plot_tradeoff", points, title=f"{graph.name}, batch {batch}")
    if args.json == "-":
        return 0 if fits else EXIT_DOES_NOT_FIT
    print_rows(args, graph, batch, rows, timelines, resident)
    if by_fit.keys() != {"first"}:
        print_arenas(args, by_fit)
    print_notes(args, graph, prof, resident, seconds)
    print_smallest(args, batch, smallest, preset_fits)
    if not fits:
        print_nothing_fits(args, batch)
        return EXIT_DOES_NOT_FIT
    if budgeted(args) and not any(r.fits for r in rows):  # the table says no to every row, but...
        print(f"\nno row of the table fits its {budget_text(args)}; what does: {', '.join(fitting)}")
    return 0


def print_nothing_fits(args, batch: int) -> None:
    """No row fits: the budgets, and the plan command that says why and what would."""
    asked = [f"--budget {args.budget}"] if args.budget is not None else []
    asked += [f"--host-budget {args.host_budget}"] if args.host_budget is not None else []
    host = f"a host budget of {measure.format_size(args.host_budget)}" if args.host_budget else ""
    device = measure.format_size(args.budget) if args.budget is not None else ""
    print(f"\nno strategy fits {device}{' with ' if device and host else ''}{host}: see why, and what "
          f"would, with snlite plan {net_words(args)} --batch {batch} {' '.join(asked)}")


def budgeted(args) -> bool:
    """Whether --budget or --host-budget was given: then every row says whether it fits."""
    return args.budget is not None or args.host_budget is not None


def budget_text(args) -> str:
    """The budgets asked, in words: "budget 850.0 MiB", "host budget 500.0 MiB", or both."""
    parts = [f"budget {measure.format_size(args.budget)}"] if args.budget is not None else []
    if args.host_budget is not None:
        parts.append(f"host budget {measure.format_size(args.host_budget)}")
    return ", ".join(parts)


def print_smallest(args, batch: int, smallest, preset_fits) -> None:
    """superneurons()' smallest device budget under each fit (under --host-budget, where one exists),
    and whether it fits the budgets asked."""
    under = (f" with {measure.format_size(args.host_budget)} of pinned host memory"
             if args.host_budget is not None else "")
    print()
    for i, (fit, m) in enumerate(smallest.items()):
        verdict = (f"; under the {budget_text(args)} it {'fits' if preset_fits[fit] else 'does not fit'}"
                   if fit in preset_fits and not isinstance(m, HostBudgetError) else "")
        if isinstance(m, HostBudgetError):
            print(f"{superneurons_label(fit)} fits no device budget{under}: even on an unlimited device "
                  f"it pins more (snlite plan {net_words(args)} --batch {batch} --preset superneurons "
                  f"--host-budget {args.host_budget} says what would fit)")
        elif i == 0:
            print(f"{m.label} runs in {measure.format_size(m.budget_bytes)}{under} at the least, "
                  f"{m.ratio:.2f} x (l_peak {measure.format_size(m.l_peak_bytes)} + what it holds all "
                  f"iteration {measure.format_size(m.persistent_bytes)}): the paper's \"peak about l_peak\", "
                  f"as a budget (snlite.search.min_budget){verdict}")
        else:
            print(f"{m.label} runs in {measure.format_size(m.budget_bytes)}{under} at the least, "
                  f"{m.ratio:.2f} x{verdict}")


def superneurons_label(fit: str) -> str:
    return "superneurons()" if fit == "first" else f"superneurons(fit={fit!r})"


def optimal_row(graph, budget, fit: str = "first", host_budget=None):
    """The row of ``--optimal``: the exact planner's least-peak recomputation plan, measured under
    ``budget`` (and ``host_budget``), placed with ``fit``."""
    best = optimal.solve(graph)
    if best.plan is None:
        raise CliError(f"--optimal: {best.summary()}")
    gap = "" if best.optimal else f" ({best.status}, gap {100 * (best.gap or 0):.1f}%)"
    label = "optimal recompute" + gap
    config = best.plan.config.replace(budget_bytes=budget, host_budget_bytes=host_budget, fit=fit)
    return measure.measure(graph, config, label, best.plan)


def compare_json(args, batch: int, rows, timelines, prof, resident: float, smallest, by_fit,
                 preset_fits) -> dict:
    """The numbers of ``compare --json``: the rows of the first fit asked, and per fit each strategy's
    arena against the bytes live at once, superneurons()' smallest budget and, under budgets, whether
    superneurons() fits them (null without)."""
    def least(m):  # None: no device budget fits under --host-budget
        if isinstance(m, HostBudgetError):
            return None
        return {"budget_bytes": m.budget_bytes, "l_peak_bytes": m.l_peak_bytes,
                "persistent_bytes": m.persistent_bytes, "ratio": m.ratio}

    fits_asked = list(by_fit)
    return {**net_json(args), "batch": batch, "budget_bytes": args.budget,
            "host_budget_bytes": args.host_budget, "fit": fits_asked[0],
            "rows": [dict(r.totals(), step_ms=tl.step_ms, vs_all_resident=tl.step_ms / resident - 1,
                          exposed_transfer_ms=tl.exposed_ms, overlap=tl.overlap)
                     for r, tl in zip(rows, timelines)],
            "gpu_profile": prof.name, "all_resident_ms": resident,
            "min_budget": least(smallest[fits_asked[0]]),
            "by_fit": {fit: {"rows": [{"label": r.label, "fits": r.fits, "ran_out": r.ran_out,
                                       "arena_bytes": r.arena_bytes,
                                       "lower_bound_bytes": offline.bounds(r.program)[1]}
                                      for r in by_fit[fit]],
                             "min_budget": least(smallest[fit]),
                             "superneurons_fits": preset_fits.get(fit)} for fit in fits_asked}}


def print_arenas(args, by_fit) -> None:
    """Each strategy's arena under each fit, and how far it is above the most bytes live at once (the
    lower bound no placement beats: the rest is fragmentation)."""
    fits_asked = list(by_fit)
    table = []
    for i, r in enumerate(by_fit[fits_asked[0]]):
        cells = [r.label]
        for fit in fits_asked:
            m = by_fit[fit][i]
            arena, lower = offline.bounds(m.program)
            cells.append(f"{measure.format_size(arena)} (+{arena / lower - 1:.1%})"
                         + (" no" if m.fits is False else ""))
        table.append(cells)
    print("\narena by fit: the bytes each placement spans, and how far above the most bytes live at once "
          "(the lower bound no placement beats; the rest is fragmentation)"
          + ("; no: does not fit the budgets, the numbers are without them" if budgeted(args) else ""))
    print(text_table(["strategy", *(f"fit={fit}" for fit in fits_asked)], table))


def print_rows(args, graph, batch: int, rows, timelines, resident: float) -> None:
    """The table of strategies, then what each one's peak holds, by kind."""
    budget = f", {budget_text(args)}" if budgeted(args) else ""
    print(f"{graph.name}, batch {batch}{budget}: {len(graph.layers)} layers, {graph.flops() / 1e9:,.2f} "
          "GFLOPs forward; each strategy simulated on the meta device")
    head = ["strategy", "peak (all)", "peak (paper)", "peak/l_peak", "recomputed", "extra FLOPs", "moved",
            "host peak", "step (est.)", "vs resident"]
    table = [[r.label, measure.format_size(r.peak_bytes), measure.format_size(r.paper_peak_bytes),
              f"{r.paper.ratio:.2f}", r.trace.recompute_count, f"{r.extra_pct:.1f}%",
              measure.format_size(r.moved_bytes), measure.format_size(r.trace.host_peak_bytes),
              f"{timelines[i].step_ms:,.1f} ms", signed_pct(timelines[i].step_ms / resident - 1)]
             + ([fits_cell(args, r)] if budgeted(args) else []) for i, r in enumerate(rows)]
    print(text_table(head + (["fits"] if budgeted(args) else []), table))
    if any(row[-1] == "no (fragmented)" for row in table):
        how = FRAGMENTED[args.fit[0]]  # the main table's fit
        print(f"no (fragmented): the bytes live at once fit the budget, but {how}; compare --fit first best "
              "offline shows each fit's arena")
    print("\n" + kind_table([(r.label, r.trace) for r in rows]))


def signed_pct(x: float) -> str:
    """``x`` as a signed percentage, one decimal; what rounds to zero is +0.0% (not -0.0%)."""
    return f"{(x if abs(x) >= 0.0005 else 0.0):+.1%}"


FRAGMENTED = {  # why the bytes live at once fit and the arena does not, by the placement's fit
    "first": "no placement of the pool's first fit does (a block too large for any hole)",
    "best": "no placement of the pool's best fit does (a block too large for any hole)",
    "offline": "even offsets chosen knowing every lifetime need a larger arena (fit='offline')",
}


def fits_cell(args, row) -> str:
    """yes or no; under --host-budget, which memory ran out: "no (device)" or "no (host)"; "no
    (fragmented)" where the bytes live at once (the peak shown) are within the device budget but the
    arena needs more than the peak (:data:`FRAGMENTED` says why, by fit)."""
    if row.fits:
        return "yes"
    if row.ran_out != "host" and args.budget is not None and row.trace.peak_bytes <= args.budget:
        return "no (fragmented)"
    return f"no ({row.ran_out})" if args.host_budget is not None else "no"


def print_notes(args, graph, prof, resident: float, seconds: float) -> None:
    """What the columns mean."""
    n = len(graph.route()[0])
    print("\npeak (all): everything on the device; peak (paper) and peak/l_peak: activations + gradients "
          "only. extra FLOPs: recomputed forward work, % of one forward pass; moved: bytes to the host and "
          f"back.\n'+' rows: on top of liveness. {measure.SQRT_LABEL}: Chen et al. 2016's reference, keep "
          f"every {ordinal(max(1, round(n ** 0.5)))} of the {n} layers' outputs, recompute each "
          f"segment once in backward, liveness on (snlite.measure.checkpoint_plan)."
          + ("" if args.budget else " Without --budget the cache never has to move anything.")
          + f" ({seconds:.1f} s)\nstep (est.): one iteration on the {prof.name} profile (snlite.timing: a "
            "roofline model of the kernels, copies at PCIe bandwidth on their own streams, Numba's launch "
            "cost on the host); vs resident: against every tensor resident (liveness only, "
            f"{resident:,.1f} ms)\n{KIND_NOTE}")
