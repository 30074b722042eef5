"""The two commands that run whole suites: ``snlite paper`` (every GPU-free experiment of the paper,
written to a Markdown report by :mod:`snlite.report`) and ``snlite bench`` (the GPU kernel benchmark,
:mod:`kernels.bench`, where there is a GPU, and the CPU planning benchmark, :mod:`snlite.bench`)."""
from __future__ import annotations

import os

from kernels import bench as kernel_bench
from snlite import bench, report
from snlite.cli_args import Status, _batch, add_quiet_flag


def add_paper_command(sub) -> None:
    paper = sub.add_parser("paper", help="reproduce the paper's byte-accounting experiments; write a report",
                           description="Every experiment of the paper that needs no GPU, on the meta device: "
                                       "AlexNet's memory trajectory per technique, the recomputation "
                                       "strategies, traffic with and without the tensor cache, Table 4 "
                                       "(depth) and Table 5 (width) in 12 GiB, the peak vs extra compute "
                                       "trade-off. Prints each table and writes DIR/report.md (with PNG "
                                       "figures if matplotlib is installed). About three minutes on a 2-core "
                                       "CPU; --quick: about ten seconds.")
    paper.add_argument("--out", default="paper-out", metavar="DIR",
                       help="where report.md and its figures go (default paper-out; created if missing)")
    paper.add_argument("--quick", action="store_true",
                       help="fewer networks, batches and strategies (for tests)")
    add_quiet_flag(paper)


def add_bench_command(sub) -> None:
    p = sub.add_parser("bench", help="the GPU kernel benchmark (if there is a GPU) and the CPU planning one",
                       description="On a real GPU, run the kernel benchmark (python -m kernels.bench); "
                                   "elsewhere say so. Then, always, time the planning of a very deep ResNet "
                                   "on the CPU (python -m snlite.bench deep).")
    p.add_argument("--units", type=bench.units_arg, default=2500,
                   help="residual units of the planned ResNet: 16, 33, or 50 and up (default 2500: the "
                        "paper's deepest)")
    p.add_argument("--batch", type=_batch, default=1, help="its batch (default 1)")
    p.add_argument("--out", default="bench-out", metavar="DIR",
                   help="where the GPU benchmark writes bench.json")
    p.add_argument("--quick", action="store_true", help="the GPU benchmark's smaller sizes")


def cmd_paper(args) -> int:
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
    status = 0
    reason = kernel_bench.no_gpu_reason()
    if reason:
        print(f"GPU kernel benchmark: no GPU here ({reason.removeprefix('No GPU benchmark: ')})")
    else:
        status = kernel_bench.main(["--out", args.out] + (["--quick"] if args.quick else []))
    print(f"\nCPU planning benchmark (python -m snlite.bench deep --units {args.units}):")
    return bench.main(["deep", "--units", str(args.units), "--batch", str(args.batch)]) or status
