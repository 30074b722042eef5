"""``snlite paper``: every byte-accounting experiment of the paper that needs no GPU, in one report.

    from snlite import report
    rep = report.paper_report("paper-out", quick=True)   # prints each table, writes paper-out/report.md
    rep.sections[0].tables[0].rows                       # the numbers, as plain data

Each experiment is one function that returns a :class:`Section` (its tables, notes and figures);
every number comes from :mod:`snlite.measure` and :mod:`snlite.search` (``measure``, ``compare``,
``max_batch``, ``max_depth``), which runs :func:`snlite.simulate` on the meta device. The paper's
figures (docs/paper.md section 7) are shown alongside as references, not as targets: the paper counted
activations and gradients on its own runtime (cuDNN, a 12 GB K40); snlite counts its own pool, byte for
byte.

The sections live in :mod:`snlite.report_memory` (1, 2, 6, 7: the peak) and :mod:`snlite.report_scale`
(3, 4, 5, 8: traffic, depth, width, speed); :mod:`snlite.report_tables` holds what a report is made of
(Table, Section, Report) and its header. This module runs them in order and writes the file.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time

from snlite import files, measure, plot, search
from snlite.models import DEFAULT_BATCH
from snlite.report_memory import min_budgets, recompute, tradeoff, trajectory
from snlite.report_scale import depth, speed, traffic, width
from snlite.report_tables import Report, Section, header


# ---------------------------------------------------------------------------- figures
def _plots():
    """(snlite.plot, None) if matplotlib is there, else (None, the reason: a line that says how to
    install it)."""
    try:
        plot.require_matplotlib()
    except plot.PlotUnavailable as e:
        return None, str(e)
    return plot, None


def _draw_trajectory(plots, out: str, section: Section, runs: dict, batch: int) -> None:
    for count, words in (("paper", "activations + gradients (the paper's count)"),
                         ("all", "all device memory")):
        name = f"alexnet_b{batch}_trajectory_{count}.png"
        traces = {label: (m.paper if count == "paper" else m.trace) for label, m in runs.items()}
        plots.plot_compare_timelines(traces, os.path.join(out, name),
                                     title=f"AlexNet, batch {batch}: {words} per op, one training iteration")
        section.figures.append((name, f"AlexNet batch {batch} memory per op, {words}, under each technique"))


# ---------------------------------------------------------------------------- the report
ZOO = ("lenet", "alexnet", "vgg16", "resnet50", "resnet101", "resnet152", "inception_v4", "densenet121")
FULL = dict(recompute=[("alexnet", 200), ("resnet50", 32), ("resnet101", 32)],
            sweep=[("alexnet", (50, 100, 400)), ("resnet50", (8, 16, 32, 64, 128)),
                   ("resnet101", (8, 16, 32, 64, 128))],
            traffic=[256, 512, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560],
            depth=list(search.SEARCH), width=["alexnet", "vgg16", "inception_v4", "resnet50", "resnet101",
                                               "resnet152"],
            min_budget=[(n, DEFAULT_BATCH[n]) for n in ZOO] + [("resnet50", 32)],
            speed=[("alexnet", 1024), ("vgg16", 224), ("inception_v4", 240), ("resnet50", 384),
                   ("resnet101", 256), ("resnet152", 176)], suffices=[("alexnet", 200), ("resnet50", 64)])
QUICK = dict(recompute=[("alexnet", 200), ("resnet50", 32)],
             sweep=[("alexnet", (50, 400)), ("resnet50", (16, 32))],
             traffic=[256, 1024], depth=["baseline", "liveness"], width=["alexnet"],
             min_budget=[("alexnet", 200), ("resnet50", 32)], speed=[("alexnet", 1024)],
             suffices=[("alexnet", 200)])


def paper_report(out: str, quick: bool = False, command: str | None = None, log=print,
                 progress=measure.no_progress) -> Report:
    """Run every experiment (``QUICK``: fewer models and strategies), ``log`` each section as it is
    done, and write ``out/report.md`` with the figures beside it (when matplotlib is there).
    ``progress(text)`` is told what runs (``snlite paper`` shows it on stderr). The files are made in
    a hidden folder inside ``out`` and moved in at the end, the report last: a run that fails or is
    interrupted leaves the report and figures of the run before it as they were."""
    os.makedirs(out, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".snlite-paper-", dir=out)
    try:
        command = command or f"snlite paper --out {out}" + (" --quick" if quick else "")
        report = _paper_report(staging, quick, command, log, progress)
        for name in sorted(os.listdir(staging), key=lambda n: n == "report.md"):  # the report last
            files.copy_into(os.path.join(staging, name), os.path.join(out, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dataclasses.replace(report, path=os.path.join(out, "report.md"))


def _paper_report(out: str, quick: bool, command: str, log, progress) -> Report:
    t0 = time.perf_counter()
    plan = QUICK if quick else FULL
    plots, missing = _plots()
    sections = []

    def add(section: Section, started: float) -> None:
        section.seconds = time.perf_counter() - started
        sections.append(section)
        log(section.markdown() + "\n")

    def step(i: int, title: str):
        return lambda text: progress(f"section {i}/8 ({title}): {text}")

    s = time.perf_counter()
    section, runs = trajectory(200, step(1, "trajectory"))
    if plots is not None:
        _draw_trajectory(plots, out, section, runs, 200)
    add(section, s)
    s = time.perf_counter()
    add(recompute(plan["recompute"], plan.get("sweep", ()), step(2, "recomputation")), s)
    s = time.perf_counter()
    add(traffic(plan["traffic"], step(3, "traffic")), s)
    s = time.perf_counter()
    add(depth(16, plan["depth"], step(4, "Table 4, depth")), s)
    s = time.perf_counter()
    add(width(plan["width"], step(5, "Table 5, width")), s)
    s = time.perf_counter()
    section, points = tradeoff(200, step(6, "trade-off"))
    if plots is not None:
        plots.plot_tradeoff(points, os.path.join(out, "alexnet_b200_tradeoff.png"),
                            title="AlexNet, batch 200: peak (activations + gradients) against extra compute")
        section.figures.append(("alexnet_b200_tradeoff.png", "AlexNet batch 200, peak against extra compute"))
    add(section, s)
    s = time.perf_counter()
    add(min_budgets(plan.get("min_budget", ()), step(7, "min budget")), s)
    s = time.perf_counter()
    add(speed(plan["speed"], plan["suffices"], step(8, "speed")), s)

    seconds = time.perf_counter() - t0
    path = os.path.join(out, "report.md")
    with files.replacing(path) as f:
        body = "\n\n".join(x.markdown() for x in sections)
        f.write(header(command, quick, missing, seconds) + "\n\n" + body + "\n")
    return Report(sections, path, seconds, quick, missing)
