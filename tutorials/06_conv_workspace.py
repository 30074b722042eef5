# %% [markdown]
# # 06 Dynamic convolution workspace
#
# What you will learn:
# - convolution algorithms trade workspace for speed: `direct` needs none; `im2col` + GEMM is about twice as
#   fast but needs a buffer for the unrolled input, proportional to the images it does at once (its chunk);
# - the three policies: `none` (always direct), `fastest` (whatever it needs), `dynamic` (the fastest whose
#   workspace fits in the largest free block at that moment: after liveness, offload and recomputation have
#   decided what is resident);
# - how `dynamic` degrades gracefully as the memory budget shrinks, where `fastest` stops fitting.
#
# Run it: `python tutorials/06_conv_workspace.py` from the repository root (after `pip install -e .`), or
# cell by cell (`# %%` cells in VS Code or Jupyter). About 3 s; no GPU. Times are estimates from
# `snlite.workspace.CostModel` (a simple model that ranks the algorithms the way measurements do).

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
from collections import Counter

import snlite
from snlite import BudgetError, MemoryConfig, simulate
from snlite import workspace as ws
from snlite.lesson import MiB, QUICK, expect, save_plot
from snlite.placement import smallest_budget


# %% [markdown]
# ## The candidates for one convolution
# AlexNet's conv2 at batch 200 (96 -> 256 channels, 5x5, on 27x27 maps). Each conv step (forward,
# backward-data, backward-filter) picks separately; the candidates are the same for all three here.

# %%
batch = 200
net = snlite.models.alexnet(batch=batch)
conv2 = net.layers["conv2"]
cands = ws.candidates(conv2, "forward")  # fastest first
print(f"conv2 forward, batch {batch}: {conv2.flops() / 1e9:,.1f} GFLOPs")
print(f"{'algorithm':10} {'chunk':>6} {'workspace MiB':>14} {'estimated ms':>13}")
for c in cands:
    print(f"{c.algo:10} {c.chunk:6d} {c.workspace_bytes / MiB:14,.1f} {c.est_ms:13.2f}")
direct = next(c for c in cands if c.algo == "direct")
print(f"fastest: {cands[0].algo} in chunks of {cands[0].chunk}, {direct.est_ms / cands[0].est_ms:.2f}x faster than "
      f"direct, for {cands[0].workspace_bytes / MiB:,.0f} MiB of workspace; one image at a time still "
      f"{direct.est_ms / cands[-2].est_ms:.2f}x faster for {cands[-2].workspace_bytes / MiB:,.1f} MiB")
one_image = next(c for c in cands if c.algo == "im2col" and c.chunk == 1)
expect("im2col with the whole batch is fastest, but its workspace is larger than conv2's own output; one image "
       "at a time costs only a little more time (more launches) for far less memory",
       cands[0].algo == "im2col" and cands[0].workspace_bytes > net.tensors()["conv2"].nbytes
       and one_image.est_ms < 1.1 * cands[0].est_ms and one_image.workspace_bytes < cands[0].workspace_bytes / 100,
       why="whatever the algorithm and chunk, the numbers are bit-identical: all sum in the same order "
           "(tutorial 00).")

print(f"\n{'largest free block':>19}  dynamic picks")
picks = {}
for free_mib in (2048, 500, 50, 5, 0):
    c = picks[free_mib] = ws.choose(conv2, "forward", "dynamic", free_mib * MiB)
    print(f"{free_mib:15,d} MiB  {c.algo} (chunk {c.chunk}, {c.workspace_bytes / MiB:,.1f} MiB, {c.est_ms:.2f} ms)")
expect("the fastest candidate that fits the free block: smaller chunks as the block shrinks, and direct only "
       "when not even one image's workspace fits",
       all(c == next(k for k in cands if k.workspace_bytes <= free * MiB) for free, c in picks.items())
       and [c.algo == "direct" for c in picks.values()] == [free * MiB < one_image.workspace_bytes for free in picks])

# %% [markdown]
# ## none, fastest, dynamic
# With liveness, eager offload and cost-aware recomputation on, and no budget. The estimated convolution
# time is the cost model's, summed over every conv step of one iteration (forward and backward).

# %%
base = MemoryConfig(liveness=True, offload=True, recompute="cost_aware")
est = {(name, op): {(c.algo, c.chunk): c.est_ms for c in ws.candidates(net.layers[name], op)}
       for name, layer in net.layers.items() if layer.kind == "conv2d"
       for op in ("forward", "backward_data", "backward_filter")}


def conv_ms(trace):
    """The cost model's estimate of all convolutions of one iteration, as the trace chose them."""
    return sum(est[(c.layer, c.op)][(c.algo, c.chunk)] for c in trace.conv_choices)


