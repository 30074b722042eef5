"""Plots of what a run did: memory timelines, trade-offs, GPU stream timelines.

matplotlib is an optional extra (``pip install -e ".[plot]"``); it is imported only inside these
functions, figures are drawn on the non-interactive Agg canvas and written to files, and no window
is ever opened. Every ``plot_*`` function saves its figure to ``path`` and returns ``path``: a PNG, an
SVG or a PDF, as the file name's suffix says (:func:`figure_format`; another suffix is refused before
anything is drawn).

    import snlite
    from snlite import plot
    trace = snlite.simulate(snlite.models.alexnet(batch=200), snlite.MemoryConfig.superneurons())
    plot.plot_timeline(trace, "alexnet.png")
    plot.alexnet_figure("docs/alexnet_b200_timeline.png")     # the figure of docs/results.md

``python -m snlite.plot [PATH]`` regenerates that figure (``--help`` says more).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import numpy as np

from snlite import files
from snlite.config import MemoryConfig
from snlite.models import alexnet
from snlite.pipeline import simulate
from snlite.trace import CATEGORIES, PAPER_CATEGORIES

MIB = float(1 << 20)
INSTALL_HINT = 'plots need matplotlib: pip install -e ".[plot]"  (or: pip install "matplotlib>=3.8")'
COLORS = {"weights": "#8e9aaf", "weight_grads": "#b8c0cc", "optimizer": "#dde1e7", "input": "#a67c52",
          "activations": "#1f77b4", "gradients": "#ff7f0e", "workspace": "#2ca02c", "in_flight": "#d62728"}
STREAM_ORDER = ("compute", "copy_out", "copy_in")
FORMATS = ("png", "svg", "pdf")  # what matplotlib's Agg canvas writes, named by a file's suffix


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def require_matplotlib():
    """The pyplot module, on the Agg backend unless pyplot was already set up by the caller."""
    try:
        import matplotlib
        if "matplotlib.pyplot" not in sys.modules:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotUnavailable(INSTALL_HINT) from e
    return plt


def _mib(nbytes: float) -> str:
    """MiB with one decimal, or two below 10 MiB (small networks)."""
    v = nbytes / MIB
    return f"{v:,.1f}" if v >= 10 else f"{v:,.2f}"


def _figure(width: float, height: float):
    """A Figure on its own Agg canvas: never registered with pyplot, so no window and no leak."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def figure_format(path) -> str:
    """The format a plot's file name asks for, from its suffix in any case: "png", "svg" or "pdf".
    ValueError for any other suffix or none (a file named ``.txt`` that held a PNG would mislead)."""
    name = os.fspath(path)
    stem, suffix = os.path.splitext(name)
    if suffix.lower().lstrip(".") in FORMATS:
        return suffix.lower().lstrip(".")
    given = f"its suffix is {suffix!r}" if suffix else "it has no suffix"
    raise ValueError(f"{name}: a plot is written as PNG, SVG or PDF, chosen by the file name's suffix, and "
                     f"{given}; name it e.g. {os.path.basename(stem) or 'plot'}.png (or .svg, .pdf)")


def _save(fig, path):
    with files.replacing(path, "wb") as f:  # a figure that fails half-way leaves the old file as it was
        fig.savefig(f, format=figure_format(path), dpi=110)
    return path


# ---- the data behind a timeline (pure; no matplotlib) ----

def downsample(totals, max_points: int) -> np.ndarray:
    """Indices into ``totals`` (sorted, at most ``max_points``): the series cut into equal buckets,
    keeping from each the index of its largest value, so every bucket's peak (and the global one) stays."""
    totals = np.asarray(totals)
    n = len(totals)
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    if n <= max_points:
        return np.arange(n)
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    return np.array([lo + int(np.argmax(totals[lo:hi])) for lo, hi in zip(edges[:-1], edges[1:])])


@dataclass
class Timeline:
    """What a timeline plot draws: for each kept op, MiB per category (all-zero categories left out)."""

    ops: np.ndarray  # positions in trace.steps
    categories: tuple
    mib: np.ndarray  # (len(categories), len(ops))
    total_mib: np.ndarray  # per kept op
    backward_op: int | None  # first backward op (the forward/backward boundary)
    recompute_ops: np.ndarray  # ops that recompute a forward (all of them, not downsampled)
    peak_op: int  # position in trace.steps of the plotted peak
    peak_mib: float


