# %% [markdown]
# # 05 Cost-aware recomputation
#
# What you will learn:
# - checkpoints and segments: conv, linear and the structural layers keep their outputs; each chain of
#   cheap layers after a checkpoint (ReLU, pooling, BN, LRN, dropout) is a segment whose outputs can be
#   dropped after forward and rebuilt in backward (`snlite.recompute.segments`);
# - the three strategies: speed-centric (rebuild a segment once, keep it), memory-centric (rebuild only
#   what each backward step needs; the paper frees it after the step, snlite keeps it while the next
#   backward step reads it too),
#   cost-aware (per segment, speed-centric when it fits under l_peak, else memory-centric);
# - what each costs (forward re-runs, extra FLOPs) and saves (peak), for AlexNet and a ResNet;
# - which layers are cheap is a property of the device: measure them, and keep the ones that are not.
#
# Run it: `python tutorials/05_recompute.py` from the repository root (after `pip install -e .`), or cell
# by cell (`# %%` cells in VS Code or Jupyter). About 3 s; no GPU.

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import MemoryConfig, Scheduler, simulate
from snlite.lesson import MiB, QUICK, expect, save_plot
from snlite.liveness import first_and_last_use, step_tensors
from snlite.recompute import choose_strategies, droppable, segments, step_bytes
from snlite.scheduler import PERSISTENT_KINDS


# %% [markdown]
# ## Segments, and the cost-aware choice per segment
# Cost-aware recomputation compares, per segment, what speed-centric would hold at once (the paper's
# sum_seg l^f + l_seg^b: the segment's tensors plus its busiest backward step's, each counted once) with
# l_peak, the largest single step of the network. If it fits under l_peak, rebuilding the segment once
# costs no extra peak: speed-centric. Otherwise memory-centric.
#
# l_i, and so l_peak, counts each tensor a step holds once: LRN's backward writes dx into dy's buffer,
# so norm1's backward holds three conv1-sized tensors (relu1, norm1, norm1's gradient), not four. The
# trace, the plots and `snlite plan` use the same l_peak. A segment's speed-centric peak is exact: at
# each backward step from the one where speed-centric rebuilds the segment to its last use, the
# segment's tensors still to be used, plus the step's own.

# %%
batch = 200
net = snlite.models.alexnet(batch=batch)
persistent = {n for n, t in net.tensors().items() if t.kind in PERSISTENT_KINDS}
root_of = segments(net)  # cheap layer -> the checkpoint its chain starts from
members = {}
for layer, root in root_of.items():
    members.setdefault(root, []).append(layer)
steps, tensors = net.steps(), net.tensors()
sizes = step_bytes(steps, tensors, persistent)  # l_i of every route step, each tensor once
l_peak = max(sizes)
_, last = first_and_last_use(steps, persistent)  # where each tensor is used for the last time
dropped = droppable(net)
fwd = {s.layer: s for s in steps if s.phase == "forward"}


def speed_centric_peak(ms):
    """What rebuilding the segment once holds at its busiest backward step."""
    mine = {t for m in ms for t in (*fwd[m].reads, *fwd[m].writes) if t not in persistent}
    start = min(s.index for s in steps if s.phase == "backward"
                and any(t in dropped for t in s.reads if t in mine))
    return max(sum(tensors[t].nbytes for t in {t for t in mine if last[t] >= s.index}
                   | (step_tensors(s.reads, s.writes, s.inplace) - persistent))
               for s in steps[start:max(last[t] for t in mine) + 1])


chosen = choose_strategies(net, "cost_aware", persistent)
print(f"AlexNet, batch {batch}: checkpoints {[n for n, l in net.layers.items() if l.checkpoint]}")
print(f"l_peak = {l_peak / MiB:,.1f} MiB\n")
print(f"{'checkpoint':10} {'segment (dropped after forward)':32} {'speed-centric MiB':>18}  cost-aware picks")
for root, ms in members.items():
    dropped_here = " ".join(x for x in ms if not net.layers[x].alias_input)  # a flatten is a view: no memory
    print(f"{root:10} {dropped_here:32} {speed_centric_peak(ms) / MiB:18,.1f}  {chosen[root]}-centric")
