"""The planning subcommands of ``snlite`` (plan, compare, maxbatch, maxdepth, paper, bench): they
run the scheduler on the meta device and print what :mod:`snlite.measure` and :mod:`snlite.search` compute."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np

from snlite import measure, search, timing

from snlite.cli_args import (EXIT_DOES_NOT_FIT, CliError, Status, _batch, _budget, _positive_int, _size,
                             add_memory_flags, add_quiet_flag, check_keep, check_output_file, memory_config)

PAPER_GPU = "12 GB K40"


def cmd_optimal(args) -> int:
    from snlite.cli_optimal import cmd_optimal as run

    return run(args)


def add_planning_commands(sub) -> None:
    net_help = ("a network of the model zoo (snlite.models.get_model): lenet, alexnet, vgg16, resnet50, "
                "resnet101, resnet152, resnetNNN, cifar_resnetNN, inception_v4, densenet121")
    batch_help = "images per step (default: the model's, snlite.models.DEFAULT_BATCH)"
    json_help = "write the numbers as JSON to FILE (- or no FILE: standard output, instead of the tables)"
    gpu_help = ("the GPU profile of the time model (snlite.timing.PROFILES: H200, A100, T4, K40; default H200): "
                "estimated step time, how busy each stream is, how much transfer time compute waits for")

    plan = sub.add_parser("plan", help="what the scheduler does for a network, measured on the meta device",
                          description="Run the scheduler on the meta device and print the peak (both counts), "
                                      "l_peak, where the peak is and what is live there, the recomputation, "
                                      "transfers and cache, and each conv step's algorithm. With a --budget too "
                                      "small: why, and the changes that would make it fit, ranked (exit 3).")
    plan.add_argument("net", metavar="NET", help=net_help)
    plan.add_argument("--batch", type=_batch, default=None, help=batch_help)
    plan.add_argument("--steps", action="store_true", help="also print the per-step table (bytes by category)")
    plan.add_argument("--top", type=_positive_int, default=10, help="live tensors shown at the peak (default 10)")
    plan.add_argument("--json", nargs="?", const="-", metavar="FILE", help=json_help)
    plan.add_argument("--plot", metavar="FILE.png", help="draw the memory timeline (needs matplotlib)")
    plan.add_argument("--timeline", metavar="FILE.png",
                      help="draw the iteration's estimated timeline: the compute, copy_out and copy_in streams on a "
                           "GPU profile (--gpu), with the device memory in use under them (needs matplotlib)")
    plan.add_argument("--gpu", default="H200", metavar="GPU", help=gpu_help)
    plan.add_argument("--program", action="store_true",
                      help="print the program: every allocation, copy, event and kernel launch of one iteration, "
                           "in order, with its stream, and the race checker's verdict on it")
    plan.add_argument("--save-program", metavar="FILE.json",
                      help="save the program as JSON (Program.load reads it back; snlite check FILE checks it)")
    add_memory_flags(plan)

    check = sub.add_parser("check", help="check a saved program for races (snlite plan NET --save-program FILE)",
                           description="Load a program saved as JSON, check that its numbers agree with each other "
                                       "(sizes, offsets, streams, names; with the zoo's net when the program's net "
                                       "and batch are found there, its layers and shapes), then run the race checker "
                                       "on two consecutive iterations of it: every pair of accesses to the same bytes "
                                       "on two streams, at least one a write, must be ordered by the program's events; "
                                       "then check that every value it reads was written first. Exit 0: no race; 1: "
                                       "races (each explained) or a malformed program (one line).")
    check.add_argument("file", metavar="FILE.json", help="a program saved by snlite plan --save-program")
    check.add_argument("--all", action="store_true", help="explain every race, not only the first five")

    compare = sub.add_parser("compare", help="one row per memory strategy: peak, recomputation, bytes moved",
                             description="Simulate NET under each strategy: baseline, liveness, + offload, "
                                         "+ offload + cache, + recompute speed / memory / cost_aware (on top of "
                                         "liveness + offload), and sqrt(N) checkpointing (Chen et al. 2016) as "
                                         "a reference.")
    compare.add_argument("net", metavar="NET", help=net_help)
    compare.add_argument("--batch", type=_batch, default=None, help=batch_help)
    compare.add_argument("--budget", type=_budget, metavar="SIZE", default=None,
                         help="run every strategy under this budget and say which fit (the cache only moves "
                              "data when memory runs short)")
    compare.add_argument("--plot", metavar="FILE.png", help="draw the trade-off: peak vs extra work")
    compare.add_argument("--gpu", default="H200", metavar="GPU", help=gpu_help)
    compare.add_argument("--json", nargs="?", const="-", metavar="FILE", help=json_help)
    compare.add_argument("--optimal", action="store_true",
                         help="add a row: the exact planner's least-peak recomputation plan, liveness on, nothing "
                              "offloaded (snlite optimal NET says more; needs scipy)")
    add_quiet_flag(compare)

    for name, what in (("maxbatch", "the largest batch"), ("maxdepth", "the deepest ImageNet ResNet")):
        p = sub.add_parser(name, help=f"{what} that fits a budget, per strategy (the paper's Table "
                                      f"{5 if name == 'maxbatch' else 4})",
                           description=f"Binary search, on the meta device, for {what} that fits --budget under "
                                       f"baseline, liveness, + offload, + recompute (cost_aware) and superneurons "
                                       f"(with the cache and dynamic workspace). Everything counts (count all): a "
                                       f"GPU holds the weights, gradients and momentum too. The paper's figures "
                                       f"({PAPER_GPU}) are shown alongside.")
        if name == "maxbatch":
            p.add_argument("net", metavar="NET", help=net_help)
            p.add_argument("--max-batch", type=_batch, default=search.MAX_BATCH,
                           help=f"the ceiling: search no further (default {search.MAX_BATCH:,d})")
        else:
            p.add_argument("--batch", type=_batch, default=16, help="images per step (default 16, the paper's)")
            p.add_argument("--max-units", type=_max_units, default=search.MAX_UNITS,
                           help=f"the ceiling: search no deeper than this many residual units (at least "
                                f"{search.MIN_UNITS}, ResNet-50's; default {search.MAX_UNITS:,d}: depth "
                                f"{3 * search.MAX_UNITS + 2:,d}, a search of about a minute; lower where the "
                                f"planner would need more of this machine's memory than is free)")
        p.add_argument("--host-budget", type=_size, metavar="SIZE", default=None,
                       help="pinned host memory (offloaded and cached tensors, momentum on the host): a plan that "
                            "needs more does not fit (default: unlimited)")
        p.add_argument("--budget", type=_budget, metavar="SIZE", default=measure.parse_size("12GiB"),
                       help="device memory (default 12GiB)")
        p.add_argument("--json", nargs="?", const="-", metavar="FILE", help=json_help)
        add_quiet_flag(p)

    from snlite.cli_optimal import add_optimal_command

    add_optimal_command(sub, net_help, batch_help, json_help)

    paper = sub.add_parser("paper", help="reproduce the paper's byte-accounting experiments; write a report",
                           description="Every experiment of the paper that needs no GPU, on the meta device: "
                                       "AlexNet's memory trajectory per technique, the recomputation strategies, "
                                       "traffic with and without the tensor cache, Table 4 (depth) and Table 5 "
                                       "(width) in 12 GiB, the peak vs extra compute trade-off. Prints each table "
                                       "and writes DIR/report.md (with PNG figures if matplotlib is installed). "
                                       "About three minutes on a 2-core CPU; --quick: about ten seconds.")
    paper.add_argument("--out", default="paper-out", metavar="DIR",
                       help="where report.md and its figures go (default paper-out; created if missing)")
    paper.add_argument("--quick", action="store_true", help="fewer networks, batches and strategies (for tests)")
    add_quiet_flag(paper)

    bench = sub.add_parser("bench", help="the GPU kernel benchmark (if there is a GPU) and the CPU planning one",
                           description="On a real GPU, run the kernel benchmark (python -m kernels.bench); "
                                       "elsewhere say so. Then, always, time the planning of a very deep ResNet "
                                       "on the CPU (python -m snlite.bench deep).")
    bench.add_argument("--units", type=_positive_int, default=2500,
                       help="residual units of the planned ResNet (default 2500: the paper's deepest)")
    bench.add_argument("--batch", type=_batch, default=1, help="its batch (default 1)")
    bench.add_argument("--out", default="bench-out", metavar="DIR", help="where the GPU benchmark writes bench.json")
    bench.add_argument("--quick", action="store_true", help="the GPU benchmark's smaller sizes")


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
        return reach, (f"planning a deeper ResNet would hold more than the {measure.format_size(free)} of this "
                       f"machine's memory that is free, about {measure.format_size(search.PLANNER_BYTES_PER_UNIT)} "
                       f"a residual unit")
    if max_units == search.MAX_UNITS:
        return max_units, f"--max-units, default {search.MAX_UNITS:,d}, so that a search ends in about a minute"
    return max_units, f"--max-units {max_units:,d}"


def _max_units(text: str) -> int:
    value = _positive_int(text)
    if value < search.MIN_UNITS:
        raise argparse.ArgumentTypeError(f"expected at least {search.MIN_UNITS} (ResNet-50's residual units, the "
                                         f"shallowest ImageNet ResNet), got {value}")
    return value


# ---------------------------------------------------------------- planning commands (meta device)
def _builder(net: str):
    """``batch -> Graph`` for ``net`` from the model zoo (None: the model's default batch)."""
    from snlite import models

    return lambda batch=None: models.get_model(net, batch)


def _graph(args):
    """(builder, graph, batch) for ``args.net`` and ``args.batch`` (None: the model's default)."""
    build = _builder(args.net)
    graph = build(args.batch)
    return build, graph, graph.input_shape[0]


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _table(head: list[str], rows: list[list], align: str | None = None) -> str:
    """A plain text table; ``align`` per column: < or > (default: first left, others right)."""
    align = align or "<" + ">" * (len(head) - 1)
    cells = [[str(c) for c in r] for r in [head] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(f"{c:{a}{w}}" for c, a, w in zip(r, align, widths)).rstrip() for r in cells)


KIND_HEAD = ["weights", "weight grads", "momentum", "on host", "the rest", "on host"]
KIND_NOTE = ("by kind, at each row's peak: the weights (with BatchNorm's buffers), their gradients and the optimizer "
             "state (momentum), on the device and waiting in pinned host memory; the rest is the batch, activations, "
             "their gradients, workspace and copies in flight (on the host: what the cache and offload parked there, "
             "at the host's peak)")


def _kind_cells(trace) -> list[str]:
    """The :data:`KIND_HEAD` cells of ``trace`` (Trace.by_kind), or dashes without one."""
    if trace is None:
        return ["-"] * len(KIND_HEAD)
    k = trace.by_kind()
    return [measure.format_size(k["weights"][0]), measure.format_size(k["weight gradients"][0]),
            measure.format_size(k["optimizer state"][0]), measure.format_size(k["optimizer state"][1]),
            measure.format_size(k["activations, gradients, batch, workspace"][0]),
            measure.format_size(k["activations, gradients, batch, workspace"][1])]


def kind_table(rows) -> str:
    """One line per (label, trace): what its peak holds, by kind (:func:`_kind_cells`)."""
    return _table(["strategy"] + KIND_HEAD, [[label] + _kind_cells(t) for label, t in rows])


def _write_json(target: str, data) -> None:
    text = json.dumps(data, indent=1, default=_jsonable)
    if target == "-":
        print(text)
        return
    check_output_file("--json", target)  # checked before the work too (check_outputs); a folder may go meanwhile
    with open(os.path.expanduser(target), "w") as f:
        f.write(text + "\n")


def _jsonable(v):
    if dataclasses.is_dataclass(v):
        return dataclasses.asdict(v)
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return str(v)


def _plot(kind: str, *args, **kwargs) -> None:
    """``snlite.plot.plot_timeline`` / ``plot_tradeoff``, imported only when asked for."""
    try:
        from snlite import plot
    except ImportError as e:
        raise CliError(f"--plot needs snlite.plot and matplotlib ({e}); pip install matplotlib") from None
    try:
        getattr(plot, kind)(*args, **kwargs)
    except plot.PlotUnavailable as e:
        raise CliError(f"--plot: {e}") from None


def cmd_plan(args) -> int:
    from snlite.scheduler import Scheduler

    config = memory_config(args)
    build, graph, batch = _graph(args)
    check_keep(graph, config)
    if config.budget_bytes is not None:
        ex = search.explain_budget(build, batch, config)
        if not ex.fits:
            if args.json:
                _write_json(args.json, {"net": args.net, "batch": batch, "fits": False,
                                        "explanation": explanation_json(ex)})
            if args.json != "-":
                print_explanation(ex)
            return EXIT_DOES_NOT_FIT
    m = measure.measure(graph, config)
    trace = m.trace if config.count == "all" else m.paper
    if args.json:
        _write_json(args.json, {"net": args.net, "batch": batch, "fits": m.fits, "config": config,
                                "totals": m.totals(), "recompute": Scheduler(graph, config).plan().recompute,
                                "peak_tensors": trace.peak_tensors, "steps": trace.steps,
                                "conv_choices": trace.conv_choices})
    if args.plot:
        _plot("plot_timeline", trace, args.plot, title=f"{graph.name}, batch {batch}: {config.describe()}")
    if args.json == "-":
        return 0
    print(f"{graph.name}, batch {batch}: {len(graph.layers)} layers, {graph.param_count():,d} parameters, "
          f"{graph.flops() / 1e9:,.2f} GFLOPs forward; simulated on the meta device")
    print(Scheduler(graph, config))
    print(f"  allocator {config.allocator} ({config.fit} fit), peak counted as {config.count!r} below, budget "
          f"{measure.format_size(config.budget_bytes) if config.budget_bytes else 'none'}")
    print()
    t, p = m.trace, m.paper
    print(_table(["", "count all", "paper count (activations + gradients)"], [
        ["peak", measure.format_size(t.peak_bytes), measure.format_size(p.peak_bytes)],
        ["l_peak (largest step)", measure.format_size(t.l_peak_bytes), measure.format_size(p.l_peak_bytes)],
        ["peak / l_peak", f"{t.ratio:.2f}", f"{p.ratio:.2f}"]]))
    at = trace.steps[trace.peak_op]
    live = trace.peak_tensors
    kinds = trace.by_kind()
    print(f"\npeak ({config.count} count) at step {trace.peak_step} ({at.layer} {at.phase}, op {trace.peak_op}), "
          f"by kind (host: pinned memory, at the host's peak):")
    print(_table(["", "device", "host"], [[kind, measure.format_size(d), measure.format_size(h)]
                                          for kind, (d, h) in kinds.items()]))
    print(f"{len(live)} tensors made during the iteration are live at the peak (what is held throughout is not "
          f"listed), the largest {min(args.top, len(live))}:")
    for name, nbytes in live[:args.top]:
        print(f"  {name:40} {measure.format_size(nbytes):>12}")
    print(f"\nrecomputation: {t.recompute_count} layer forwards re-run, +{t.extra_flops:,d} FLOPs "
          f"({m.extra_pct:.1f}% of the forward pass)")
    print(f"transfers: {measure.format_size(t.d2h_bytes)} to the host, {measure.format_size(t.h2d_bytes)} back; "
          f"host peak {measure.format_size(t.host_peak_bytes)}")
    print(f"cache: {t.cache_hits} hits, {t.cache_misses} misses" + ("" if config.cache else " (cache off)"))
    print(f"memory needed: device arena {measure.format_size(m.arena_bytes)}, pinned host memory "
          f"{measure.format_size(m.slab_bytes)} (the program's high-water marks; the staged batch and results included)")
    if config.budget_bytes:
        print(f"budget: fits {measure.format_size(config.budget_bytes)} "
              f"({_pct(t.peak_bytes, config.budget_bytes)} used at the peak)")
    if config.host_budget_bytes:
        print(f"host budget: fits {measure.format_size(config.host_budget_bytes)} "
              f"({_pct(m.slab_bytes, config.host_budget_bytes)} pinned)")
    if trace.conv_choices:
        print("\n" + conv_table(trace.conv_choices))
    if args.steps:
        print("\nper step (KiB):\n" + trace.table())
    tl = m.timeline(timing.profile(args.gpu))
    print(f"\ntime (estimated, snlite.timing): {tl.summary()}")
    if args.timeline:
        _plot("plot_streams", tl.events(), args.timeline, memory=tl.memory,
              title=f"{graph.name}, batch {batch}, {config.describe()}: one iteration on the {args.gpu} profile "
                    f"(estimated), {tl.step_ms:,.1f} ms")
        print(f"timeline drawn to {args.timeline}")
    if args.save_program:
        _save_program(m.program, args.save_program)
        print(f"\nprogram saved to {args.save_program} ({len(m.program):,d} instructions)")
    if args.program:
        from snlite.checker import find_races

        races = find_races(m.program, graph=graph)
        print("\n" + m.program.table())
        print(f"race checker: {'no races' if not races else f'{len(races)} race(s)'} over two iterations")
    return 0


def _save_program(program, target: str) -> None:
    check_output_file("--save-program", target)
    program.save(os.path.expanduser(target))


def cmd_check(args) -> int:
    from snlite.checker import ProgramError, find_races
    from snlite.dataflow import DataflowError, check_dataflow
    from snlite.program import Program

    path = os.path.expanduser(args.file)
    if not args.file.strip():
        raise CliError("an empty file name; give the JSON file saved by: snlite plan NET --save-program FILE.json")
    if os.path.isdir(path):
        raise CliError(f"{args.file}: a directory, not a program; give the JSON file saved by: "
                       f"snlite plan NET --save-program FILE.json")
    if not os.path.isfile(path):
        raise CliError(f"{args.file}: no such file; save one with: snlite plan NET --save-program {args.file}")

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
    graph, against = _zoo_graph(program)
    try:
        races = find_races(program, graph=graph)
        if not races:
            check_dataflow(program)  # as checker.check: a read of a value never written
    except (ProgramError, DataflowError) as e:
        return refuse(e)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:  # a shape the checks did not foresee
        return refuse(ValueError(f"the checker could not read it ({type(e).__name__}: {e})"))
    print(f"{args.file}: {against}")
    if not races:
        print(f"{args.file}: {program.net} under {program.config} ({program.mode}), {len(program):,d} instructions: "
              f"no races over two iterations")
        return 0
    shown = races if args.all else races[:5]
    print(f"{args.file}: {len(races)} race(s) in {program.net} under {program.config} ({program.mode}):\n")
    print("\n\n".join(r.explain(program) for r in shown))
    if len(shown) < len(races):
        print(f"\n... and {len(races) - len(shown)} more (--all shows them)")
    return 1


def _zoo_graph(program) -> tuple:
    """The net a saved program was planned for, from the zoo (its name and batch, the batch read off
    the program's input tensor), and a line saying whether the check compares the program with it."""
    spec = program.tensors.get("data") if isinstance(program.tensors, dict) else None
    shape = spec[0] if isinstance(spec, tuple) and len(spec) == 3 else None
    if not (isinstance(shape, tuple) and shape and isinstance(shape[0], int) and shape[0] > 0):
        return None, "checked without the net (the program has no input tensor 'data' to read the batch off)"
    from snlite.models import get_model

    try:
        graph = get_model(str(program.net), batch=shape[0])
    except (ValueError, TypeError):
        return None, (f"checked without the net ({program.net!r} is not a zoo model): layers and shapes are not "
                      f"compared with a graph")
    if tuple(graph.input_shape) != shape:
        return None, (f"checked without the net (its input is {shape}, the zoo's {program.net} takes "
                      f"{tuple(graph.input_shape)})")
    return graph, f"checked against the zoo's {graph.name} at batch {shape[0]} (its layers and tensor shapes)"


def conv_table(choices, limit: int = 12) -> str:
    """One row per conv layer: the algorithm (x images per chunk) and workspace of each conv op,
    then how often each algorithm was chosen."""
    ops = ("forward", "backward_data", "backward_filter")
    by_layer: dict[str, dict] = {}
    for c in choices:
        by_layer.setdefault(c.layer, {}).setdefault(c.op, c)

    def cell(c):
        return "-" if c is None else (f"{c.algo} x{c.chunk}, " if c.algo != "direct" or c.chunk > 1 else "direct, ") \
            + measure.format_size(c.workspace_bytes)
    rows = [[layer] + [cell(d.get(o)) for o in ops] for layer, d in list(by_layer.items())[:limit]]
    text = "convolution workspace (algorithm x images per chunk, workspace):\n" + _table(["layer", *ops], rows, "<<<<")
    if len(by_layer) > limit:
        text += f"\n... and {len(by_layer) - limit} more conv layers (all of them: --json)"
    counts: dict[str, dict[str, int]] = {}
    for d in by_layer.values():
        for o, c in d.items():
            counts.setdefault(o, {})[c.algo] = counts.get(o, {}).get(c.algo, 0) + 1
    return text + "\nchosen: " + "; ".join(f"{o} " + ", ".join(f"{a} {n}" for a, n in sorted(counts[o].items()))
                                          for o in ops if o in counts)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def print_explanation(ex) -> None:
    """Why ``ex`` does not fit, and the ranked changes (stdout)."""
    need = ex.need.trace
    at = need.steps[need.peak_op]
    print(f"{ex.net}, batch {ex.batch}, does NOT fit a budget of {measure.format_size(ex.config.budget_bytes)} "
          f"under {ex.config.describe()}.")
    print(f"\nwhere it failed: {ex.message}")
    print(f"\nwithout a budget it peaks at {measure.format_size(need.peak_bytes)} (count all; "
          f"{measure.format_size(ex.need.paper_peak_bytes)} of activations + gradients) at step {need.peak_step} "
          f"({at.layer} {at.phase}); the largest tensors live there:")
    for name, nbytes in need.peak_tensors[:8]:
        print(f"  {name:40} {measure.format_size(nbytes):>12}")
    print("\nwhat would make it fit, each simulated under the same budget on the meta device (ranked: those "
          "that fit first, then by cost: nothing < bytes moved < slower convolutions < extra FLOPs < a smaller "
          "batch):")
    rows = [[i, s.change, s.what, "yes" if s.fits else "no", measure.format_size(s.peak_bytes),
             measure.format_size(s.saved_bytes) if s.saved_bytes and s.saved_bytes > 0 else "-",
             f"{s.extra_pct:.1f}%" if s.extra_flops else "-", measure.format_size(s.moved_bytes) if s.moved_bytes
             else "-", s.cost] for i, s in enumerate(ex.suggestions, 1)]
    print(_table(["#", "change", "what", "fits", "peak", "saves", "extra FLOPs", "moved", "costs"], rows,
                 "><<<>>>><"))
    if not any(s.fits for s in ex.suggestions):
        print("\nnothing here fits: a larger --budget, or a smaller network")
    elif ex.suggestions[0].fits:
        print(f"\ntry: {ex.suggestions[0].change}")


def explanation_json(ex) -> dict:
    """An Explanation as plain data: the message, the run without a budget, the ranked suggestions."""
    need = ex.need.trace
    return {"config": ex.config, "budget_bytes": ex.config.budget_bytes, "message": ex.message,
            "need": ex.need.totals(), "peak_tensors": need.peak_tensors,
            "suggestions": [dict(dataclasses.asdict(s), rank=i) for i, s in enumerate(ex.suggestions, 1)]}


def cmd_compare(args) -> int:
    build, graph, batch = _graph(args)
    t0 = time.perf_counter()
    status = Status("snlite compare", args.quiet)
    rows = measure.compare(graph, args.budget, progress=status)
    if args.optimal:
        from snlite import optimal

        status(f"{graph.name}: the exact recomputation plan (snlite optimal)")
        best = optimal.solve(graph)
        if best.plan is None:
            raise CliError(f"--optimal: {best.summary()}")
        label = "optimal recompute" + ("" if best.optimal else f" ({best.status}, gap {100 * (best.gap or 0):.1f}%)")
        rows.append(measure.measure(graph, best.plan.config.replace(budget_bytes=args.budget), label, best.plan))
    status(f"{graph.name}: the smallest budget of superneurons()")
    smallest = search.min_budget(graph)
    status(f"{graph.name}: step times on the {args.gpu} profile")
    prof = timing.profile(args.gpu)
    timelines = [r.timeline(prof) for r in rows]
    resident = measure.all_resident_ms(graph, prof)
    status.clear()
    seconds = time.perf_counter() - t0
    fits = args.budget is None or any(r.fits for r in rows)
    if args.json:
        _write_json(args.json, {"net": args.net, "batch": batch, "budget_bytes": args.budget,
                                "rows": [dict(r.totals(), step_ms=tl.step_ms, vs_all_resident=tl.step_ms / resident - 1,
                                              exposed_transfer_ms=tl.exposed_ms, overlap=tl.overlap)
                                         for r, tl in zip(rows, timelines)],
                                "gpu_profile": prof.name, "all_resident_ms": resident,
                                "min_budget": {"budget_bytes": smallest.budget_bytes,
                                               "l_peak_bytes": smallest.l_peak_bytes,
                                               "persistent_bytes": smallest.persistent_bytes,
                                               "ratio": smallest.ratio}})
    if args.plot:
        _plot("plot_tradeoff", [{"label": r.label, "peak_bytes": r.peak_bytes, "extra_flops": r.trace.extra_flops,
                                 "moved_bytes": r.moved_bytes} for r in rows], args.plot,
              title=f"{graph.name}, batch {batch}")
    if args.json == "-":
        return 0 if fits else EXIT_DOES_NOT_FIT
    budget = f", budget {measure.format_size(args.budget)}" if args.budget else ""
    print(f"{graph.name}, batch {batch}{budget}: {len(graph.layers)} layers, {graph.flops() / 1e9:,.2f} GFLOPs "
          f"forward; each strategy simulated on the meta device")
    head = ["strategy", "peak (all)", "peak (paper)", "peak/l_peak", "recomputed", "extra FLOPs", "moved", "host peak",
            "step (est.)", "vs resident"]
    table = [[r.label, measure.format_size(r.peak_bytes), measure.format_size(r.paper_peak_bytes),
              f"{r.paper.ratio:.2f}", r.trace.recompute_count, f"{r.extra_pct:.1f}%",
              measure.format_size(r.moved_bytes), measure.format_size(r.trace.host_peak_bytes),
              f"{timelines[i].step_ms:,.1f} ms", f"{timelines[i].step_ms / resident - 1:+.1%}"]
             + (["yes" if r.fits else "no"] if args.budget else []) for i, r in enumerate(rows)]
    print(_table(head + (["fits"] if args.budget else []), table))
    print("\n" + kind_table([(r.label, r.trace) for r in rows]))
    n = len(graph.route()[0])
    print(f"\npeak (all): everything on the device; peak (paper) and peak/l_peak: activations + gradients only. "
          f"extra FLOPs: recomputed forward work, % of one forward pass; moved: bytes to the host and back.\n"
          f"'+' rows: on top of liveness. {measure.SQRT_LABEL}: Chen et al. 2016's reference, keep every "
          f"{_ordinal(max(1, round(n ** 0.5)))} of the {n} layers' outputs, recompute each "
          f"segment once in backward, liveness on (snlite.measure.checkpoint_plan)."
          + ("" if args.budget else " Without --budget the cache never has to move anything.")
          + f" ({seconds:.1f} s)\nstep (est.): one iteration on the {prof.name} profile (snlite.timing: a roofline model "
          f"of the kernels, copies at PCIe bandwidth on their own streams, Numba's launch cost on the host); vs "
          f"resident: against every tensor resident (liveness only, {resident:,.1f} ms)\n{KIND_NOTE}")
    print(f"\nsuperneurons() runs in {measure.format_size(smallest.budget_bytes)} at the least, {smallest.ratio:.2f} x "
          f"(l_peak {measure.format_size(smallest.l_peak_bytes)} + what it holds all iteration "
          f"{measure.format_size(smallest.persistent_bytes)}): the paper's \"peak about l_peak\", as a budget "
          f"(snlite.search.min_budget)")
    if not fits:
        print(f"\nno strategy fits {measure.format_size(args.budget)}: see why, and what would, with "
              f"snlite plan {args.net} --batch {batch} --budget {args.budget}")
        return EXIT_DOES_NOT_FIT
    return 0


def _found_json(rows, key: str) -> list[dict]:
    return [{"strategy": r.label, "config": r.config.describe(), key: r.value, "next": r.next_value,
             "capped": r.capped, "peak_bytes": r.trace.peak_bytes if r.trace else None,
             "host_peak_bytes": r.host_peak_bytes, "by_kind": measure.by_kind_json(r.trace), "probes": r.probes,
             "seconds": r.seconds} for r in rows]


def _found_cell(r) -> str:
    return "none" if r.value is None else (f">= {r.value:,d}" if r.capped else f"{r.value:,d}")


def cmd_maxbatch(args) -> int:
    build = _builder(args.net)
    build(1)  # an unknown name fails here, before the search
    t0 = time.perf_counter()
    status = Status("snlite maxbatch", args.quiet)
    rows = search.max_batch_table(build, args.budget, args.max_batch, progress=status,
                                  host_budget_bytes=args.host_budget)
    status.clear()
    seconds = time.perf_counter() - t0
    status_code = 0 if any(r.value is not None for r in rows) else EXIT_DOES_NOT_FIT
    if args.json:
        _write_json(args.json, {"net": args.net, "budget_bytes": args.budget, "count": "all",
                                "rows": _found_json(rows, "batch"), "seconds": seconds})
        if args.json == "-":
            return status_code
    paper = search.PAPER_BATCH.get(args.net.lower())
    other = search.PAPER_BEST_OTHER_BATCH.get(args.net.lower())
    print(f"largest batch of {args.net} in {measure.format_size(args.budget)}, simulated on the meta device "
          f"(count all: weights, gradients, momentum, the batch, activations and workspace all on the device)")
    head = ["strategy", "batch", "peak", "host memory", "probes"] + (["paper"] if paper else [])
    table = [[r.label, _found_cell(r), measure.format_size(r.trace.peak_bytes if r.trace else None),
              measure.format_size(r.host_peak_bytes), r.probes]
             + ([f"{paper:,d}" if r.label == "superneurons" else ""] if paper else []) for r in rows]
    print(_table(head, table))
    print("\n" + kind_table([(r.label, r.trace) for r in rows]) + "\n" + KIND_NOTE)
    if paper:
        print(f"paper ({PAPER_GPU}, docs/paper.md section 7): SuperNeurons {paper:,d}; the best other framework "
              f"{other:,d}")
    if any(r.capped for r in rows):
        print(f">=: still fits at the ceiling, batch {args.max_batch:,d} (--max-batch, default {search.MAX_BATCH:,d}: "
              f"the search probes no further); raise it with --max-batch")
    if status_code:
        print(f"not even a batch of 1 fits {measure.format_size(args.budget)} under any strategy"
              + (f" and {measure.format_size(args.host_budget)} of pinned host memory" if args.host_budget else ""))
    print(f"took {seconds:.1f} s")
    return status_code


def cmd_maxdepth(args) -> int:
    t0 = time.perf_counter()
    units, why = planner_ceiling(args.max_units)
    status = Status("snlite maxdepth", args.quiet)
    rows = search.max_depth_table(args.batch, args.budget, units, progress=status, host_budget_bytes=args.host_budget)
    status.clear()
    seconds = time.perf_counter() - t0
    status_code = 0 if any(r.value is not None for r in rows) else EXIT_DOES_NOT_FIT
    if args.json:
        _write_json(args.json, {"batch": args.batch, "budget_bytes": args.budget, "count": "all",
                                "rows": _found_json(rows, "depth"), "seconds": seconds})
        if args.json == "-":
            return status_code
    print(f"deepest ImageNet ResNet (depth = 3 * residual units + 2) at batch {args.batch} in "
          f"{measure.format_size(args.budget)}, simulated on the meta device (count all: weights, gradients, "
          f"momentum, the batch, activations and workspace all on the device)")
    paper = search.PAPER_DEPTH_AT_BATCH.get(args.batch)
    head = ["strategy", "depth", "units", "peak", "host memory", "probes", "time"] + (["paper"] if paper else [])
    table = [[r.label, _found_cell(r), "-" if r.value is None else f"{(r.value - 2) // 3:,d}",
              measure.format_size(r.trace.peak_bytes if r.trace else None), measure.format_size(r.host_peak_bytes),
              r.probes, f"{r.seconds:.1f} s"] + ([f"{paper:,d}" if r.label == "superneurons" else ""] if paper else [])
             for r in rows]
    print(_table(head, table))
    print("\n" + kind_table([(r.label, r.trace) for r in rows]) + "\n" + KIND_NOTE)
    if any(r.capped for r in rows):
        print(f">=: still fits at the ceiling {3 * units + 2:,d} ({units:,d} residual units; {why}); raise it with "
              f"--max-units")
    elif units < args.max_units:
        print(f"(the search's ceiling was {3 * units + 2:,d}, {units:,d} residual units: {why})")
    print(f"paper ({PAPER_GPU}, docs/paper.md section 7): at batch 16 "
          + ", ".join(f"{k} {v:,d}" for k, v in search.PAPER_DEPTH.items())
          + f"; at batch 1 SuperNeurons {search.PAPER_DEPTH_AT_BATCH[1]:,d} (2,500 residual units)")
    if status_code:
        print(f"not even ResNet-50 fits {measure.format_size(args.budget)} at batch {args.batch} under any strategy"
              + (f" and {measure.format_size(args.host_budget)} of pinned host memory" if args.host_budget else ""))
    print(f"took {seconds:.1f} s")
    return status_code


def cmd_paper(args) -> int:
    from snlite import report

    out = os.path.expanduser(args.out)  # checked before the work (cli_args.check_outputs)
    status = Status("snlite paper", args.quiet)

    def log(text: str) -> None:
        status.clear()
        print(text, flush=True)

    rep = report.paper_report(out, quick=args.quick, log=log, progress=status,
                              command="snlite paper --out " + args.out + (" --quick" if args.quick else ""))
    status.clear()
    figures = sum(len(s.figures) for s in rep.sections)
    print(f"wrote {rep.path} ({len(rep.sections)} sections, {figures} figures"
          + (f"; no figures: {rep.plots}" if rep.plots else "") + f"); took {rep.seconds:.1f} s in all")
    return 0


def cmd_bench(args) -> int:
    from snlite import bench

    try:
        from kernels import bench as kernel_bench
        reason = kernel_bench.no_gpu_reason()
    except ImportError as e:
        kernel_bench, reason = None, f"numba.cuda cannot be imported ({e})."
    status = 0
    if reason:
        print(f"GPU kernel benchmark: no GPU here ({reason.removeprefix('No GPU benchmark: ')})")
    else:
        status = kernel_bench.main(["--out", args.out] + (["--quick"] if args.quick else []))
    print(f"\nCPU planning benchmark (python -m snlite.bench deep --units {args.units}):")
    return bench.main(["deep", "--units", str(args.units), "--batch", str(args.batch)]) or status



PLAN_COMMANDS = {"plan": cmd_plan, "compare": cmd_compare, "maxbatch": cmd_maxbatch, "maxdepth": cmd_maxdepth,
                 "paper": cmd_paper, "bench": cmd_bench, "check": cmd_check, "optimal": cmd_optimal}