def timeline_series(trace, count: str | None = None, max_points: int = 2000) -> Timeline:
    """Bytes by category per op, in MiB, downsampled to at most ``max_points`` ops (see ``downsample``).
    ``count`` ("all" or "paper", default the trace's) picks the categories that are stacked."""
    count = count or trace.count
    if count not in ("all", "paper"):
        raise ValueError(f'count must be "all" or "paper", got {count!r}')
    if not trace.steps:
        raise ValueError("the trace has no steps to plot")
    cats = PAPER_CATEGORIES if count == "paper" else CATEGORIES
    full = np.array([[r.device_bytes.get(c, 0) for c in cats] for r in trace.steps], dtype=np.float64).T / MIB
    keep = full.any(axis=1)
    if not keep.any():
        keep[:] = True
    cats, full = tuple(c for c, k in zip(cats, keep) if k), full[keep]
    totals = full.sum(axis=0)
    if count == trace.count and 0 <= trace.peak_op < len(totals) and totals[trace.peak_op] == totals.max():
        peak = trace.peak_op
    else:
        peak = int(np.argmax(totals))
    ops = downsample(totals, max_points)
    phases = [r.phase for r in trace.steps]
    backward = next((i for i, p in enumerate(phases) if p == "backward"), None)
    recompute = np.array([i for i, p in enumerate(phases) if p == "recompute"], dtype=np.int64)
    return Timeline(ops, cats, full[:, ops], totals[ops], backward, recompute, peak, float(totals[peak]))


# ---- timelines ----

def _draw_timeline(ax, trace, tl: Timeline, count: str):
    """One stacked timeline on ``ax``: categories, the forward/backward boundary, the peak, l_peak."""
    from matplotlib.ticker import MaxNLocator

    x = tl.ops
    polys = ax.stackplot(x, tl.mib, colors=[COLORS[c] for c in tl.categories], labels=tl.categories,
                         step="mid" if len(x) <= 400 else None, linewidth=0)
    for poly, c in zip(polys, tl.categories):
        if c == "in_flight":
            poly.set_hatch("///")
            poly.set_edgecolor("white")
    n = len(trace.steps)
    ax.set_xlim(-0.5, n - 0.5)
    if tl.backward_op is not None:
        ax.axvline(tl.backward_op - 0.5, color="black", linestyle="--", linewidth=1, label="backward begins")
        sec = ax.secondary_xaxis("top")
        sec.set_xticks([(tl.backward_op - 0.5) / 2, (tl.backward_op - 0.5 + n - 0.5) / 2],
                       labels=["forward", "backward"])
        sec.tick_params(length=0, labelsize=9)
    if len(tl.recompute_ops) and len(tl.recompute_ops) <= 2000:
        ax.plot(tl.recompute_ops, np.zeros(len(tl.recompute_ops)), linestyle="none", marker="|", markersize=9,
                color="#7b3294", clip_on=False, label="recomputed forward")
    if count == trace.count and trace.l_peak_bytes:
        ax.axhline(trace.l_peak_bytes / MIB, color="#555555", linestyle=":", linewidth=1.2,
                   label="l_peak (the busiest step, each tensor once)")
    r = trace.steps[tl.peak_op]
    ax.plot([tl.peak_op], [tl.peak_mib], marker="v", color="#b2182b", markersize=8, linestyle="none",
            zorder=5)
    right = tl.peak_op > 0.6 * n  # the label goes to the side with more room
    where = f"step {r.step}: {r.layer} ({r.phase})" if r.op >= 0 else f"{r.layer}'s SGD update after backward"
    ax.annotate(f"peak {_mib(tl.peak_mib * MIB)} MiB at {where}",
                xy=(tl.peak_op, tl.peak_mib), xytext=(-12 if right else 12, 9), textcoords="offset points",
                ha="right" if right else "left", va="bottom", fontsize=8.5, zorder=6,
                bbox=dict(boxstyle="round,pad=0.25", facecolor="white", edgecolor="#b2182b", alpha=0.9),
                arrowprops=dict(arrowstyle="-", color="#b2182b", linewidth=0.8))
    ax.set_ylabel("MiB", fontsize=9)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=8)
    ax.grid(axis="y", alpha=0.3)