expect("conv1's segment exceeds l_peak and goes memory-centric; conv2's fits under it, as do the small later "
       "ones: they are rebuilt once (speed-centric)",
       chosen["conv1"] == "memory" and speed_centric_peak(members["conv1"]) > l_peak
       and all(chosen[r] == "speed" for r in members if r != "conv1"),
       why="conv1's segment holds 55x55 maps (conv1, relu1, norm1, and their gradients; pool1's output is "
           "27x27); conv2's holds 27x27 maps.")

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
m = len(members["conv1"])
expect("speed-centric re-runs relu1, norm1 and pool1 once, before the first backward step that needs them "
       "(conv2's backward reads pool1), and keeps them",
       reruns["speed"] == ["relu1(for conv2)", "norm1(for conv2)", "pool1(for conv2)"])
expect("memory-centric rebuilds the chain from conv1 for every backward step that reads one of them, "
       f"keeping what it rebuilt only while the next backward step reads it too: "
       f"{' + '.join(map(str, range(m, 0, -1)))} = {m * (m + 1) // 2} re-runs, m(m+1)/2 for a segment of m "
       "layers, the paper's O(m^2); cost-aware does the same",
       len(reruns["memory"]) == m * (m + 1) // 2 and reruns["cost_aware"] == reruns["memory"],
       why="pooling and LRN backward read both x and y: pool1 serves conv2's backward and pool1's own, norm1 "
           "serves pool1's and norm1's, relu1 norm1's and relu1's. The paper frees a rebuilt tensor after "
           "each step, which would rebuild the chain for pool1's backward again (3 + 3 + 2 + 1 = 9): "
           "snlite's variant keeps it one step, when the next step reads it, for no more memory than that "
           "step needs. Cost-aware picks memory-centric here because this segment does not fit under "
           "l_peak (first table).")

# %% [markdown]
# ## Re-runs and FLOPs against peak, AlexNet and a ResNet
# All with liveness and eager offload on (the paper's stack without the cache), counting the paper's way.
# Extra FLOPs are a share of one forward pass.

# %%
resnet_batch = 16 if QUICK else 32
nets = {f"alexnet ({batch})": net, f"resnet50 ({resnet_batch})": snlite.models.resnet(50, batch=resnet_batch)}
rows, all_results = [], {}
print(f"{'network':16} {'recompute':11} {'re-runs':>8} {'extra FLOPs':>12} {'peak MiB':>9} "
      f"{'l_peak MiB':>11} {'peak/l_peak':>12}")
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
    r = results
    print(f"{'':16} cost-aware: peak {'<=' if r['cost_aware'].peak_bytes <= r['speed'].peak_bytes else '>'} "
          f"speed-centric's, re-runs {r['cost_aware'].recompute_count} between speed's "
          f"{r['speed'].recompute_count} and memory's {r['memory'].recompute_count}: "
          f"{r['speed'].recompute_count <= r['cost_aware'].recompute_count <= r['memory'].recompute_count}")
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
expect("on AlexNet memory-centric and cost-aware reach the same peak, "
       f"{alex['cost_aware'].peak_bytes / MiB:,.0f} MiB, {alex['cost_aware'].ratio:.2f} x l_peak, with fewer "
       f"re-runs for cost-aware ({alex['cost_aware'].recompute_count} to memory's "
       f"{alex['memory'].recompute_count})",
       alex["memory"].peak_bytes == alex["cost_aware"].peak_bytes
       and alex["cost_aware"].recompute_count < alex["memory"].recompute_count
       and abs(alex["cost_aware"].peak_bytes - 4 * map_bytes) < map_bytes / 10
       and abs(alex["cost_aware"].l_peak_bytes - 3 * map_bytes) < map_bytes / 10,
       why="the peak holds four conv1-sized tensors (conv1's output, kept for relu1's backward, relu1 and "
           "norm1 while relu1 is rebuilt for norm1's backward, and norm1's gradient) against l_peak's three.")
