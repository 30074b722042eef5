"""``snlite plan NET``: what the scheduler does for one network under one MemoryConfig, simulated on
the meta device (the peak in both counts, what is live there, recomputation, transfers, the cache,
each conv step's algorithm, the estimated time; with a --budget too small, why and what would fit),
and ``snlite check FILE``: the race checker on a program ``plan --save-program`` wrote.

The other planning commands have their own modules: compare (:mod:`snlite.cli_compare`), maxbatch
and maxdepth (:mod:`snlite.cli_search`), optimal (:mod:`snlite.cli_optimal`), paper and bench
(:mod:`snlite.cli_paper`)."""
from __future__ import annotations

import dataclasses
import os
import sys

from snlite import explain, measure, offline, timing
from snlite.chrome_trace import held_bytes
from snlite.checker import find_races
from snlite.cli_args import (EXIT_DOES_NOT_FIT, OUTPUT_FILES, CliError, _batch, _positive_int,
                             add_memory_flags, check_keep, memory_config)
from snlite.cli_common import (BATCH_HELP, GPU_HELP, add_export_flags, add_json_flag, add_net_argument,
                               check_exports, draw, graph_of, net_json, net_words, pct, tell, text_table,
                               write_exports, write_json)
from snlite.dataflow import DataflowError, check_dataflow
from snlite.models import get_model
from snlite.program import Program
from snlite.scheduler import Scheduler
from snlite.validate import ProgramError


def add_plan_command(sub) -> None:
    plan = sub.add_parser("plan", help="what the scheduler does for a network, measured on the meta device",
                          description="Run the scheduler on the meta device and print the peak (both "
                                      "counts), l_peak, where the peak is and what is live there, the "
                                      "recomputation, transfers and cache, and each conv step's algorithm. "
                                      "With a --budget too small: why, and the changes that would make it "
                                      "fit, ranked (exit 3).")
    add_net_argument(plan)
    plan.add_argument("--batch", type=_batch, default=None, help=BATCH_HELP)
    plan.add_argument("--steps", action="store_true",
                      help="also print the per-step table (bytes by category)")
    plan.add_argument("--top", type=_positive_int, default=10,
                      help="live tensors shown at the peak (default 10)")
    add_json_flag(plan)
    plan.add_argument("--plot", metavar="FILE.png",
                      help="draw the memory timeline (.png, .svg or .pdf; needs matplotlib)")
    plan.add_argument("--timeline", metavar="FILE.png",
                      help="draw the iteration's estimated timeline: the compute, copy_out and copy_in "
                           "streams on a GPU profile (--gpu), with the device memory in use under them "
                           "(.png, .svg or .pdf; needs matplotlib)")
    add_export_flags(plan, "the iteration")
    plan.add_argument("--gpu", default=None, metavar="GPU",
                      help=GPU_HELP.format(default="the GPU --schedule names, else H200"))
    plan.add_argument("--program", action="store_true",
                      help="print the program: every allocation, copy, event and kernel launch of one "
                           "iteration, in order, with its stream, and the race checker's verdict on it")
    plan.add_argument("--save-program", metavar="FILE.json",
                      help="save the program as JSON (Program.load reads it back; snlite check FILE "
                           "checks it)")
    add_memory_flags(plan)


def add_check_command(sub) -> None:
    check = sub.add_parser("check",
                           help="check a saved program for races (snlite plan NET --save-program FILE)",
                           description="Load a program saved as JSON, check that its numbers agree with each "
                                       "other (sizes, offsets, streams, names; with the zoo's net when the "
                                       "program's net and batch are found there, its layers and shapes), "
                                       "then run the race checker on two consecutive iterations of it: every "
                                       "pair of accesses to the same bytes on two streams, at least one a "
                                       "write, must be ordered by the program's events; then check that "
                                       "every value it reads was written first. Exit 0: no race; 1: races "
                                       "(each explained) or a malformed program (one line).")
    check.add_argument("file", metavar="FILE.json", help="a program saved by snlite plan --save-program")
    check.add_argument("--all", action="store_true", help="explain every race, not only the first five")