def _tensor_box(ax, trace, limit: int = 5):
    """The largest tensors at the peak, in a box to the right of ``ax``."""
    rows = [f"{name[:18]:18} {_mib(b):>9}" for name, b in trace.peak_tensors[:limit]] or ["(none recorded)"]
    if any("#r" in name for name, _ in trace.peak_tensors[:limit]):
        rows.append("(#rN: a recomputed copy)")
    ax.text(1.015, 1.0, "largest at the peak (MiB)\n" + "\n".join(rows), transform=ax.transAxes, ha="left",
            va="top", fontsize=7.5, family="monospace",
            bbox=dict(boxstyle="round,pad=0.4", facecolor="#f7f7f7", edgecolor="#999999"))


def _legend(fig, axes) -> int:
    """One legend under the panels (each label once); returns its number of rows."""
    handles: dict = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    ncol = min(len(handles), 6)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8,
               frameon=False, bbox_to_anchor=(0.42, 0.0))
    return -(-len(handles) // ncol)  # rows


def _count_words(count: str) -> str:
    return "activations + gradients (paper count)" if count == "paper" else "all device memory"


def _timelines(traces: dict, path, title, count, max_points, shared_y: bool):
    figure_format(path)  # a file name that names no format is refused before anything is drawn
    if not traces:
        raise ValueError("no traces to plot")
    n = len(traces)
    fig = _figure(12, 5)
    axes = fig.subplots(n, 1, sharey=shared_y, squeeze=False)[:, 0]
    counts = [count or t.count for t in traces.values()]
    series = [timeline_series(t, c, max_points) for t, c in zip(traces.values(), counts)]
    top = max(s.peak_mib for s in series) or 1.0
    for ax, (label, trace), tl, c in zip(axes, traces.items(), series, counts):
        _draw_timeline(ax, trace, tl, c)
        ax.set_ylim(0, top * 1.3)
        ratio = f", l_peak {_mib(trace.l_peak_bytes)} MiB, peak/l_peak {trace.ratio:.2f}" \
            if c == trace.count and trace.l_peak_bytes else ""
        head = f"{label}: " if label else ""
        ax.set_title(f"{head}peak {_mib(tl.peak_mib * MIB)} MiB{ratio}", loc="left", fontsize=9.5,
                     fontweight="bold")
        _tensor_box(ax, trace)
    sgd = any(r.op < 0 for t in traces.values() for r in t.steps)
    axes[-1].set_xlabel("op (route order, recomputations included" + (", then the SGD updates after backward)"
                                                                       if sgd else ")"), fontsize=9)
    legend_rows = _legend(fig, axes)
    top_in, gap_in, panel_in = 0.85, 0.85, (3.2 if n == 1 else 2.0)  # the layout, in inches
    bottom_in = 0.6 + 0.2 * legend_rows
    height = top_in + bottom_in + n * panel_in + (n - 1) * gap_in
    fig.set_size_inches(12, height)
    fig.suptitle(title or f"memory per op: {_count_words(counts[0])}", fontsize=12, x=0.065,
                 y=1 - 0.1 / height, ha="left", va="top")
    fig.subplots_adjust(left=0.065, right=0.77, top=1 - top_in / height, bottom=bottom_in / height,
                        hspace=gap_in / panel_in)
    return _save(fig, path)


def plot_timeline(trace, path, title=None, max_points: int = 2000, count: str | None = None):
    """A stacked memory timeline per op by category (MiB), the backward boundary, the peak marked and
    the five largest tensors at the peak named. Long traces are downsampled (``downsample``)."""
    return _timelines({"": trace}, path, title, count, max_points, shared_y=False)


def plot_compare_timelines(traces: dict, path, title=None, max_points: int = 2000, count: str | None = None):
    """Several timelines (``{label: Trace}``) one above the other on one y scale."""
    return _timelines(dict(traces), path, title, count, max_points, shared_y=True)


# ---- trade-offs and streams ----

def plot_tradeoff(rows, path, title=None, base_flops: float | None = None):
    """Peak memory (MiB) against extra compute, one labelled point per row (``label``, ``peak_bytes``,
    ``extra_flops``, optional ``moved_bytes`` and ``base_flops``); the Pareto frontier is drawn as a step
    line.
    Extra compute is in GFLOPs, or % of the forward FLOPs when ``base_flops`` is given (argument or rows)."""
    figure_format(path)
    rows = list(rows)
    if not rows:
        raise ValueError("no rows to plot")
    percent = base_flops is not None or all(r.get("base_flops") for r in rows)
    xs = np.array([100.0 * r["extra_flops"] / (base_flops or r["base_flops"]) if percent
                   else r["extra_flops"] / 1e9 for r in rows])
    ys = np.array([r["peak_bytes"] / MIB for r in rows])
    # a point is dominated when another has no more memory and no more compute, and less of one
    dominated = np.array([any(xs[j] <= xs[i] and ys[j] <= ys[i] and (xs[j] < xs[i] or ys[j] < ys[i])
                              for j in range(len(rows))) for i in range(len(rows))])
    fig = _figure(9, 5.5)
    ax = fig.subplots()
    ax.scatter(xs[~dominated], ys[~dominated], s=46, color="#1f77b4", zorder=3, label="on the frontier")
    if dominated.any():
        ax.scatter(xs[dominated], ys[dominated], s=46, facecolor="white", edgecolor="#1f77b4", zorder=3,
                   label="dominated")
    front = sorted(set(zip(xs[~dominated], ys[~dominated])))
    fx, fy = np.array(front).T
    ax.step(np.append(fx, xs.max() * 1.02 + 1e-9), np.append(fy, fy[-1]), where="post", color="#1f77b4",
            alpha=0.4)
    labels: dict = {}  # rows at the same point share one label
    for r, x, y in zip(rows, xs, ys):
        moved = r.get("moved_bytes") or 0
        moved_words = f" (moved {moved / MIB:,.0f} MiB)" if moved else ""
        labels.setdefault((x, y), []).append(r["label"] + moved_words)
    xspan, yspan = (np.ptp(xs) or 1.0), (np.ptp(ys) or 1.0)
    placed = []
    for (x, y), names in sorted(labels.items()):
        near = sum(abs(x - px) < 0.04 * xspan and abs(y - py) < 0.04 * yspan for px, py in placed)
        placed.append((x, y))
        left = x > xs.min() + 0.6 * xspan  # labels of the right-most points go to their left
        ax.annotate(", ".join(names), (x, y), xytext=(-7 if left else 7, 4 - 11 * near),
                    textcoords="offset points", fontsize=8, ha="right" if left else "left",
                    va="bottom" if near == 0 else "top",
                    bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none", alpha=0.8))
    ax.set_xlabel("extra compute (% of forward FLOPs)" if percent else "extra compute (GFLOPs)", fontsize=9)
    ax.set_ylabel("peak memory (MiB)", fontsize=9)
    ax.set_ylim(0, ys.max() * 1.15 or 1)
    ax.set_xlim(min(0, xs.min()) - 0.05 * xspan, xs.max() + 0.08 * xspan)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(title or "peak memory against extra compute", fontsize=11)
    fig.subplots_adjust(left=0.1, right=0.97, top=0.92, bottom=0.11)
    return _save(fig, path)


def plot_streams(events, path, title=None, memory=None, estimate=None):
    """A Gantt chart of a GPU run: one row per stream (``stream``, ``start_ms``, ``end_ms``, ``label``);
    with ``memory`` ((ms, device bytes in use) pairs), the device memory over the same time below it;
    with ``estimate`` (events of :func:`snlite.timing.estimate` for the same iteration), each stream's
    modelled row under its measured one."""
    figure_format(path)
    events = list(events) + [dict(e, stream=f"{e['stream']} (model)") for e in (estimate or ())]
    if not events:
        raise ValueError("no events to plot")
    for e in events:
        if e["end_ms"] < e["start_ms"]:
            raise ValueError(f"event {e.get('label', '?')!r} on {e['stream']!r} ends before it starts")
    seen = list(dict.fromkeys(e["stream"] for e in events))
    streams = [x for s in STREAM_ORDER for x in (s, f"{s} (model)") if x in seen] + \
        [s for s in seen if s not in STREAM_ORDER and s.removesuffix(" (model)") not in STREAM_ORDER]
    t0, t1 = min(e["start_ms"] for e in events), max(e["end_ms"] for e in events)
    span = (t1 - t0) or 1.0
    fig = _figure(12, 1.3 + 0.7 * len(streams) + (1.8 if memory else 0))
    if memory:
        ax, mem_ax = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [0.7 * len(streams), 1.8]})
        xs = [t for t, _ in memory] + [t1]
        ys = [b / 2**20 for _, b in memory]
        mem_ax.step(xs, ys + ys[-1:], where="post", color="#444444", linewidth=1)
        mem_ax.fill_between(xs, ys + ys[-1:], step="post", alpha=0.25, color="#444444")
        mem_ax.set_ylabel("device MiB", fontsize=9)
        mem_ax.tick_params(labelsize=8)
        mem_ax.grid(alpha=0.3)
    else:
        ax = fig.subplots()
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    for row, s in enumerate(streams):
        mine = [e for e in events if e["stream"] == s]
        bars = [(e["start_ms"], max(e["end_ms"] - e["start_ms"], span * 1e-4)) for e in mine]
        color = palette[STREAM_ORDER.index(s.removesuffix(" (model)")) % len(palette)] \
            if s.removesuffix(" (model)") in STREAM_ORDER else palette[row % len(palette)]
        ax.broken_barh(bars, (row - 0.35, 0.7), facecolors=color,
                       alpha=0.55 if s.endswith("(model)") else 1.0, edgecolor="white", linewidth=0.5)
        for e, (x, w) in zip(mine, bars):
            if e.get("label") and w > 0.05 * span:
                ax.text(x + w / 2, row, str(e["label"])[: max(3, int(w / span * 120))], ha="center",
                        va="center", fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(len(streams)), labels=streams)
    ax.set_ylim(len(streams) - 0.5, -0.5)
    ax.set_xlim(t0 - 0.01 * span, t1 + 0.01 * span)
    (mem_ax if memory else ax).set_xlabel("time (ms)", fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or "GPU streams", fontsize=11, loc="left")
    fig.subplots_adjust(left=0.09, right=0.98, top=1 - 0.45 / fig.get_figheight(),
                        bottom=0.55 / fig.get_figheight())
    return _save(fig, path)


