# %% [markdown]
# # 05 Cost-aware recomputation
#
# What you will learn:
# - checkpoints and segments: conv, linear and the structural layers keep their outputs; each chain of
#   cheap layers after a checkpoint (ReLU, pooling, BN, LRN, dropout) is a segment whose outputs can be
#   dropped after forward and rebuilt in backward (`snlite.recompute.segments`);
# - the three strategies: speed-centric (rebuild a segment once, keep it), memory-centric (rebuild only
#   what each backward step needs, then free it), cost-aware (per segment, speed-centric when it fits
#   under l_peak, else memory-centric);
# - what each costs (forward re-runs, extra FLOPs) and saves (peak), for AlexNet and a ResNet.
#
# Run it: `python tutorials/05_recompute.py` from the repository root (after `pip install -e .`), or cell
# by cell (`# %%` cells in VS Code or Jupyter). About 2 s; no GPU.

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import MemoryConfig, Scheduler, simulate
from snlite.lesson import MiB, QUICK, expect, save_plot
from snlite.recompute import choose_strategies, segments, step_bytes
from snlite.scheduler import PERSISTENT_KINDS


# %% [markdown]
# ## Segments, and the cost-aware choice per segment
# Cost-aware recomputation compares, per segment, what speed-centric would hold at once (the forward
# working sets of the whole segment plus its largest backward step: sum_seg l^f + l_seg^b) with l_peak,
# the largest single step of the network. If it fits under l_peak, rebuilding the segment once costs no
# extra peak: speed-centric. Otherwise memory-centric.

# %%
batch = 200
net = snlite.models.alexnet(batch=batch)
persistent = {n for n, t in net.tensors().items() if t.kind in PERSISTENT_KINDS}
root_of = segments(net)  # cheap layer -> the checkpoint its chain starts from
members = {}
for layer, root in root_of.items():
    members.setdefault(root, []).append(layer)
sizes = step_bytes(net.steps(), net.tensors(), persistent)  # l_i of every route step
l_peak = max(sizes)
l_f = {s.layer: sizes[s.index] for s in net.steps() if s.phase == "forward"}
l_b = {s.layer: sizes[s.index] for s in net.steps() if s.phase == "backward"}
chosen = choose_strategies(net, "cost_aware", persistent)
print(f"AlexNet, batch {batch}: checkpoints {[n for n, l in net.layers.items() if l.checkpoint]}")
print(f"l_peak = {l_peak / MiB:,.1f} MiB\n")
print(f"{'checkpoint':10} {'segment (dropped after forward)':32} {'sum l^f + l^b MiB':>18}  cost-aware picks")
for root, ms in members.items():
    need = sum(l_f[m] for m in ms) + max(l_b[m] for m in ms)
    print(f"{root:10} {' '.join(ms):32} {need / MiB:18,.1f}  {chosen[root]}-centric")
expect("the big early segments (conv1's and conv2's, with their LRN) exceed l_peak and go memory-centric; the "
       "small later ones are rebuilt once (speed-centric)",
       chosen["conv1"] == chosen["conv2"] == "memory"
       and all(chosen[r] == "speed" for r in members if r not in ("conv1", "conv2")))

# %% [markdown]
# ## What the plan does: recompute ops
# A recomputed tensor is a new incarnation (`relu1#r3`), so that liveness frees each incarnation after its
# own last use. Here are the forward re-runs of conv1's segment under each strategy, and the backward step
# each one serves.

# %%
reruns = {}
for strategy in ("speed", "memory", "cost_aware"):
    ops = Scheduler(net, MemoryConfig(liveness=True, recompute=strategy)).plan().ops
    backward = {p.op.step: p.op.layer for p in ops if p.op.phase == "backward"}
    reruns[strategy] = [f"{p.op.layer}(for {backward[p.op.step]})" for p in ops
                        if p.op.phase == "recompute" and root_of.get(p.op.layer) == "conv1"]
    print(f"{strategy:10} {len(reruns[strategy]):2d} re-runs: {' '.join(reruns[strategy])}")
expect("speed-centric re-runs relu1, norm1 and pool1 once, before the first backward step that needs them "
       "(conv2's backward reads pool1), and keeps them",
       reruns["speed"] == ["relu1(for conv2)", "norm1(for conv2)", "pool1(for conv2)"])
expect("memory-centric rebuilds the chain from conv1 again for every backward step that reads one of them, and "
       "cost-aware does the same here",
       len(reruns["memory"]) > len(reruns["speed"]) and reruns["cost_aware"] == reruns["memory"]
       and {r.split("(")[1] for r in reruns["memory"]} == {"for conv2)", "for pool1)", "for norm1)", "for relu1)"},
       why="pooling and LRN backward read both x and y, so each of those steps needs the chain rebuilt up to it, "
           "and memory-centric frees it after that step; cost-aware picks memory-centric for this segment "
           "because it does not fit under l_peak (first table).")

