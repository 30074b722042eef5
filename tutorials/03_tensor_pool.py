# %% [markdown]
# # 03 The tensor pool
#
# What you will learn:
# - why SuperNeurons allocates device memory once (an arena) instead of once per tensor: count the
#   device allocations of one training iteration under `allocator="raw"` and `allocator="pool"`;
# - how the pool hands out 1 KB blocks: first fit (the paper's) and best fit, and coalescing on free;
# - fragmentation: free bytes that exist but are not in one piece, seen with `format_map`, on a
#   hand-made sequence, on a real plan replayed op by op, and as the arena a real network needs.
#
# Run it: `python tutorials/03_tensor_pool.py` from the repository root (after `pip install -e .`), or
# cell by cell (`# %%` cells in VS Code or Jupyter). About 2 s; no GPU.

# %% Setup: the quick flag, the output folder, and plots that never stop the lesson
import os
from pathlib import Path

import snlite
from snlite import MemoryConfig, Scheduler
from snlite.device import MetaDevice
from snlite.pool import PoolFullError, TensorPool, format_map
from snlite.recompute import base_name
from snlite.executor import Executor
from snlite.placement import place, simulate, smallest_budget
from snlite.scheduler import PERSISTENT_KINDS

QUICK = os.environ.get("SNLITE_TUTORIAL_QUICK") == "1"  # the test suite sets it: smaller everything
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("SNLITE_TUTORIAL_OUT") or HERE / "out")
OUT.mkdir(parents=True, exist_ok=True)
KiB, MiB = 2**10, 2**20


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
# ## First fit and best fit, by hand
# A 16 KB pool of 1 KB blocks. `#` is a used block, `.` a free one. We fill it, free two tensors to leave
# two holes (4 KB and 2 KB), then ask for 2 KB and 4 KB. First fit takes the lowest hole that fits; best
# fit the smallest one.

# %%
def hand_made(fit):
    pool = TensorPool(16 * KiB, fit=fit)
    rows = []
    off = {name: pool.alloc(size * KiB, name) for name, size in (("A", 4), ("B", 1), ("C", 2), ("D", 1), ("E", 8))}
    rows.append(("fill A4 B1 C2 D1 E8", format_map(pool, width=16)))
    pool.free(off["A"])
    pool.free(off["C"])
    rows.append(("free A and C", format_map(pool, width=16)))
    for name, size in (("F", 2), ("G", 4)):
        try:
            at = pool.alloc(size * KiB, name)
            rows.append((f"alloc {name}{size}: at {at // KiB} KB", format_map(pool, width=16)))
        except PoolFullError:
            s = pool.stats()
            rows.append((f"alloc {name}{size}: FULL ({s.free_bytes // KiB} KB free, largest "
                         f"{s.largest_free_bytes // KiB} KB, fragmentation {s.fragmentation:.0%})",
                         format_map(pool, width=16)))
    return rows


for fit in ("first", "best"):
    print(f"fit={fit}")
    for what, line in hand_made(fit):
        print(f"  {line}  {what}")
# What you should see: first fit puts F at 0 KB, cutting the 4 KB hole in two, and then G (4 KB) does not
# fit although 4 KB are free: the free space is two 2 KB holes (fragmentation 50%). Best fit puts F into
# the 2 KB hole and G fits. (Other sequences favour first fit: neither policy always wins.)

# %% [markdown]
# ## A real plan, replayed through a pool
# The scheduler's plan says, op by op, what each op writes and what is freed after it. Replaying those
# allocations through a `TensorPool` shows the arena breathe: it fills during forward and empties during
# backward. (A simplified replay of what `snlite.placement` does: activations and gradients only; an
# in-place write takes over the buffer it overwrites.)

# %%
net = snlite.models.lenet(batch=8)
plan = Scheduler(net, MemoryConfig(liveness=True)).plan()
specs = net.tensors()


def replay(plan, fit, capacity, show=False):
    """Allocate each op's writes, free what the plan frees; return the pool (and print its map)."""
    pool, where = TensorPool(capacity, fit=fit), {}
    for p in plan.ops:
        op = p.op
        handed = dict(op.inplace)  # new tensor -> the tensor whose buffer it takes over
        for t in op.writes:
            if specs[base_name(t)].kind in PERSISTENT_KINDS:
                continue
            if t in handed:
                where[t] = where.pop(handed[t])
            elif t not in where:
                where[t] = pool.alloc(specs[base_name(t)].nbytes, t, op.step)
        if show:
            print(f"{op.index:3d} {op.layer:8} {op.phase:9} |{format_map(pool, width=48)}| "
                  f"{pool.in_use_bytes // KiB:5d} KB")
        for t in p.frees:
            if t in where:
                pool.free(where.pop(t))
    return pool


