"""Planning benchmarks that need no GPU (the GPU kernel benchmark is ``python -m kernels.bench``).

    python -m snlite.bench torch [--batch 4]     # PyTorch's measured peak against snlite's prediction
    python -m snlite.bench coverage              # which of torchvision's classifiers from_torch imports
    python -m snlite.bench deep [--units 2500]   # the program of the paper's deepest ResNet, timed; scaling
    python -m snlite.bench searches              # the planner's long commands, whole, on one core, timed
    python -m snlite.bench tutorials [--quick]   # every tutorial as a script, on one core, timed
    python -m snlite.bench zoo [--batch 16]      # peak / l_peak of the zoo under each preset, and the
                                                 # smallest budget of superneurons() / l_peak (Markdown);
                                                 # then each fit's arena / lower bound (--table fits)
    python -m snlite.bench host [--repeats 5]    # training img/s on the host device against PyTorch's
                                                 # CPU (when installed), 1 and all threads (Markdown)
    python -m snlite.bench host --breakdown      # where a host step's time goes, by layer kind and phase

Figures are printed, never asserted: timing belongs in benchmarks, not in unit tests.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

try:
    import resource
except ImportError:  # Windows: no CPU time of children
    resource = None

from snlite import bench_host, bench_torch, files, offline
from snlite.cli_args import _batch, _positive_int
from snlite.config import CHOICES, MemoryConfig
from snlite.models import DEFAULT_BATCH, get_model, resnet
from snlite.pipeline import place, simulate
from snlite.scheduler import Scheduler
from snlite.search import min_budget
from snlite.trace import trace_program

PRESETS = {
    "baseline": MemoryConfig(),
    "liveness": MemoryConfig(liveness=True),
    "+offload": MemoryConfig(liveness=True, offload=True),
    "+recompute": MemoryConfig(liveness=True, offload=True, recompute="cost_aware"),
    "superneurons": MemoryConfig.superneurons(),
}
FITS = CHOICES["fit"]
ZOO = ("lenet", "alexnet", "vgg16", "resnet50", "resnet101", "resnet152", "inception_v4", "densenet121")


SCALING = (250, 500, 1000, 2500)


def deep(units: int = 2500, batch: int = 1, scaling=SCALING) -> dict:
    """Build the graph of a ResNet of ``units`` bottleneck units (the paper's deepest run), then its
    program under the baseline and superneurons(), phase by phase (the scheduler's plan, the
    placement walk, the trace), each timed in wall and CPU seconds; then the superneurons() program's
    build time at each depth of ``scaling`` (it should grow linearly)."""
    depth = 3 * units + 2
    clock = _Clock()
    g = resnet(depth, batch=batch)
    g.steps()
    out = {"depth": depth, "layers": len(g.layers), "build_s": clock.lap(), "build_cpu_s": clock.cpu}
    for label in ("baseline", "superneurons"):
        config = PRESETS[label]
        plan = Scheduler(g, config).plan()
        plan_s, plan_cpu = clock.lap(), clock.cpu
        program = place(g, config, plan=plan)  # the program place(g, config) makes, its plan timed apart
        place_s, place_cpu = clock.lap(), clock.cpu
        tr = trace_program(program, "paper")
        out[label] = {"plan_s": plan_s, "place_s": place_s, "program_s": plan_s + place_s,
                      "trace_s": clock.lap(), "cpu_s": plan_cpu + place_cpu + clock.cpu,
                      "instructions": len(program), "peak_bytes": tr.peak_bytes,
                      "l_peak_bytes": tr.l_peak_bytes, "steps": len(tr.op_steps)}  # the plan's ops
    out["scaling"] = []
    for u in sorted({u for u in scaling if u < units} | {units}):
        graph = g if u == units else resnet(3 * u + 2, batch=batch)
        graph.steps()
        clock.lap()
        program = place(graph, PRESETS["superneurons"])
        out["scaling"].append({"units": u, "layers": len(graph.layers), "instructions": len(program),
                               "program_s": clock.lap()})
    return out


class _Clock:
    """Laps in wall seconds; ``cpu``: this process's CPU seconds over the last lap."""

    def __init__(self):
        self.wall, self.cpu_at, self.cpu = time.perf_counter(), time.process_time(), 0.0

    def lap(self) -> float:
        wall, cpu = time.perf_counter(), time.process_time()
        lap, self.cpu = wall - self.wall, cpu - self.cpu_at
        self.wall, self.cpu_at = wall, cpu
        return lap


# the planner's long commands, each timed whole (a fresh process, its start-up included) on one core,
# with the lean planner's targets (docs/architecture.md): (name, command, target seconds)
TUTORIALS = pathlib.Path(__file__).resolve().parent.parent / "tutorials"
SEARCHES = (
    ("maxdepth --batch 16 --budget 12GiB", ["-m", "snlite.cli", "maxdepth", "--batch", "16", "--budget",
                                            "12GiB"], 30),
    ("maxdepth --batch 1 --budget 12GiB", ["-m", "snlite.cli", "maxdepth", "--batch", "1", "--budget",
                                           "12GiB"], 30),
    ("paper", ["-m", "snlite.cli", "paper", "--out", "{tmp}/paper"], 90),
    ("tutorial 07 (full mode)", [str(TUTORIALS / "07_end_to_end.py")], 60),
)


def _one_core() -> None:
    """Run the child on the first CPU only (the targets are for one core of a 2-core machine)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: unlike the wall time, what
    another program on the machine cannot inflate."""
    if resource is None:
        return float("nan")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def searches(names=None, show=print) -> list[dict]:
    """Each command of ``SEARCHES`` (those whose name starts with one of ``names``) run once as
    its own process on one core, BLAS single-threaded; its wall time against its target."""
    return [_timed(name, argv, target, show=show) for name, argv, target in SEARCHES
            if not names or any(name.startswith(n) for n in names)]


def tutorials(quick: bool = False, show=print) -> list[dict]:
    """Every tutorial run as a script (full mode; ``quick``: with SNLITE_TUTORIAL_QUICK=1), each its
    own process on one core, BLAS single-threaded, timed: tutorials/README.md's time column."""
    return [_timed(path.name, [str(path)], None, {"SNLITE_TUTORIAL_QUICK": "1"} if quick else {}, show)
            for path in sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))]