# ---------------------------------------------------------------- snlite plan
def cmd_plan(args) -> int:
    config = memory_config(args)
    if args.gpu is None:  # the copies retimed for a GPU are timed on it too
        args.gpu = config.schedule if config.schedule != "paper" else "H200"
    check_exports(args, config)
    build, graph, batch = graph_of(args)
    check_keep(graph, config)
    if config.budget_bytes is not None or config.host_budget_bytes is not None:
        ex = explain.explain_budget(build, batch, config)
        if not ex.fits:
            return does_not_fit(args, batch, ex)
    m = measure.measure(graph, config)
    trace = m.trace if config.count == "all" else m.paper  # the count the flags ask for
    tl = m.timeline(timing.profile(args.gpu))
    if args.json == "-":
        write_json(args.json, plan_json(args, graph, batch, config, m, trace, tl))
    else:  # standard output is the tables, not the JSON
        print_peaks(graph, batch, config, m)
        print_peak_step(config, trace, args.top)
        print_costs(config, m)
        if trace.conv_choices:
            print("\n" + conv_table(trace.conv_choices))
        if args.steps:
            print("\nper step (KiB):\n" + trace.table())
        print(f"\ntime (estimated, snlite.timing): {tl.summary()}")
        if args.program:
            races = find_races(m.program, graph=graph)
            print("\n" + m.program.table())
            print(f"race checker: {'no races' if not races else f'{len(races)} race(s)'} over two iterations")
    write_files(args, graph, batch, config, m, trace, tl)
    return 0


def plan_json(args, graph, batch: int, config, m, trace, tl) -> dict:
    """What ``plan --json`` writes: the network, the config, the totals, the recomputation, the tensors
    live at the peak, every step, each conv step's algorithm, and the time model's estimate (what the
    text's "time (estimated)" line says, in ms)."""
    time = {"gpu_profile": tl.profile, "step_ms": tl.step_ms, "kernel_launches": tl.launches,
            "busy_ms": tl.busy_ms, "transfer_ms": tl.transfer_ms, "exposed_transfer_ms": tl.exposed_ms,
            "overlap": tl.overlap}
    return {**net_json(args), "batch": batch, "fits": m.fits, "config": config, "totals": m.totals(),
            "recompute": Scheduler(graph, config).plan().recompute, "peak_tensors": trace.peak_tensors,
            "steps": trace.steps, "conv_choices": trace.conv_choices, "time": time}


def does_not_fit(args, batch: int, ex) -> int:
    """``plan`` under a budget too small: the explanation as JSON and/or text; exit 3."""
    if args.json:
        write_json(args.json, {**net_json(args), "batch": batch, "fits": False,
                               "explanation": explanation_json(ex)})
    if args.json != "-":
        print_explanation(ex, net_words(args))
    skipped = [f"{flag} {getattr(args, dest)}" for dest, flag in OUTPUT_FILES.items()
               if dest != "json" and getattr(args, dest, None) is not None]
    if skipped:
        print("snlite plan: not written, as the plan does not fit (no program to export): "
              + ", ".join(skipped), file=sys.stderr)
    return EXIT_DOES_NOT_FIT


def print_peaks(graph, batch: int, config, m) -> None:
    """The network, the scheduler's plan, and the peak and l_peak in both counts."""
    print(f"{graph.name}, batch {batch}: {len(graph.layers)} layers, {graph.param_count():,d} parameters, "
          f"{graph.flops() / 1e9:,.2f} GFLOPs forward; simulated on the meta device")
    print(Scheduler(graph, config))
    fit = "" if config.allocator == "raw" else f" ({config.fit} fit)"  # raw: one allocation per tensor
    print(f"  allocator {config.allocator}{fit}, peak counted as {config.count!r} below, "
          f"budget {measure.format_size(config.budget_bytes) if config.budget_bytes else 'none'}")
    print()
    t, p = m.trace, m.paper
    print(text_table(["", "count all", "paper count (activations + gradients)"], [
        ["peak", measure.format_size(t.peak_bytes), measure.format_size(p.peak_bytes)],
        ["l_peak (largest step)", measure.format_size(t.l_peak_bytes), measure.format_size(p.l_peak_bytes)],
        ["peak / l_peak", f"{t.ratio:.2f}", f"{p.ratio:.2f}"]]))


