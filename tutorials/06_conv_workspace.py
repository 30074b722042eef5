# %% [markdown]
# # 06 Dynamic convolution workspace
#
# What you will learn:
# - convolution algorithms trade workspace for speed: `direct` needs none; `im2col` + GEMM needs a buffer for
#   the unrolled input, proportional to the images it does at once (its chunk), and runs one GEMM launch per
#   chunk, so a bigger chunk is fewer launches with more thread blocks each: more of the GPU busy;
# - where the estimates come from: the launches the kernels themselves make (grid, FLOPs, bytes), costed on a
#   model H200, and the launch report that shows them for a whole network (`python -m kernels.launches`);
# - the three policies: `none` (always direct), `fastest` (whatever it needs), `dynamic` (the fastest whose
#   workspace fits in the largest free block at that moment: after liveness, offload and recomputation have
#   decided what is resident);
# - how `dynamic` degrades gracefully as the memory budget shrinks, where `fastest` stops fitting.
#
# Run it: `python tutorials/06_conv_workspace.py` from the repository root (after `pip install -e .`), or
# cell by cell (`# %%` cells in VS Code or Jupyter). About 2.6 s; no GPU. Times are estimates from
# `snlite.workspace.CostModel`: each launch's work at an H200's peak rates, over the share of the GPU its
# blocks fill (a model: on a real GPU, `snlite.Model` times the candidates instead).

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
from collections import Counter

import snlite
from snlite import BudgetError, MemoryConfig, simulate
from snlite import workspace as ws
from kernels import launches
from snlite.lesson import MiB, QUICK, expect, save_plot
from snlite.budget import smallest_budget


# %% [markdown]
# ## The candidates for one convolution
# AlexNet's conv2 at batch 200 (96 -> 256 channels, 5x5, on 27x27 maps), forward. Each conv step (forward,
# backward-data, backward-filter) picks separately.

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
one = next(c for c in cands if c.algo == "im2col" and c.chunk == 1)
print(f"fastest: {cands[0].algo} in chunks of {cands[0].chunk}, {direct.est_ms / cands[0].est_ms:.2f}x "
      f"faster than direct, for {cands[0].workspace_bytes / MiB:,.0f} MiB of workspace; one image at a time "
      f"takes {one.est_ms / cands[0].est_ms:.0f}x longer than the whole batch at once")
im2col = sorted((c for c in cands if c.algo == "im2col"), key=lambda c: -c.chunk)  # the whole batch first
expect("im2col over the whole batch is fastest, and its workspace is larger than conv2's own output",
       cands[0] == im2col[0] and cands[0].workspace_bytes > net.tensors()["conv2"].nbytes)
expect("halving the chunk halves the workspace and costs a little time at first, then much more; with one "
       "image at a time im2col is slower than direct",
       all(a.workspace_bytes >= 2 * b.workspace_bytes - 1024 for a, b in zip(im2col, im2col[1:]))
       and im2col[1].est_ms < 1.2 * im2col[0].est_ms and one.est_ms > direct.est_ms,
       why="whatever the algorithm and chunk, the numbers are bit-identical: all sum in the same order "
           "(tutorial 00).")

print(f"\n{'largest free block':>19}  dynamic picks")
picks = {}
for free_mib in (2048, 500, 100, 50, 0):
    c = picks[free_mib] = ws.choose(conv2, "forward", "dynamic", free_mib * MiB)
    print(f"{free_mib:15,d} MiB  {c.algo} (chunk {c.chunk}, {c.workspace_bytes / MiB:,.1f} MiB, "
          f"{c.est_ms:.2f} ms)")
expect("the fastest candidate that fits the free block: smaller chunks as the block shrinks, and direct once "
       "the chunks that fit are slower than it",
       all(c == next(k for k in cands if k.workspace_bytes <= free * MiB) for free, c in picks.items())
       and picks[0] == direct)

# %% [markdown]
# ## Why a bigger chunk is faster: the launches
# The estimate is not a fixed rate per algorithm: `CostModel` asks the launcher which kernels it would launch
# (`kernels.conv.launches`, recorded from the launcher itself on shape-only arrays, so nothing runs) and
# costs each: its FLOPs and bytes at the GPU's peak, divided by the share of the GPU its blocks keep busy
# (an H200 runs 132 SMs x the blocks one SM holds; ptxas says how many registers each kernel needs).

