"""The sections of ``snlite paper`` about the peak (:mod:`snlite.report` assembles them): AlexNet's
memory trajectory under each technique (1), the recomputation strategies and the paper's Table 1 (2),
peak against extra compute (6), and how close superneurons() gets to l_peak (7)."""
from __future__ import annotations

from snlite import measure, search
from snlite.config import MemoryConfig
from snlite.models import DEFAULT_BATCH, get_model
from snlite.report_tables import ALL_COUNT, BUDGET, MIB, PAPER_COUNT, Section, Table, gb, where

# The paper's Table 1: per network, the peak (its "MB" are MiB, activations + gradients) and the forward
# re-runs of each recomputation strategy, on liveness. AlexNet's row is at batch 200 (the paper's Fig. 10);
# its ResNet-50 and ResNet-101 rows give no batch, so section 2 searches for the batch that reproduces
# them: enter their figures here, in the same form, and the search runs for them too.
PAPER_TABLE1 = {
    "alexnet": {"speed": (993.018, 14), "memory": (886.23, 23), "cost_aware": (886.23, 17)},
}
STRATEGIES = ("speed", "memory", "cost_aware")


def trajectory(batch: int = 200, progress=measure.no_progress) -> tuple[Section, dict]:
    """AlexNet's peak under each technique (both counts, where, what is live); returns the section
    and ``{label: Measurement}`` for the figures."""
    graph = get_model("alexnet", batch)
    progress("AlexNet: the smallest budget of superneurons()")
    tight = search.min_budget(graph).budget_bytes
    configs = {label: measure.COMPARE[label] for label in
               ("baseline", "liveness", "+ offload", "+ offload + recompute cost_aware")}
    configs["superneurons(), no budget"] = MemoryConfig.superneurons()
    configs["superneurons(), 12 GiB"] = MemoryConfig.superneurons(budget_bytes=BUDGET)
    configs[f"superneurons(), {measure.format_size(tight)} (its smallest)"] = \
        MemoryConfig.superneurons(budget_bytes=tight)
    runs, rows = {}, []
    for label, cfg in configs.items():
        progress(f"AlexNet: {label}")
        m = measure.measure(graph, cfg, label)
        if m.fits is False:
            rows.append([label, "does not fit"] + [""] * 8)
            continue
        runs[label] = m
        p, t = m.paper, m.trace
        rows.append([label, measure.format_size(p.peak_bytes), where(p), len(p.peak_tensors),
                     f"{p.ratio:.2f}", measure.format_size(t.peak_bytes), where(t),
                     t.steps[t.peak_op].live_tensors, f"{gb(t.d2h_bytes)} / {gb(t.h2d_bytes)}",
                     t.recompute_count])
    head = ["technique", "peak (act+grad)", "at step: layer (phase)", "live act+grad tensors",
            "peak/l_peak (act+grad)", "peak (all)", "at step: layer (phase)", "live tensors (all)",
            "to host / back", "recomputed"]
    text = (f"AlexNet (Caffe's, 227x227), batch {batch}, one training iteration on the meta device, under "
            "each technique in turn; the \"+\" rows add to liveness. The peak is given in both counts, each "
            "with the route step where it happens (forward steps first, then backward; recomputation runs "
            "inside backward) and the tensors resident there. The LRU cache only moves data when an "
            "allocation would fail, so without a budget (or with 12 GiB, far more than AlexNet at batch "
            f"{batch} needs) superneurons() moves nothing; in its smallest budget ({tight:,d} bytes, found "
            "by snlite.search.min_budget) the cache has to evict. In the paper's count the first four rows "
            "are the paper's Fig. 10 (tests/test_recompute.py derives each peak, its step and its live "
            "tensors from the layer shapes): every layer's output and every gradient as cuDNN's steps give "
            "them, each at its own size.")
    table = Table(f"{PAPER_COUNT} in columns 2-5 (live act+grad tensors: how many activation and gradient "
                  f"tensors are resident at that peak); {ALL_COUNT} in columns 6-8 (live tensors: every "
                  "resident tensor, weights included); to host / back: bytes copied per iteration (GB = 1e9 "
                  "bytes); recomputed: layer forwards re-run in backward", head, rows)
    return Section("1. AlexNet's memory trajectory under each technique", text, [table]), runs


def _table1_runs(name: str, batch: int, progress) -> dict:
    """strategy -> Measurement of ``name`` at ``batch`` under liveness + that recomputation."""
    graph = get_model(name, batch)
    runs = {}
    for strategy in STRATEGIES:
        progress(f"{name} ({batch:,d}): recompute {strategy}")
        runs[strategy] = measure.measure(graph, MemoryConfig(liveness=True, recompute=strategy), strategy)
    return runs