def print_peak_step(config, trace, top: int) -> None:
    """Where the peak is, what it holds by kind, and the ``top`` largest tensors live there."""
    at = trace.steps[trace.peak_op]
    live = trace.peak_tensors
    where = f"step {trace.peak_step} ({at.layer} {at.phase}, op {trace.peak_op})" if at.op >= 0 else \
        trace.peak_at()
    print(f"\npeak ({config.count} count) at {where}, by kind (host: pinned memory, at the host's peak):")
    print(text_table(["", "device", "host"], [[kind, measure.format_size(d), measure.format_size(h)]
                                              for kind, (d, h) in trace.by_kind().items()]))
    print(f"{len(live)} tensors made during the iteration are live at the peak (what is held throughout is "
          f"not listed), the largest {min(top, len(live))}:")
    for name, nbytes in live[:top]:
        print(f"  {name:40} {measure.format_size(nbytes):>12}")


def print_costs(config, m) -> None:
    """What the savings cost (recomputation, transfers, the cache), the memory the program needs, and
    the budgets."""
    t = m.trace
    print(f"\nrecomputation: {t.recompute_count} layer forwards re-run, +{t.extra_flops:,d} FLOPs "
          f"({m.extra_pct:.1f}% of the forward pass)")
    why = " (offload is lazy under the cache: no allocation fell short, so nothing moved)" \
        if config.offload and config.cache and not t.d2h_bytes else ""  # offload on, yet nothing moved
    print(f"transfers: {measure.format_size(t.d2h_bytes)} to the host, {measure.format_size(t.h2d_bytes)} "
          f"back; host peak {measure.format_size(t.host_peak_bytes)}{why}")
    print(f"cache: {t.cache_hits} hits, {t.cache_misses} misses" + ("" if config.cache else " (cache off)"))
    lower = "" if config.allocator == "raw" else \
        f" (lower bound {measure.format_size(offline.bounds(m.program)[1])}, the most bytes live at once)"
    print(f"memory needed: device arena {measure.format_size(m.arena_bytes)}{lower}, pinned host memory "
          f"{measure.format_size(m.slab_bytes)} (the program's high-water marks; the staged batch and "
          "results included)")
    if config.budget_bytes:
        print(f"budget: fits {measure.format_size(config.budget_bytes)} "
              f"({pct(t.peak_bytes, config.budget_bytes)} used at the peak)")
    if config.host_budget_bytes:
        print(f"host budget: fits {measure.format_size(config.host_budget_bytes)} "
              f"({pct(m.slab_bytes, config.host_budget_bytes)} pinned)")


def write_files(args, graph, batch: int, config, m, trace, tl) -> None:
    """The files asked for, each said where (on standard error where standard output is the JSON):
    the numbers (--json FILE), the memory timeline (--plot), the estimated timeline on the --gpu
    profile ``tl`` (--timeline, --chrome-trace), the arena (--memory-snapshot), the program
    (--save-program)."""
    title = f"{graph.name}, batch {batch}, {config.describe()}"
    if args.json != "-" and any(getattr(args, dest, None) for dest in OUTPUT_FILES):
        print()  # the lines that say where each went, apart from the tables
    if args.json not in (None, "-"):
        write_json(args.json, plan_json(args, graph, batch, config, m, trace, tl))
    if args.plot:
        draw(args, "plot", "plot_timeline", trace, title=f"{graph.name}, batch {batch}: {config.describe()}")
    if args.timeline:
        held = held_bytes(m.program)  # what the setup holds all iteration, under the walk's bytes
        draw(args, "timeline", "plot_streams", tl.events(), memory=[(ms, held + b) for ms, b in tl.memory],
             title=f"{title}: one iteration on the {args.gpu} profile (estimated), {tl.step_ms:,.1f} ms")
    write_exports(args, m.program, tl, f"{title} on the {args.gpu} profile (estimated)")
    if args.save_program:
        m.program.save(args.save_program)
        tell(args, f"program saved to {args.save_program} ({len(m.program):,d} instructions)")


def conv_table(choices, limit: int = 12) -> str:
    """One row per conv layer: the algorithm (x images per chunk) and workspace of each conv op,
    then how often each algorithm was chosen."""
    ops = ("forward", "backward_data", "backward_filter")
    by_layer: dict[str, dict] = {}
    for c in choices:
        by_layer.setdefault(c.layer, {}).setdefault(c.op, c)

    def cell(c):
        if c is None:
            return "-"
        algo = f"{c.algo} x{c.chunk}, " if c.algo != "direct" or c.chunk > 1 else "direct, "
        return algo + measure.format_size(c.workspace_bytes)
    rows = [[layer] + [cell(d.get(o)) for o in ops] for layer, d in list(by_layer.items())[:limit]]
    text = ("convolution workspace (algorithm x images per chunk, workspace):\n"
            + text_table(["layer", *ops], rows, "<<<<"))
    if len(by_layer) > limit:
        text += f"\n... and {len(by_layer) - limit} more conv layers (all of them: --json)"
    counts: dict[str, dict[str, int]] = {}
    for d in by_layer.values():
        for o, c in d.items():
            counts.setdefault(o, {})[c.algo] = counts.get(o, {}).get(c.algo, 0) + 1
    chosen = [f"{o} " + ", ".join(f"{a} {n}" for a, n in sorted(counts[o].items()))
              for o in ops if o in counts]
    return text + "\nchosen: " + "; ".join(chosen)


