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

# %% Setup: the quick flag, the output folder, and plots that never stop the lesson
import os
from collections import namedtuple
from pathlib import Path

import snlite
from snlite import MemoryConfig, Scheduler, simulate
from snlite.liveness import analyze, first_and_last_use, format_table

QUICK = os.environ.get("SNLITE_TUTORIAL_QUICK") == "1"  # the test suite sets it: smaller everything
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("SNLITE_TUTORIAL_OUT") or HERE / "out")
OUT.mkdir(parents=True, exist_ok=True)
MiB = 2**20


def save_plot(kind, data, name, **kwargs):
    """snlite.plot.<kind>(data, OUT / name); without matplotlib, one line and the lesson goes on."""
    try:
        from snlite import plot
    except ImportError as e:
        print(f'plot {name} skipped ({e}); plots need matplotlib: pip install -e ".[plot]"')
        return
    try:
        getattr(plot, kind)(data, OUT / name, **kwargs)
        print(f"plot saved: {OUT / name}")
    except plot.PlotUnavailable as e:  # matplotlib is not installed; the message says how to install it
        print(f"plot {name} skipped: {e}")


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
chained = all(a.live_out == b.live_in for a, b in zip(result, result[1:]))
print(f"each step's out set is the next step's in set: {chained}")
# What you should see: the same sets as docs/paper.md section 3's table. t4 (the FC output) dies at step 5,
# the softmax, its only reader; t0 (the data) stays alive until step 10, because both CONV backward
# steps read it; t1 leaves after POOL bwd (step 8), its last reader.

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
    print(f"{base.op:>3} {base.layer:8} {base.phase:9} {base.counted_bytes / MiB:9.1f} {live.counted_bytes / MiB:9.1f}"
          f"  {','.join(planned.frees)}{mark}")

b, lv = traces["baseline"], traces["liveness"]
print(f"\npeak: baseline {b.peak_bytes / MiB:,.1f} MiB at step {b.peak_step} "
      f"({b.steps[b.peak_op].layer} {b.steps[b.peak_op].phase}); liveness {lv.peak_bytes / MiB:,.1f} MiB at step "
      f"{lv.peak_step} ({lv.steps[lv.peak_op].layer} {lv.steps[lv.peak_op].phase})")
print(f"liveness saves {1 - lv.peak_bytes / b.peak_bytes:.0%}; l_peak {lv.l_peak_bytes / MiB:,.1f} MiB, "
      f"so the peak is still {lv.ratio:.2f} x l_peak")
forward_ops = [i for i, r in enumerate(b.steps) if r.phase == "forward"]
same = all(b.steps[i].counted_bytes == lv.steps[i].counted_bytes for i in forward_ops[:-1])
print(f"identical through the forward pass (before the softmax): {same}; the liveness peak is in "
      f"{lv.steps[lv.peak_op].phase}")
print("largest tensors alive at the liveness peak:",
      ", ".join(f"{n} {nb / MiB:.0f}" for n, nb in lv.peak_tensors[:5]), "(MiB)")
# What you should see: True: the two columns agree through the forward pass (every activation is still
# needed by backward), then the liveness column falls as backward consumes activations, while the
# baseline keeps growing with gradients. The liveness peak is early in backward, where nearly every
# forward activation is still alive and the first gradients arrive: liveness alone cannot go below
# that. Tutorials 04 (offload) and 05 (recomputation) attack exactly those activations.
save_plot("plot_compare_timelines", traces, "02_alexnet_liveness.png",
          title=f"AlexNet batch {batch}: without and with liveness (paper count)")

# %% [markdown]
# ## Exercise
# 1. In the Fig. 4 steps, make the second "CONV bwd" read only ("t6",) (as if CONV3's backward did not need
#    its input). Which set changes, and at which step does t0 now die?
# 2. In the AlexNet cell, change `count="paper"` to `count="all"` in both configs. The absolute saving stays
#    the same: why does the percentage drop?