# %% [markdown]
# ## Re-runs and FLOPs against peak, AlexNet and a ResNet
# All with liveness and eager offload on (the paper's stack without the cache), counting the paper's way.
# Extra FLOPs are a share of one forward pass.

# %%
resnet_batch = 16 if QUICK else 32
nets = {f"alexnet ({batch})": net, f"resnet50 ({resnet_batch})": snlite.models.resnet(50, batch=resnet_batch)}
rows, all_results = [], {}
print(f"{'network':16} {'recompute':11} {'re-runs':>8} {'extra FLOPs':>12} {'peak MiB':>9} {'l_peak MiB':>11} "
      f"{'peak/l_peak':>12}")
for label, g in nets.items():
    results = {}
    for strategy in ("off", "speed", "memory", "cost_aware"):
        tr = simulate(g, MemoryConfig(liveness=True, offload=True, recompute=strategy, count="paper"))
        results[strategy] = tr
        print(f"{label:16} {strategy:11} {tr.recompute_count:8d} {tr.extra_flops / g.flops():12.2%} "
              f"{tr.peak_bytes / MiB:9,.0f} {tr.l_peak_bytes / MiB:11,.0f} {tr.ratio:12.2f}")
        if label.startswith("alexnet"):
            rows.append({"label": strategy, "peak_bytes": tr.peak_bytes, "extra_flops": tr.extra_flops,
                         "base_flops": g.flops()})
    all_results[label] = (g, results)
for label, (g, r) in all_results.items():
    expect(f"{label}: cost-aware's peak is at most speed-centric's, and its re-runs lie between speed's and "
           f"memory's ({r['speed'].recompute_count} <= {r['cost_aware'].recompute_count} <= "
           f"{r['memory'].recompute_count})",
           r["cost_aware"].peak_bytes <= r["speed"].peak_bytes
           and r["speed"].recompute_count <= r["cost_aware"].recompute_count <= r["memory"].recompute_count)
expect("recomputation costs a few percent of a forward pass at most",
       all(tr.extra_flops < 0.05 * g.flops() for g, r in all_results.values() for tr in r.values()))
alex = all_results[f"alexnet ({batch})"][1]
map_bytes = net.tensors()["conv1"].nbytes  # one 96 x 55 x 55 map of the batch
at_peak = alex["cost_aware"].peak_tensors
expect(f"on AlexNet memory-centric and cost-aware reach the same peak, {alex['cost_aware'].peak_bytes / MiB:,.1f} "
       f"MiB, with fewer re-runs for cost-aware: exactly the l_peak of the first table, but "
       f"{alex['cost_aware'].ratio:.2f} x the l_peak column of this one; not the paper's 1.00",
       alex["memory"].peak_bytes == alex["cost_aware"].peak_bytes == l_peak == 4 * map_bytes
       and alex["cost_aware"].l_peak_bytes == 3 * map_bytes and len(at_peak) == 4 and "conv1" in dict(at_peak)
       and alex["cost_aware"].recompute_count < alex["memory"].recompute_count,
       why="the two l_peaks count norm1's backward step differently: the cost-aware rule (first table) counts "
           "the tensors it reads and writes, x, y, dy and dx, four 96x55x55 maps; the trace counts buffers, and "
           "dx is written into dy's, so three. The peak itself holds four such maps, while norm1 is rebuilt for "
           "its own backward step: the checkpoint conv1 (relu1's backward still reads it), relu1 and norm1 "
           "rebuilt from it, and norm1's gradient.")
resnet = all_results[f"resnet50 ({resnet_batch})"][1]
expect(f"on the ResNet the ratio stays well above 1 ({resnet['cost_aware'].ratio:.2f} for cost-aware)",
       resnet["cost_aware"].ratio > 1.5,
       why="the outputs of the residual adds are checkpoints that stay on the device, and they add up over the "
           "blocks.")
save_plot("plot_tradeoff", rows, "05_alexnet_recompute_tradeoff.png",
          title=f"AlexNet batch {batch}: peak (paper count) against recomputation")

# %% [markdown]
# ## Exercise
# 1. In the plan cell, change `== "conv1"` to `== "conv5"`. Now cost-aware's re-runs equal which strategy's,
#    and why? (Look at conv5's row in the first table.)
# 2. Set `batch = 20` at the top of the segments cell and run again. Do the per-segment choices change?
#    Every activation scales with the batch; explain why the comparison with l_peak does not depend on it.
