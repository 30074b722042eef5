# %% [markdown]
# # 02 Liveness analysis
#
# What you will learn:
# - the `in` and `out` sets of every route step: which tensors are alive before and after it;
# - that a tensor can be freed right after its last use, forward or backward, and what that saves;
# - how to compute it in O(N): one pass records each tensor's last use (the paper's construction is O(N^2));
# - AlexNet's memory timeline with and without liveness, and where its peak moves.
#
# Run it: `python tutorials/02_liveness.py` from the repository root (after `pip install -e .`), or cell
# by cell (`# %%` cells in VS Code or Jupyter). A few seconds; no GPU.

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
from collections import namedtuple

import snlite
from snlite import MemoryConfig, Scheduler, simulate
from snlite.lesson import MiB, QUICK, expect, save_plot
from snlite.liveness import analyze, first_and_last_use, format_table


# %% [markdown]
# ## The paper's example (Fig. 4), on plain data
# DATA0 -> CONV1 -> POOL2 -> FC4 and DATA0 -> CONV3 -> FC4, then SOFTMAX5, and the six backward steps.
# `analyze` needs only each step's `reads` and `writes`: no network, no device. Tensors: t0 the data,
# t1 conv1's output, t3 pool2's, t2 conv3's, t4 fc's, prob the softmax; t5..t9 gradients (cuDNN's
# dependencies: pooling backward reads x, y and dy; conv and FC backward read x and dy).

# %%
S = namedtuple("S", "label reads writes")
fig4 = [
    S("DATA", (), ("t0",)),
    S("CONV", ("t0",), ("t1",)),
    S("POOL", ("t1",), ("t3",)),
    S("CONV", ("t0",), ("t2",)),
    S("FC", ("t3", "t2"), ("t4",)),
    S("SOFTMAX", ("t4",), ("prob",)),
    S("SOFTMAX bwd", ("prob",), ("t5",)),
    S("FC bwd", ("t3", "t2", "t5"), ("t6",)),
    S("POOL bwd", ("t1", "t3", "t6"), ("t7",)),
    S("CONV bwd", ("t0", "t7"), ("t8",)),
    S("CONV bwd", ("t0", "t6"), ("t9",)),
    S("DATA", ("t8", "t9"), ()),
]
result = analyze(fig4)
print(format_table(result, [s.label for s in fig4]))
first, last = first_and_last_use(fig4)
print("\ntensor  first use  last use  (freed right after its last use)")
for t in first:
    print(f"{t:6} {first[t]:10d} {last[t]:9d}")
peak_live = max(len(r.live_out) for r in result)
print(f"\nat most {peak_live} of {len(first)} tensors are alive at once")
paper_out = ["t0", "t0 t1", "t0 t1 t3", "t0 t1 t3 t2", "t0 t1 t3 t2 t4", "t0 t1 t3 t2 prob", "t0 t1 t3 t2 t5",
             "t0 t1 t3 t6", "t0 t7 t6", "t0 t6 t8", "t8 t9", ""]  # the out column of docs/paper.md section 3
expect("the in and out sets of the table in docs/paper.md section 3, step by step (each step's out set is "
       "the next step's in set)",
       [set(r.live_out) for r in result] == [set(o.split()) for o in paper_out]
       and all(a.live_out == b.live_in for a, b in zip(result, result[1:])) and not result[0].live_in)
expect("t4 (the FC output) dies at step 5, the softmax; t0 (the data) lives until step 10; t1 until step 8",
       (last["t4"], last["t0"], last["t1"]) == (5, 10, 8),
       why="a tensor dies right after its last reader: the softmax is t4's only reader, both CONV backward "
           "steps read the data, and POOL bwd is the last step to read conv1's output.")


# %% [markdown]
# ## AlexNet with and without liveness
# The scheduler's liveness stage turns last uses into frees after each op. Without it, nothing is freed
# until the iteration ends. Both runs below count the paper's way (activations and their gradients).

# %%
batch = 64 if QUICK else 200
net = snlite.models.alexnet(batch=batch)
configs = {"baseline": MemoryConfig(count="paper"), "liveness": MemoryConfig(liveness=True, count="paper")}
traces = {label: simulate(net, cfg) for label, cfg in configs.items()}
plan = Scheduler(net, configs["liveness"]).plan()

print(f"AlexNet, batch {batch}: MiB held at each step (paper count), and what liveness frees after it")
print(f"{'op':>3} {'layer':8} {'phase':9} {'baseline':>9} {'liveness':>9}  frees after")
for base, live, planned in zip(traces["baseline"].steps, traces["liveness"].steps, plan.ops):
    mark = " <- peak" if live.op == traces["liveness"].peak_op else ""
    print(f"{base.op:>3} {base.layer:8} {base.phase:9} {base.counted_bytes / MiB:9.1f} "
          f"{live.counted_bytes / MiB:9.1f}  {','.join(planned.frees)}{mark}")

b, lv = traces["baseline"], traces["liveness"]
print(f"\npeak: baseline {b.peak_bytes / MiB:,.1f} MiB at step {b.peak_step} "
      f"({b.steps[b.peak_op].layer} {b.steps[b.peak_op].phase}); liveness {lv.peak_bytes / MiB:,.1f} MiB at "
      f"step {lv.peak_step} ({lv.steps[lv.peak_op].layer} {lv.steps[lv.peak_op].phase})")
print(f"liveness saves {1 - lv.peak_bytes / b.peak_bytes:.0%}; l_peak {lv.l_peak_bytes / MiB:,.1f} MiB, "
      f"so the peak is still {lv.ratio:.2f} x l_peak")
route_b, route_lv = b.op_steps, lv.op_steps  # the route's ops (the SGD updates after backward come after)
forward_ops = [i for i, r in enumerate(route_b) if r.phase == "forward"]
print("largest tensors alive at the liveness peak:",
      ", ".join(f"{n} {nb / MiB:.0f}" for n, nb in lv.peak_tensors[:5]), "(MiB)")
expect("the two columns are identical through the forward pass (before the softmax)",
       all(route_b[i].counted_bytes == route_lv[i].counted_bytes for i in forward_ops[:-1]),
       why="every activation is still needed by backward, so liveness frees nothing before it.")
expect("then the baseline keeps growing with gradients while the liveness column falls (overall: it rises a "
       "little where a layer's gradient arrives before what it replaces is freed), and the liveness "
       f"peak is in backward (here at {lv.steps[lv.peak_op].layer}'s backward step)",
       all(x.counted_bytes <= y.counted_bytes for x, y in zip(route_b, route_b[1:]))
       and lv.steps[lv.peak_op].phase == "backward" and route_lv[-1].counted_bytes < lv.peak_bytes,
       why="early in backward nearly every forward activation is still alive and the first gradients arrive: "
           "liveness alone cannot go below that. Tutorials 04 (offload) and 05 (recomputation) attack "
           "exactly those activations.")
save_plot("plot_compare_timelines", traces, "02_alexnet_liveness.png",
          title=f"AlexNet batch {batch}: without and with liveness (paper count)")

# %% [markdown]
# ## Exercise
# 1. In the Fig. 4 steps, make the second "CONV bwd" read only ("t6",) (as if CONV3's backward did not need
#    its input). Which set changes, and at which step does t0 now die?
# 2. In the AlexNet cell, change `count="paper"` to `count="all"` in both configs. The absolute saving stays
#    the same: why does the percentage drop?