# %%
h200 = launches.GPUS["H200"]
print(f"{'conv2 forward':16} {'launches':>8} {'GEMM blocks':>11} {'waves':>6} {'GEMM ms':>8} {'total ms':>9}")
for chunk in (1, 12, 50, 200):
    ls = ws.CostModel().launches(conv2, "forward", "im2col", chunk)
    g = ls[1]  # each chunk: the im2col transform, then one batched GEMM (grid z = the chunk's images)
    res = launches.resources(g.kernel, h200.arch)
    print(f"im2col chunk {chunk:3d} {len(ls):8d} {g.blocks:11,d} {launches.waves(h200, g, res):6.2f} "
          f"{launches.launch_ms(h200, g, res):8.3f} "
          f"{ws.CostModel().estimate(conv2, 'forward', 'im2col', chunk):9.2f}")
by_chunk = {}
for chunk in (1, 12, 200):
    ls = ws.CostModel().launches(conv2, "forward", "im2col", chunk)
    by_chunk[chunk] = (len(ls), launches.waves(h200, ls[1], launches.resources(ls[1].kernel, h200.arch)))
expect("with one image per chunk there are 400 launches, each GEMM a small fraction of one wave; a chunk of "
       "12 images fills about half the GPU; 200 images are 2 launches of several waves",
       by_chunk[1][0] == 400 and by_chunk[1][1] < 0.1 and 0.3 < by_chunk[12][1] < 1 and by_chunk[200][0] == 2
       and by_chunk[200][1] > 2,
       why="the H200 holds 2 blocks of this GEMM per SM (its registers per thread, from ptxas) on 132 SMs.")

# %% [markdown]
# ## What workspace buys, per convolution of AlexNet
# For every conv step: the estimate with no workspace (direct), and the fastest candidate with the workspace
# it needs. Backward-filter's direct algorithm also takes a chunk: it splits the chunk's images over the GPU
# and keeps their partial sums (a deterministic two-level sum: same bits).

# %%
print(f"{'layer':6} {'op':16} {'no workspace ms':>15} {'fastest':>14} {'workspace MiB':>14} {'ms':>7} "
      f"{'speed-up':>8}")
total_none = total_fast = 0.0
for name, layer in net.layers.items():
    if layer.kind != "conv2d":
        continue
    for op in ("forward", "backward_data", "backward_filter"):
        none_c, fast = ws.choose(layer, op, "none", None), ws.candidates(layer, op)[0]
        total_none, total_fast = total_none + none_c.est_ms, total_fast + fast.est_ms
        print(f"{name:6} {op:16} {none_c.est_ms:15.2f} {fast.algo + '/' + str(fast.chunk):>14} "
              f"{fast.workspace_bytes / MiB:14,.1f} {fast.est_ms:7.2f} {none_c.est_ms / fast.est_ms:7.1f}x")
print(f"all conv steps: {total_none:,.1f} ms without workspace, {total_fast:,.1f} ms with it "
      f"({total_none / total_fast:.1f}x)")
def gain(name, op):
    return (ws.choose(net.layers[name], op, "none", None).est_ms
            / ws.candidates(net.layers[name], op)[0].est_ms)


convs = [n for n, l in net.layers.items() if l.kind == "conv2d"]
expect("forward gains about 2x; backward-data about 20x; backward-filter gains where the layer has few "
       "filter weights (conv1) and little elsewhere",
       all(1.3 < gain(n, "forward") < 3 for n in convs[1:])
       and all(15 < gain(n, "backward_data") < 25 for n in convs)
       and gain("conv1", "backward_filter") > 2 and all(gain(n, "backward_filter") < 2 for n in convs[1:]),
       why="im2col's register-blocked GEMM against direct's shared-memory tiles; direct backward-data is the "
           "naive kernel, one thread per input pixel; conv1's 96 x 363 filter weights spread over few blocks "
           "without workspace.")

# %% [markdown]
# ## The launch report
# The same launches for one whole training iteration: per layer and op, launches, blocks per launch and the
# fewest waves on the H200 (`python -m kernels.launches alexnet --batch 200` prints it all, with a table of
# registers and occupancy per kernel). Here, the convolutions, with the algorithms `simulate` chose.

# %%
rows = launches.network_launches(net,
                                 simulate(net, MemoryConfig(liveness=True, workspace="fastest")).conv_choices)
print(launches.format_report(rows, h200, conv_only=True))
report = launches.format_report(rows, h200, conv_only=True)
expect("every op within 2 launches per chunk, and every op that writes more than 10 million elements running "
       "at least 2 waves: the targets hold", "(target <= 2): True" in report
       and "(target >= 2 on the H200): True" in report,
       why="a transform and a GEMM per chunk (for backward-filter, the split kernel and its fold), thousands "
           "of blocks in each GEMM. In the kernel table, the GEMM holds 2 blocks per SM (registers), "
           "the others more.")

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
    return ", ".join(f"{n}x {k}" for k, n in sorted(Counter(
        c.algo if c.workspace_bytes == 0 else f"{c.algo}/{c.chunk}" for c in trace.conv_choices).items()))