def print_explanation(ex, net: str) -> None:
    """Why ``ex`` does not fit, and the ranked changes (stdout); ``net``: the NET as the command
    line gave it (:func:`snlite.cli_common.net_words`)."""
    need, host = ex.need.trace, ex.ran_out == "host"
    at = need.steps[need.peak_op]
    budget = (f"a host budget of {measure.format_size(ex.config.host_budget_bytes)} of pinned memory" if host
              else f"a budget of {measure.format_size(ex.config.budget_bytes)}")
    print(f"{ex.net}, batch {ex.batch}, does NOT fit {budget} under {ex.config.describe()}.")
    print(f"\nwhere it failed: {ex.message}")
    pinned = measure.format_size(ex.host_needed) if ex.host_needed is not None else None
    if host and pinned is not None:  # what the device holds is beside the point: the pinned slab ran out
        print(f"\nwithout a host budget it pins {pinned} of host memory (the staged batch, the results and "
              f"what waits on the host at its busiest); a --host-budget of {pinned} or more fits")
    elif host:
        print(f"\nwithout a host budget it does not fit the device budget either (without both it peaks at "
              f"{measure.format_size(need.peak_bytes)} and pins {measure.format_size(ex.need.slab_bytes)})")
    else:
        print(f"\nwithout a budget it peaks at {measure.format_size(need.peak_bytes)} (count all; "
              f"{measure.format_size(ex.need.paper_peak_bytes)} of activations + gradients) at "
              f"{f'step {need.peak_step} ({at.layer} {at.phase})' if at.op >= 0 else need.peak_at()}; "
              "the largest tensors live there:")
        for name, nbytes in need.peak_tensors[:8]:
            print(f"  {name:40} {measure.format_size(nbytes):>12}")
    print("\nwhat would make it fit, each simulated under the same budget on the meta device (ranked: those "
          "that fit first, then by cost: nothing < bytes moved < slower convolutions < extra FLOPs < a "
          "smaller batch):")
    rows = [[i, s.change, s.what, "yes" if s.fits else "no", measure.format_size(s.peak_bytes),
             measure.format_size(s.saved_bytes) if s.saved_bytes and s.saved_bytes > 0 else "-",
             f"{s.extra_pct:.1f}%" if s.extra_flops else "-",
             measure.format_size(s.moved_bytes) if s.moved_bytes else "-", s.cost]
            for i, s in enumerate(ex.suggestions, 1)]
    header = ["#", "change", "what", "fits", "peak", "saves", "extra FLOPs", "moved", "costs"]
    print(text_table(header, rows, "><<<>>>><") if rows else
          "  (no change of the configuration was tried: none would pin less)")
    if host and not any(s.fits for s in ex.suggestions):
        larger = f"a --host-budget of {pinned} or more, or " if pinned else ""
        print(f"\nnothing here fits: {larger}a smaller batch")
    elif not any(s.fits for s in ex.suggestions):
        print(f"\nnothing here fits: a larger --budget (without one it peaks at "
              f"{measure.format_size(need.peak_bytes)}), or a smaller network; snlite compare {net} "
              f"--batch {ex.batch} finds the smallest budget of superneurons()")
    elif ex.suggestions[0].fits:
        print(f"\ntry: {ex.suggestions[0].change}")


def explanation_json(ex) -> dict:
    """An Explanation as plain data: the message, the run without a budget, the ranked suggestions."""
    need = ex.need.trace
    return {"config": ex.config, "budget_bytes": ex.config.budget_bytes,
            "host_budget_bytes": ex.config.host_budget_bytes, "ran_out": ex.ran_out, "message": ex.message,
            "need": ex.need.totals(), "peak_tensors": need.peak_tensors,
            "suggestions": [dict(dataclasses.asdict(s), rank=i) for i, s in enumerate(ex.suggestions, 1)]}