def choices(trace):
    return " ".join(f"{k}x{n}" for k, n in sorted(Counter(
        c.algo if c.algo == "direct" else f"im2col/{c.chunk}" for c in trace.conv_choices).items()))


print(f"{'workspace':9} {'peak MiB':>9} {'smallest budget':>16} {'conv ms (est.)':>15}  "
      "choices (algorithm/chunk x conv steps)")
traces, need = {}, {}
for mode in ("none", "fastest", "dynamic"):
    cfg = base.replace(workspace=mode)
    tr = traces[mode] = simulate(net, cfg)
    need[mode] = smallest_budget(net, cfg)
    print(f"{mode:9} {tr.peak_bytes / MiB:9,.0f} {need[mode] / MiB:12,.0f} MiB {conv_ms(tr):15,.1f}  {choices(tr)}")
speedup, more = conv_ms(traces["none"]) / conv_ms(traces["fastest"]), need["fastest"] / need["none"] - 1
expect(f"fastest is about twice as fast as none ({speedup:.2f}x) and needs about 50% more memory ({more:.0%})",
       1.5 < speedup < 2.5 and 0.3 < more < 0.7)
expect("without a budget, dynamic makes the same choices as fastest; yet its smallest budget is none's",
       traces["dynamic"].conv_choices == traces["fastest"].conv_choices and need["dynamic"] == need["none"],
       why="when memory is short it simply picks smaller chunks, or direct.")

# %% [markdown]
# ## dynamic under a shrinking budget
# Budgets from what `fastest` needs down to what `none` needs. `dynamic` always fits; `fastest` stops
# fitting at once. Each conv step's choice is in `trace.conv_choices` (step, layer, op, algo, chunk,
# workspace_bytes).

# %%
hi = smallest_budget(net, base.replace(workspace="fastest"))
lo = smallest_budget(net, base.replace(workspace="none"))
n = 3 if QUICK else 6
budgets = [(lo + (hi - lo) * k // n) // 1024 * 1024 for k in range(n, -1, -1)]
print(f"{'budget':>10} {'fastest':>14} {'dynamic: peak':>14} {'conv ms (est.)':>15}  dynamic's choices")
times, fastest_fits = [], []
for budget in budgets:
    try:
        simulate(net, base.replace(workspace="fastest", budget_bytes=budget))
        fastest = "fits"
    except BudgetError:
        fastest = "does not fit"
    fastest_fits.append(fastest == "fits")
    tr = simulate(net, base.replace(workspace="dynamic", budget_bytes=budget))
    times.append(conv_ms(tr))
    print(f"{budget / MiB:6,.0f} MiB {fastest:>14} {tr.peak_bytes / MiB:10,.0f} MiB {times[-1]:15,.1f}  {choices(tr)}")
small = simulate(net, base.replace(workspace="dynamic", budget_bytes=budgets[-1]))
print(f"\nat {budgets[-1] / MiB:,.0f} MiB, per conv step:")
print(f"{'step':>4} {'layer':6} {'op':16} {'algo':7} {'chunk':>5} {'workspace MiB':>14}")
for c in small.conv_choices:
    print(f"{c.step:4d} {c.layer:6} {c.op:16} {c.algo:7} {c.chunk:5d} {c.workspace_bytes / MiB:14,.1f}")
expect("fastest fits only at the top budget; dynamic fits every budget, down to the one none needs",
       fastest_fits == [True] + [False] * (len(budgets) - 1) and len(times) == len(budgets))
expect(f"dynamic's estimated conv time never falls as the budget shrinks, and rises only a little (by "
       f"{times[-1] / times[0] - 1:.2%} at the smallest budget)",
       all(a <= b + 1e-9 for a, b in zip(times, times[1:])) and times[-1] < 1.05 * times[0],
       why="it moves from full-batch im2col to smaller chunks where memory is tight: dynamic costs no memory over "
           "none and runs nearly at fastest's speed. (Under this cost model a chunk of a few images is almost as "
           "fast as the whole batch; on a real GPU small chunks lose more, and the paper saw AlexNet go from 240 "
           "img/s with a 5 GB pool to 203 img/s with 3 GB.)")
save_plot("plot_compare_timelines", {"dynamic, unlimited": traces["dynamic"],
                                     f"dynamic, {budgets[-1] / MiB:,.0f} MiB": small},
          "06_alexnet_workspace.png", title=f"AlexNet batch {batch}: workspace (green) with and without a budget")

# %% [markdown]
# ## Exercise
# In the "none, fastest, dynamic" cell, change `base` to `MemoryConfig()` (no liveness, offload or
# recomputation). How much memory does `fastest` add now, compared with `none`, and does `dynamic` still
# find workspace? Explain with the baseline's timeline from tutorial 01: where is free memory left?