# ---- the figure of docs/results.md ----

def alexnet_figure(path, batch: int = 200):
    """AlexNet at ``batch`` under baseline and superneurons(), activations + gradients (the paper's count)."""
    traces = {"baseline": simulate(alexnet(batch=batch), MemoryConfig.baseline().replace(count="paper")),
              "superneurons()": simulate(alexnet(batch=batch), MemoryConfig.superneurons(count="paper"))}
    return plot_compare_timelines(traces, path, title=f"AlexNet, batch {batch}: activations + gradients per "
                                                      "op (the paper's count), one training iteration")


FIGURE = os.path.join("docs", "alexnet_b200_timeline.png")


def default_figure_path() -> str | None:
    """The figure of docs/results.md in the repository this package sits in (wherever the command runs from);
    None for an installed copy, which has no docs/ folder beside it."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(repo, FIGURE) if os.path.isdir(os.path.join(repo, "docs")) else None


def main(argv=None) -> int:
    """``python -m snlite.plot [PATH]``: draw the figure of docs/results.md; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m snlite.plot",
        description="Draw the figure of docs/results.md: AlexNet at batch 200, activations + gradients "
                    "per op under baseline and superneurons(), simulated on the meta device "
                    "(needs matplotlib).")
    parser.add_argument("path", nargs="?", metavar="PATH.png",
                        help=f"where to write the figure, a PNG, SVG or PDF by its suffix (default: {FIGURE} "
                             "of the repository snlite runs from)")
    args = parser.parse_args(argv)
    path = args.path or default_figure_path()
    if path is None:
        parser.error("this snlite is installed, not a repository checkout (no docs/ beside it): "
                     "give PATH.png")
    try:
        figure_format(path)
    except ValueError as e:
        parser.error(str(e))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        print(f"python -m snlite.plot: error: {path}: its folder does not exist", file=sys.stderr)
        return 1
    try:
        print(alexnet_figure(path))
    except (PlotUnavailable, OSError) as e:
        print(f"python -m snlite.plot: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(files.main(main))