# ---------------------------------------------------------------- snlite check
def cmd_check(args) -> int:
    path = program_path(args.file)

    def refuse(e) -> int:  # one line, exit 1 (--traceback: the traceback)
        if args.traceback:
            raise e
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        why = why[len(f"{path}: "):] if why.startswith(f"{path}: ") else why
        print(f"{args.file}: a malformed program: {why}")
        return 1

    try:
        program = Program.load(path)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        return refuse(e)
    graph, against = zoo_graph(program)
    try:
        races = find_races(program, graph=graph)
        if not races:
            check_dataflow(program)  # as checker.check: a read of a value never written
    except (ProgramError, DataflowError) as e:
        return refuse(e)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:  # a shape no check foresaw
        return refuse(ValueError(f"the checker could not read it ({type(e).__name__}: {e})"))
    print(f"{args.file}: {against}")
    return print_races(args, program, races)


def program_path(file: str) -> str:
    """The path of the program file ``file``; a CliError if it names nothing, a folder or no file."""
    path = os.path.expanduser(file)
    if not file.strip():
        raise CliError("an empty file name; give the JSON file saved by: "
                       "snlite plan NET --save-program FILE.json")
    if os.path.isdir(path):
        raise CliError(f"{file}: a directory, not a program; give the JSON file saved by: "
                       f"snlite plan NET --save-program FILE.json")
    if not os.path.isfile(path):
        raise CliError(f"{file}: no such file; save one with: snlite plan NET --save-program {file}")
    return path


def print_races(args, program, races) -> int:
    """The verdict: no races (0), or the first five races explained (--all: every one) (1)."""
    if not races:
        print(f"{args.file}: {program.net} under {program.config} ({program.mode}), {len(program):,d} "
              "instructions: no races over two iterations")
        return 0
    shown = races if args.all else races[:5]
    print(f"{args.file}: {len(races)} race(s) in {program.net} under {program.config} ({program.mode}):\n")
    print("\n\n".join(r.explain(program) for r in shown))
    if len(shown) < len(races):
        print(f"\n... and {len(races) - len(shown)} more (--all shows them)")
    return 1


def zoo_graph(program) -> tuple:
    """The net a saved program was planned for, from the zoo (its name and batch, the batch read off
    the program's input tensor), and a line saying whether the check compares the program with it."""
    spec = program.tensors.get("data") if isinstance(program.tensors, dict) else None
    shape = spec[0] if isinstance(spec, tuple) and len(spec) == 3 else None
    if not (isinstance(shape, tuple) and shape and isinstance(shape[0], int) and shape[0] > 0):
        return None, "checked without the net (the program has no input tensor 'data' to read the batch off)"
    try:
        graph = get_model(str(program.net), batch=shape[0])
    except (ValueError, TypeError):
        return None, (f"checked without the net ({program.net!r} is not a zoo model): layers and shapes are "
                      "not compared with a graph")
    if tuple(graph.input_shape) != shape:
        return None, (f"checked without the net (its input is {shape}, the zoo's {program.net} takes "
                      f"{tuple(graph.input_shape)})")
    ours = set(graph.tensors())
    if 2 * len(ours & set(program.tensors)) < len(ours):  # another net of the same name (from_torch's, say)
        return None, (f"checked without the net (most tensors of the zoo's {program.net} are not in it: "
                      "another net of that name)")
    classes, note = _classes(graph, program), ""
    if classes not in (None, graph.num_classes):  # the zoo's net with another head: that one
        try:
            graph = get_model(str(program.net), batch=shape[0], num_classes=classes)
            note = f", {classes} classes"
        except (ValueError, TypeError):
            return None, f"checked without the net (the zoo's {program.net} takes no {classes} classes)"
    return graph, (f"checked against the zoo's {graph.name} at batch {shape[0]}{note} (its layers and tensor "
                   "shapes)")


def _classes(graph, program) -> int | None:
    """The classes of the net ``program`` was planned for: the last size of its logits, the tensor the
    zoo ``graph``'s loss reads (None where the program has no such tensor)."""
    spec = program.tensors.get(graph.output_tensor(graph.inputs[graph.loss_layer][0]))
    shape = spec[0] if isinstance(spec, tuple) and len(spec) == 3 else None
    ok = isinstance(shape, tuple) and len(shape) == 2 and isinstance(shape[1], int) and shape[1] > 0
    return shape[1] if ok else None