resnet = all_results[f"resnet50 ({resnet_batch})"][1]
expect(f"on the ResNet the ratio stays above 2 ({resnet['cost_aware'].ratio:.2f}), and cost-aware's peak is "
       f"speed-centric's, above memory-centric's",
       resnet["cost_aware"].ratio > 2 and resnet["cost_aware"].peak_bytes == resnet["speed"].peak_bytes
       > resnet["memory"].peak_bytes,
       why="the outputs of the residual adds are checkpoints that stay on the device, and they add up over "
           "the blocks; cost-aware's segments fit under l_peak one by one, but not together with "
           "everything else live.")
save_plot("plot_tradeoff", rows, "05_alexnet_recompute_tradeoff.png",
          title=f"AlexNet batch {batch}: peak (paper count) against recomputation")

# %% [markdown]
# ## Cheap on a GPU, but here?
# The paper picks the layers to recompute by kind, because on a GPU a ReLU, a pooling or a BN costs a few
# percent of a convolution. That is a property of the GPU. On this laptop's host device the same layers run
# as NumPy code, and before snlite's host kernels were made fast, LeNet's max pooling took longer than the
# convolution before it: re-running it cost a quarter of a training step. So a device can be asked:
# `snlite.costs.measure_layer_costs` times every layer's forward there, `snlite.recompute.expensive_layers`
# names the cheap layers slower than half the mean conv or linear layer, and
# `MemoryConfig(recompute_keep=...)` keeps their outputs, as a checkpoint's are kept. The paper's rule is
# the default; the times are measured, so your run may name different layers (or none).

# %%
from snlite.costs import cost_table, measure_layer_costs
from snlite.recompute import expensive_layers

le = snlite.models.lenet(batch=64)
ms = measure_layer_costs(le, "host")
keep = expensive_layers(le, ms)
print(cost_table(le, ms, keep))
print(f"kept by the measured rule on this machine: {', '.join(keep) or 'none'}")
# what the host looked like before its fast pooling: keep pool1 and see what it costs in memory
cheap_rule = simulate(le, MemoryConfig(liveness=True, recompute="cost_aware"))
pool_kept = simulate(le, MemoryConfig(liveness=True, recompute="cost_aware", recompute_keep=("pool1",)))
print(f"cost-aware: {cheap_rule.recompute_count} re-runs, peak {cheap_rule.peak_bytes / MiB:.2f} MiB; "
      f"keeping pool1: {pool_kept.recompute_count} re-runs, peak {pool_kept.peak_bytes / MiB:.2f} MiB")
expect(f"keeping pool1 saves its re-run ({cheap_rule.recompute_count} -> {pool_kept.recompute_count} "
       f"re-runs) and never lowers the peak ({cheap_rule.peak_bytes / MiB:.2f} -> "
       f"{pool_kept.peak_bytes / MiB:.2f} MiB)",
       pool_kept.recompute_count == cheap_rule.recompute_count - 1
       and pool_kept.peak_bytes >= cheap_rule.peak_bytes,
       why="pool1's output now stays from its forward to its backward, as conv1's does; whether that raises "
           "the peak depends on where the peak is (run `snlite plan lenet --recompute cost_aware` to "
           "see the step)")

# %% [markdown]
# ## Exercise
# 1. In the plan cell, change `== "conv1"` to `== "conv5"`. Now cost-aware's re-runs equal which strategy's,
#    and why? (Look at conv5's row in the first table.) Then try `== "conv2"`.
# 2. Set `batch = 20` at the top of the segments cell and run again. Do the per-segment choices change?
#    Every activation scales with the batch; explain why the comparison with l_peak does not depend on it.
# 3. In the last cell, measure `snlite.models.cifar_resnet(8, batch=32)` instead of LeNet. Which kinds does
#    the rule keep on your machine, and what does `expensive_layers(..., ratio=0.25)` add?