print(f"{'workspace':9} {'peak MiB':>9} {'smallest budget':>16} {'conv ms (est.)':>15}  "
      "choices (conv steps x algorithm/chunk)")
traces, need = {}, {}
for mode in ("none", "fastest", "dynamic"):
    cfg = base.replace(workspace=mode)
    tr = traces[mode] = simulate(net, cfg)
    need[mode] = smallest_budget(net, cfg)
    print(f"{mode:9} {tr.peak_bytes / MiB:9,.0f} {need[mode] / MiB:12,.0f} MiB {conv_ms(tr):15,.1f}  "
          f"{choices(tr)}")
print("dynamic, unlimited, equals fastest: "
      f"{traces['dynamic'].conv_choices == traces['fastest'].conv_choices}")
speedup, more = conv_ms(traces["none"]) / conv_ms(traces["fastest"]), need["fastest"] / need["none"] - 1
expect(f"fastest is about five times as fast as none ({speedup:.1f}x) and needs about 50% more memory "
       f"({more:.0%})",
       3.5 < speedup < 7 and 0.3 < more < 0.7, why="the naive direct backward-data dominates none.")
expect("without a budget, dynamic makes the same choices as fastest; yet its smallest budget is none's",
       traces["dynamic"].conv_choices == traces["fastest"].conv_choices and need["dynamic"] == need["none"],
       why="when memory is short it simply picks smaller chunks, or direct.")

# %% [markdown]
# ## dynamic under a shrinking budget
# Budgets from what `fastest` needs down to what `none` needs. `dynamic` always fits; `fastest` stops
# fitting at once. Each conv step's choice is in `trace.conv_choices` (step, layer, op, algo, chunk,
# workspace_bytes).

# %%
hi, lo = need["fastest"], need["none"]
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
    print(f"{budget / MiB:6,.0f} MiB {fastest:>14} {tr.peak_bytes / MiB:10,.0f} MiB {times[-1]:15,.1f}  "
          f"{choices(tr)}")
print("estimated conv time never falls as the budget shrinks: "
      f"{all(a <= b + 1e-9 for a, b in zip(times, times[1:]))}")
small = simulate(net, base.replace(workspace="dynamic", budget_bytes=budgets[-1]))
print(f"\nat {budgets[-1] / MiB:,.0f} MiB, per conv step:")
print(f"{'step':>4} {'layer':6} {'op':16} {'algo':7} {'chunk':>5} {'workspace MiB':>14}")
for c in small.conv_choices:
    print(f"{c.step:4d} {c.layer:6} {c.op:16} {c.algo:7} {c.chunk:5d} {c.workspace_bytes / MiB:14,.1f}")
expect("fastest fits only at the top budget; dynamic fits every budget, down to the one none needs",
       fastest_fits == [True] + [False] * (len(budgets) - 1) and len(times) == len(budgets))
expect(f"dynamic's estimated conv time never falls as the budget shrinks, and rises only a little (by "
       f"{times[-1] / times[0] - 1:.1%} at the smallest budget)",
       all(a <= b + 1e-9 for a, b in zip(times, times[1:])) and times[-1] < 1.2 * times[0],
       why="it moves from full-batch im2col to smaller chunks where memory is tight: dynamic costs no memory "
           "over none and runs nearly at fastest's speed. (Its smallest chunks here, 25 images, still fill "
           "about a wave of the GPU's blocks; under a tighter budget than AlexNet needs here, chunks of a "
           "few images would not, which is the paper's AlexNet going from 240 img/s with a 5 GB pool to "
           "203 img/s with 3 GB.)")
save_plot("plot_compare_timelines", {"dynamic, unlimited": traces["dynamic"],
                                     f"dynamic, {budgets[-1] / MiB:,.0f} MiB": small},
          "06_alexnet_workspace.png",
          title=f"AlexNet batch {batch}: workspace (green) with and without a budget")

# %% [markdown]
# ## Exercise
# In the "none, fastest, dynamic" cell, change `base` to `MemoryConfig()` (no liveness, offload or
# recomputation). How much memory does `fastest` add now, compared with `none`, and does `dynamic` still
# find workspace? Explain with the baseline's timeline from tutorial 01: where is free memory left?