def table1_batch(name: str, paper: dict, batches, progress=measure.no_progress) -> dict:
    """The batch at which ``name``'s three recomputation peaks come closest to ``paper`` (strategy ->
    (MiB, re-runs), the paper's Table 1). Activations and gradients grow in proportion to the batch,
    so each strategy's peak per image, measured at the largest of ``batches``, points at a batch; the
    batches next to those points are simulated and the one whose worst relative peak error is smallest
    wins. Returns the batch, its runs, each strategy's relative error, and whether every peak matches
    to the paper's three decimals of MiB."""
    top = max(batches)
    runs = _table1_runs(name, top, progress)
    guesses = {round(paper[s][0] * MIB * top / runs[s].paper.peak_bytes) for s in STRATEGIES}
    candidates = sorted({b for g in guesses for b in (g - 1, g, g + 1) if b >= 1})
    best = None
    for b in candidates:
        r = runs if b == top else _table1_runs(name, b, progress)
        errors = {s: r[s].paper.peak_bytes / (paper[s][0] * MIB) - 1 for s in STRATEGIES}
        worst = max(abs(e) for e in errors.values())
        if best is None or worst < best["worst"]:
            best = {"batch": b, "runs": r, "errors": errors, "worst": worst}
    best["exact"] = all(round(best["runs"][s].paper.peak_bytes / MIB, 3) == round(paper[s][0], 3)
                        for s in STRATEGIES)
    return best


def recompute(models, sweep=(), progress=measure.no_progress) -> Section:
    """The paper's Table 1: the three recomputation strategies on top of liveness (forward re-runs,
    extra FLOPs, peaks), the paper's figures beside them; then, for the networks of ``sweep`` (name,
    batches), the batch at which the paper's figures are reproduced (:func:`table1_batch`)."""
    rows = []
    for name, batch in models:
        graph = get_model(name, batch)
        paper = PAPER_TABLE1.get(name) if batch == DEFAULT_BATCH.get(name) else None
        for strategy in ("off",) + STRATEGIES:
            progress(f"{graph.name} ({batch}): recompute {strategy}")
            cfg = MemoryConfig(liveness=True, recompute=strategy)
            m = measure.measure(graph, cfg, strategy)
            p, t = m.paper, m.trace
            ref = paper.get(strategy) if paper else None
            rows.append([f"{graph.name} ({batch})", "none (liveness only)" if strategy == "off" else strategy,
                         t.recompute_count, f"{m.extra_pct:.1f}%", measure.format_size(p.peak_bytes),
                         measure.format_size(p.l_peak_bytes), f"{p.ratio:.2f}",
                         measure.format_size(t.peak_bytes), f"{ref[0]:,.3f} MiB" if ref else "",
                         ref[1] if ref else ""])
    text = ("The paper's Table 1: cost-aware recomputation (docs/paper.md section 5) against its two pure "
            "forms, each on top of liveness (no offload, no cache, no workspace). Speed-centric re-runs each "
            "segment of m cheap layers once (m re-runs); memory-centric rebuilds what each backward step "
            "needs and keeps it only while the next backward step reads it too (m(m+1)/2 re-runs on a chain "
            "of ReLU, pooling and LRN layers); cost-aware picks speed-centric for a segment whose "
            "speed-centric peak (its tensors still to be used plus the backward step's own, each once) is at "
            "most l_peak, the largest working set of one step (an in-place dx counted once). The paper's "
            "claim: cost-aware reaches memory-centric's peak with recompute counts close to speed-centric.")
    table = Table(f"recomputed: layer forwards re-run in one iteration; extra FLOPs: their FLOPs in % of one "
                  f"forward pass; peak, l_peak and peak/l_peak in the {PAPER_COUNT}; peak (all): "
                  f"{ALL_COUNT}; last two columns: the paper's Table 1 (its MB are MiB) at the paper's batch",
                  ["network (batch)", "recompute", "recomputed", "extra FLOPs (% of forward)",
                   "peak (act+grad)", "l_peak (act+grad)", "peak/l_peak (act+grad)", "peak (all)",
                   "paper: peak", "paper: recomputed"],
                  rows, "<<>>>>>>>>")
    tables, notes = table1_sweep(sweep, progress)
    return Section("2. Recomputation: speed, memory, cost_aware (the paper's Table 1)", text,
                   [table] + tables, notes)