def _timed(name: str, argv: list, target, extra_env=None, show=print) -> dict:
    """Run ``python *argv`` once, a fresh process on one core, BLAS single-threaded; show and return
    its wall and CPU time (against ``target`` seconds, where there is one)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("SNLITE_TUTORIAL_QUICK", None)
    if argv[0].endswith(".py") and not pathlib.Path(argv[0]).exists():
        show(f"  {name:36} skipped: {argv[0]} is not here (an installed copy has no tutorials)")
        return {"name": name, "seconds": None, "cpu_s": None, "target_s": target, "status": 0}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable] + [a.replace("{tmp}", tmp) for a in argv]
        t0, cpu0 = time.perf_counter(), _children_cpu()
        done = subprocess.run(cmd, env={**env, **(extra_env or {}), "SNLITE_TUTORIAL_OUT": tmp},
                              capture_output=True, text=True, preexec_fn=_one_core)
        seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    verdict = "" if target is None else \
        f"  (target {target} s: {'within' if seconds <= target else 'OVER'})"
    show(f"  {name:36} {seconds:7.1f} s wall, {cpu:7.1f} s CPU{verdict}"
         + (f"  exit status {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"
            if done.returncode else ""))
    return {"name": name, "seconds": seconds, "cpu_s": cpu, "target_s": target, "status": done.returncode}


def zoo_table(batch: int | None = None, count: str = "paper") -> str:
    """Markdown: peak MiB and peak / l_peak per model and preset (unlimited budget, under ``count``),
    then the smallest budget under which superneurons() runs, divided by l_peak plus the weights,
    their gradients and momentum (:func:`snlite.search.min_budget`)."""
    head = "| model (batch) | " + " | ".join(PRESETS) + " | superneurons() min budget (ratio) |"
    rows = [head, "|---" * (len(PRESETS) + 2) + "|"]
    for name in ZOO:
        b = batch or DEFAULT_BATCH.get(name, 16)
        g = get_model(name, batch=b)
        cells = []
        for cfg in PRESETS.values():
            tr = simulate(g, cfg.replace(count=count))
            cells.append(f"{tr.peak_bytes / 2**20:,.0f} MiB ({tr.ratio:.2f})")
        m = min_budget(g)
        cells.append(f"{m.budget_bytes / 2**20:,.0f} MiB ({m.ratio:.2f})")
        rows.append(f"| {name} ({b}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def fit_table(batch: int | None = None, nets=ZOO) -> str:
    """Markdown: superneurons() without a budget placed under each fit, its arena against the lower
    bound (the most bytes live at once: the same program, so the same bound under every fit); then
    the smallest budget of superneurons() under first fit and offline, against l_peak plus what is
    held all iteration (:func:`snlite.search.min_budget`)."""
    rows = ["| model (batch) | lower bound | " + " | ".join(f"{f} fit: arena (ratio)" for f in FITS)
            + " | min budget, first fit (ratio) | min budget, offline (ratio) |",
            "|---" * (len(FITS) + 4) + "|"]
    for name in nets:
        b = batch or DEFAULT_BATCH.get(name, 16)
        g = get_model(name, batch=b)
        cells, lower = [], None
        for fit in FITS:
            arena, lower = offline.bounds(place(g, MemoryConfig.superneurons(fit=fit)))
            cells.append(f"{arena / 2**20:,.0f} MiB ({arena / lower:.3f})")
        for fit in ("first", "offline"):
            m = min_budget(g, MemoryConfig.superneurons(fit=fit))
            cells.append(f"{m.budget_bytes / 2**20:,.0f} MiB ({m.ratio:.3f})")
        rows.append(f"| {name} ({b}) | {lower / 2**20:,.0f} MiB | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def units_arg(text: str) -> int:
    """Residual units of a bottleneck ResNet snlite builds: 16 (ResNet-50), 33 (ResNet-101), 50 and up."""
    units = _positive_int(text)
    if units not in (16, 33) and units < 50:
        raise argparse.ArgumentTypeError(f"no bottleneck ResNet of {units} residual units: 16 (ResNet-50), "
                                         "33 (ResNet-101), or 50 and up (ResNet-152 and deeper)")
    return units


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m snlite.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    d = sub.add_parser("deep", help="simulate a ResNet with thousands of residual units, timed")
    d.add_argument("--units", type=units_arg, default=2500,
                   help="residual units of the deepest ResNet: 16, 33, or 50 and up (default 2500)")
    d.add_argument("--batch", type=_batch, default=1)
    z = sub.add_parser("zoo", help="peak and peak/l_peak of the zoo under each preset, as Markdown")
    z.add_argument("--batch", type=_batch, default=None, help="one batch for all (default: each model's)")
    z.add_argument("--count", choices=("all", "paper"), default="paper")
    z.add_argument("--table", choices=("presets", "fits", "both"), default="both",
                   help="the presets' peaks, the fits' arenas against the lower bound, or both (default)")
    z.add_argument("--nets", nargs="+", choices=ZOO, default=list(ZOO), help="the fits table's nets")
    s = sub.add_parser("searches",
                       help="maxdepth, paper and tutorial 07, each a whole command on one core, timed")
    s.add_argument("only", nargs="*",
                   help="names to run (a prefix each: maxdepth, paper, tutorial); default all")
    t = sub.add_parser("tutorials", help="every tutorial as a script, each on one core, timed")
    t.add_argument("--quick", action="store_true", help="with SNLITE_TUTORIAL_QUICK=1, as the tests run them")
    tp = sub.add_parser("torch", help="one training step of torchvision's models in PyTorch (CPU): the "
                        "measured peak against snlite's prediction (needs the torch extra)")
    tp.add_argument("--batch", type=_batch, default=4, help="images per step (default 4)")
    tp.add_argument("--models", nargs="+", choices=bench_torch.MODELS, default=list(bench_torch.MODELS))
    sub.add_parser("coverage", help="which of torchvision's classifiers from_torch imports, and why not "
                   "(needs the torch extra)")
    h = sub.add_parser("host", help="train LeNet and ResNet-8 on the host device and in PyTorch (CPU), img/s")
    h.add_argument("--repeats", type=_positive_int, default=5,
                   help="timed repeats, interleaved; the median is shown")
    h.add_argument("--steps", type=_positive_int, default=3, help="training steps per repeat")
    h.add_argument("--nets", nargs="+", choices=("lenet", "resnet8"), default=["lenet", "resnet8"])
    h.add_argument("--threads", type=_positive_int, nargs="+", default=None,
                   help="thread counts (default: 1 and all)")
    h.add_argument("--breakdown", action="store_true",
                   help="instead: where one baseline step of each net goes, "
                   "by layer kind and phase, and its BLAS share (one thread unless --threads)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.what == "host":
        if args.breakdown:
            for net in args.nets:
                print(bench_host.breakdown_table(bench_host.breakdown(net, threads=(args.threads or [1])[0])))
            return 0

        print(f"Host training speed, median of {args.repeats} interleaved repeats of {args.steps} steps "
              f"({bench_host.describe_threads()}):")
        print(bench_host.table(bench_host.host(args.nets, args.repeats, args.steps, args.threads)))
        return 0
    if args.what == "torch":
        print(f"One SGD step at batch {args.batch}, 3x224x224: PyTorch's peak (CPU, every tensor storage "
              f"alive, op by op) and snlite's prediction under {bench_torch.LIKE_AUTOGRAD.describe()} "
              "(meta device):")
        print(bench_torch.table([bench_torch.compare(m, args.batch) for m in args.models]))
        return 0
    if args.what == "coverage":
        bench_torch.coverage()
        return 0
    if args.what == "searches":
        print("The planner's long commands, each a fresh process on one core (wall time):")
        rows = searches(args.only)
        return 1 if any(r["status"] for r in rows) else 0
    if args.what == "tutorials":
        print("Each tutorial as a script, a fresh process on one core"
              + (", quick mode (SNLITE_TUTORIAL_QUICK=1)" if args.quick else ", full mode") + ":")
        rows = tutorials(args.quick)
        return 1 if any(r["status"] for r in rows) else 0
    if args.what == "deep":
        r = deep(args.units, args.batch)
        print(f"ResNet-{r['depth']} ({args.units} residual units, {r['layers']:,d} layers), "
              f"batch {args.batch}: graph built in {r['build_s']:.2f} s")
        print(f"  {'':13} {'plan':>6} {'placement':>10} {'trace':>6} {'instructions':>13} {'ops':>7} "
              f"{'peak (paper count)':>19} {'l_peak':>10}")
        for label in ("baseline", "superneurons"):
            s = r[label]
            print(f"  {label:13} {s['plan_s']:5.2f}s {s['place_s']:9.2f}s {s['trace_s']:5.2f}s "
                  f"{s['instructions']:13,d} {s['steps']:7,d} {s['peak_bytes'] / 2**20:15,.1f} MiB "
                  f"{s['l_peak_bytes'] / 2**20:6,.1f} MiB")
        sn = r["superneurons"]
        total = r["build_s"] + sn["program_s"] + sn["trace_s"]
        print(f"  superneurons(): graph + plan + placement + trace {total:.2f} s wall, "
              f"{r['build_cpu_s'] + sn['cpu_s']:.2f} s CPU (the lean planner's target at 2,500 units: "
              f"3 s on one core)")
        print("superneurons() program build time by depth (linear in depth: ms per unit stays flat):")
        print(f"  {'units':>6} {'layers':>8} {'instructions':>13} {'seconds':>8} {'ms per unit':>12}")
        for s in r["scaling"]:
            print(f"  {s['units']:6,d} {s['layers']:8,d} {s['instructions']:13,d} {s['program_s']:8.2f} "
                  f"{1e3 * s['program_s'] / s['units']:12.2f}")
    else:
        if args.table != "fits":
            print(zoo_table(args.batch, args.count))
        if args.table != "presets":
            print("\nsuperneurons() under each fit: arena / lower bound (the most bytes live at once), "
                  "and its smallest budget / (l_peak + held all iteration):")
            print(fit_table(args.batch, args.nets))
    return 0


if __name__ == "__main__":
    raise SystemExit(files.main(main))