unlimited = sum(-(-t.nbytes // KiB) * KiB for t in specs.values())  # room for every tensor at once
high = {fit: replay(plan, fit, unlimited).stats() for fit in ("first", "best")}
arena = max(s.high_water_bytes for s in high.values())
print(f"LeNet, batch 8, liveness on: arena of {arena // KiB} KB (activations and gradients), first fit")
replay(plan, "first", arena, show=True)
for fit, s in high.items():
    print(f"fit={fit}: peak in use {s.peak_in_use_bytes // KiB} KB, arena needed (high water) "
          f"{s.high_water_bytes // KiB} KB")
# What you should see: the map fills from the left during forward, then holes open during backward as
# liveness frees tensors and new gradients land in them; at the end everything is free again (the pool
# coalesced every free region). The arena a fit needs is at least the peak in use; the difference is
# what fragmentation costs.

# %% [markdown]
# ## One allocation, or one per tensor
# The baseline SuperNeurons measured against calls cudaMalloc/cudaFree for every tensor, every iteration
# (36% of ResNet-50's training time in the paper). With `allocator="pool"` the runtime allocates one arena
# when it starts and never again. A meta device that counts its allocations shows the difference.

# %%
class CountingMeta(MetaDevice):
    """The meta device, counting device allocations (cudaMalloc calls on a GPU)."""

    allocations = 0

    def _alloc(self, nbytes, pinned, stream):
        if not pinned:
            self.allocations += 1
        return super()._alloc(nbytes, pinned, stream)


alex = snlite.models.alexnet(batch=64 if QUICK else 200)
live = MemoryConfig(liveness=True)
SGD = dict(lr=0.01, momentum=0.9, weight_decay=0.0)
print(f"AlexNet, batch {alex.input_shape[0]}, liveness on")
print(f"{'allocator':9} {'at start':>9} {'iteration 1':>12} {'iteration 2':>12} {'bytes allocated':>16}")
traces = {}
for allocator in ("raw", "pool"):
    program = place(alex, live.replace(allocator=allocator))  # the iteration, every allocation decided
    dev = CountingMeta()
    executor = Executor(alex, dev, program.arena_bytes, program.slab_bytes)  # pool: the arena, once
    executor.install(program)  # the weights, their gradients and momentum
    counts = [dev.allocations]
    for _ in range(2):
        executor.run(program, sgd=SGD)  # replays the program on the meta device: shapes and bytes only
        counts.append(dev.allocations)
    traces[allocator] = simulate(alex, live.replace(allocator=allocator))
    print(f"{allocator:9} {counts[0]:9d} {counts[1] - counts[0]:12d} {counts[2] - counts[1]:12d} "
          f"{dev.arena_bytes / MiB:13,.0f} MiB")
# What you should see: raw allocates every weight at the start and then every activation and gradient
# again in each iteration (and frees each one); the pool makes one allocation at the start and none
# after. Raw's bytes keep growing with every iteration; the pool's arena is allocated once. Both hold
# the same tensors at every op (the plot: the same timeline twice; raw rounds to 256 bytes, the pool to
# 1 KB blocks): the pool saves allocation calls, not bytes.
print(f"peak held: raw {traces['raw'].peak_bytes / MiB:,.1f} MiB, pool {traces['pool'].peak_bytes / MiB:,.1f} MiB")
save_plot("plot_compare_timelines", traces, "03_alexnet_raw_vs_pool.png",
          title=f"AlexNet batch {alex.input_shape[0]}, liveness: one allocation per tensor (raw) vs one arena (pool)")

# %% [markdown]
# ## Fragmentation on a real network: the arena each fit needs
# `smallest_budget` binary-searches the smallest arena a configuration runs in. Compare it with the peak
# bytes in use: the gap is space lost to holes.

# %%
configs = {"liveness + recompute": MemoryConfig(liveness=True, recompute="cost_aware"),
           "superneurons()": MemoryConfig.superneurons()}
print(f"{'configuration':20} {'fit':6} {'smallest arena':>15} {'peak in use there':>18} {'lost to holes':>14}")
for label, base in list(configs.items())[:1] if QUICK else configs.items():
    for fit in ("first", "best"):
        need = smallest_budget(alex, base.replace(fit=fit))
        peak = simulate(alex, base.replace(fit=fit, budget_bytes=need)).peak_bytes  # bytes in use at the busiest op
        print(f"{label:20} {fit:6} {need / MiB:11,.0f} MiB {peak / MiB:14,.0f} MiB {need / peak - 1:14.1%}")
# What you should see: with recomputation, tensors of many sizes come and go during backward, and first
# fit loses a few percent of the arena to holes; best fit loses less here. Under superneurons() the LRU
# cache moves tensors to the host whenever an allocation fails, which also opens holes where they are
# needed: the arena shrinks until little or nothing is lost, with either fit.

# %% [markdown]
# ## Exercise
# In the hand-made cell, change the second request from ("G", 4) to ("G", 3), and the first from ("F", 2)
# to ("F", 1). Which fit fails now, if any? Then, in the last cell, put `MemoryConfig(liveness=True)` in
# `configs`: why are first and best fit equal for a plan without recomputation? (Hint: look at the replay's
# map: in what order are tensors freed during backward?)