def table1_sweep(sweep, progress) -> tuple[list[Table], list[str]]:
    """For each network of ``sweep`` (name, batches): the batch that reproduces its row of the paper's
    Table 1 (:func:`table1_batch`), or, for a row not in :data:`PAPER_TABLE1` yet, its peaks by batch."""
    tables, notes = [], []
    found_rows, missing = [], []
    for name, batches in sweep:
        paper = PAPER_TABLE1.get(name)
        if paper is None:
            missing.append((name, batches))
            continue
        best = table1_batch(name, paper, batches, progress)
        for strategy in STRATEGIES:
            m = best["runs"][strategy]
            found_rows.append([name, f"{best['batch']:,d}", strategy, f"{m.paper.peak_bytes / MIB:,.3f} MiB",
                               f"{paper[strategy][0]:,.3f} MiB", f"{100 * best['errors'][strategy]:+.4f}%",
                               m.trace.recompute_count, paper[strategy][1]])
        notes.append(f"{name}: batch {best['batch']:,d} " + (
            "reproduces the paper's three peaks to its three decimals of MiB" if best["exact"] else
            f"comes closest to the paper's peaks (worst error {100 * best['worst']:.2f}%)") + ".")
    if found_rows:
        tables.append(Table("the batch that reproduces the paper's Table 1 "
                            "(snlite.report_memory.table1_batch): each strategy's peak (act+grad) and "
                            "re-runs there, beside the paper's",
                            ["network", "batch", "recompute", "peak", "paper: peak", "error", "recomputed",
                             "paper: recomputed"], found_rows, "<><>>>>>"))
    for name, batches in missing:
        sweep_rows = []
        for b in batches:
            runs = _table1_runs(name, b, progress)
            sweep_rows.append([f"{b:,d}"] + [f"{runs[s].paper.peak_bytes / MIB:,.1f} MiB" for s in STRATEGIES]
                              + [f"{runs[s].trace.recompute_count}" for s in STRATEGIES])
        tables.append(Table(f"{name}: the three strategies' peaks (act+grad) and re-runs by batch (the "
                            f"paper's Table 1 gives its {name} row without the batch)", ["batch"] + [
                                f"peak: {s}" for s in STRATEGIES] + [f"recomputed: {s}" for s in STRATEGIES],
                            sweep_rows))
        notes.append(f"{name}: the paper's Table 1 figures are not in snlite's notes yet "
                     "(snlite.report_memory.PAPER_TABLE1); with them this section finds the batch that "
                     "reproduces them, as it does for AlexNet. The re-runs do not depend on the batch; the "
                     "peaks grow in proportion to it.")
    return tables, notes


def tradeoff(batch: int = 200, progress=measure.no_progress) -> tuple[Section, list[dict]]:
    """Peak against extra compute for AlexNet (snlite.measure.compare, plus superneurons())."""
    graph = get_model("alexnet", batch)
    runs = measure.compare(graph, progress=progress)
    progress("alexnet: superneurons()")
    runs.append(measure.measure(graph, MemoryConfig.superneurons(), "superneurons()"))
    rows = [[m.label, measure.format_size(m.paper_peak_bytes), measure.format_size(m.peak_bytes),
             f"{m.extra_pct:.1f}%", m.trace.recompute_count, gb(m.moved_bytes)] for m in runs]
    points = [{"label": m.label, "peak_bytes": m.paper_peak_bytes, "extra_flops": m.trace.extra_flops,
               "moved_bytes": m.moved_bytes, "base_flops": m.forward_flops} for m in runs]
    text = (f"AlexNet, batch {batch}, no budget: what each strategy saves against what it costs in "
            f"recomputed forward work and bytes moved. \"+\" rows add to liveness; {measure.SQRT_LABEL} is "
            "Chen et al. 2016's reference (snlite.measure.checkpoint_plan). The plot's y axis is the "
            f"{PAPER_COUNT}.")
    table = Table(f"peak (act+grad): {PAPER_COUNT}; peak (all): {ALL_COUNT}; extra FLOPs in % of one forward "
                  f"pass; moved: bytes to the host and back per iteration", ["strategy", "peak (act+grad)",
                                                                             "peak (all)", "extra FLOPs",
                                                                             "recomputed", "moved"], rows)
    return Section("6. Trade-off: peak memory against extra compute", text, [table]), points


def min_budgets(nets, progress=measure.no_progress) -> Section:
    """The smallest budget under which superneurons() runs, against l_peak, for ``nets`` (name, batch)."""
    rows = []
    for name, batch in nets:
        progress(f"{name} ({batch:,d}): the smallest budget of superneurons()")
        m = search.min_budget(get_model(name, batch))
        rows.append([f"{name} ({batch:,d})", measure.format_size(m.budget_bytes),
                     measure.format_size(m.l_peak_bytes), measure.format_size(m.persistent_bytes),
                     f"{m.ratio:.2f}", f"{m.seconds:.1f} s"])
    text = ("The paper's claim is that SuperNeurons brings the peak down to about l_peak, the largest "
            "working set of one step. On a GPU the question is whether it fits, so here is the smallest "
            "budget under which superneurons() (liveness, offload with the LRU cache, cost-aware "
            "recomputation, dynamic workspace) runs one training iteration, divided by l_peak plus what "
            "every budget must also hold all iteration: the weights (superneurons() updates each layer in "
            "backward, so a weight gradient lives only until its update, and its momentum waits on the "
            "host) (snlite.search.min_budget: it gallops up from that sum, the least any budget can be, to "
            "the first budget that fits, then bisects to the pool's 1 KiB block).")
    table = Table("min budget: everything on the device (count all), whole 1 KiB blocks; l_peak: activations "
                  "and gradients of the busiest step, each once; held all iteration: what the device holds "
                  "from the first step (the weights, and their gradients and momentum where those stay "
                  "there); ratio: min budget / (l_peak + held all iteration)",
                  ["network (batch)", "min budget", "l_peak (act+grad)", "held all iteration",
                   "ratio", "time"], rows)
    return Section("7. How close to l_peak: the smallest budget", text, [table])
