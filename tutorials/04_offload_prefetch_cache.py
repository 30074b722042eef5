# %% [markdown]
# # 04 Offload, prefetch and the LRU tensor cache
#
# What you will learn:
# - the Unified Tensor Pool's eager schedule: each CONV output goes to pinned host memory after its forward,
#   its device block is released when the next CONV starts, and it comes back (prefetch) in backward
#   one CONV segment ahead of need; as data: `Scheduler(...).plan()` and its `transfers`;
# - the mechanics: one pinned host slab taken once, a compute stream and two copy streams, events that
#   make a copy wait for the kernel that produced its data, and compute wait only where it must;
# - the bytes moved and the peak saved;
# - the LRU tensor cache (the paper's Algorithm 2): move nothing until an allocation fails, then evict
#   the least recently used unlocked tensors. Hits, misses and traffic as the memory budget shrinks.
#
# Run it: `python tutorials/04_offload_prefetch_cache.py` from the repository root (after
# `pip install -e .`), or cell by cell (`# %%` cells in VS Code or Jupyter). About 3 s; no GPU.

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import BudgetError, MemoryConfig, Scheduler, simulate
from snlite.device import MetaDevice, NullEvent, NullStream
from snlite.lesson import MiB, QUICK, expect, save_plot  # noqa: F401  (expect: claims the lesson checks)
from snlite.runtime import Runtime, optimizer_specs, smallest_budget


# %% [markdown]
# ## The eager schedule, as data
# Only CONV outputs move (the cheap layers' outputs are too large for their compute to hide a copy).
# `offload_after`: start the copy to the host after this op; `release_before`: free the device block
# before this op (the next CONV); `prefetch_before`: start the copy back before this op.

# %%
batch = 200
net = snlite.models.alexnet(batch=batch)
eager = MemoryConfig(liveness=True, offload=True)
plan = Scheduler(net, eager).plan()
layer_of = {p.op.index: f"{p.op.layer} {p.op.phase}" for p in plan.ops}
print(f"AlexNet, batch {batch}, {eager.describe()}:")
print(f"{'tensor':8} {'MiB':>6}  {'offload after':22} {'release before':22} {'prefetch before':22}")
for tr in plan.transfers:
    print(f"{tr.tensor:8} {net.tensors()[tr.tensor].nbytes / MiB:6.1f}  {layer_of[tr.offload_after]:22} "
          f"{layer_of[tr.release_before]:22} {layer_of.get(tr.prefetch_before, 'never (not read again)'):22}")
print("\nthe plan's rows that move data (Scheduler.plan().table()):")
rows = plan.table().splitlines()
print("\n".join([rows[0]] + [r for r in rows[1:] if any(w in r for w in ("offload", "release", "prefetch"))]))
# What you should see: conv1..conv4 travel; conv5 stays (its output is needed again as soon as backward
# reaches it). Each comes back when backward starts the CONV after it, one segment before it is read.

# %% [markdown]
# ## The mechanics: pinned memory, three streams, events
# A meta device that logs what the runtime asks of it (kernels, copies, event records and waits) shows
# the protocol. On a GPU: the copy stream waits for an event recorded after the producing kernel (so the
# copy reads finished data), and the compute stream waits for the copy's event only where the block is
# released (its memory is about to be reused) or a prefetched tensor is read.

# %%
class NamedStream(NullStream):
    def __init__(self, name):
        self.name = name


class LoggedEvent(NullEvent):
    def __init__(self, log, n):
        self.log, self.n = log, n

    def record(self, stream=None):
        self.log.append(f"    event e{self.n} recorded on {stream.name}")

    def wait(self, stream=None):
        self.log.append(f"    {stream.name} waits for e{self.n}")


class LoggingMeta(MetaDevice):
    """The meta device, writing down every kernel, copy and event the runtime uses."""

    def __init__(self):
        super().__init__()
        self.log, self.n_streams, self.n_events = [], 0, 0

    def stream(self):  # the runtime creates compute, copy_out and copy_in, in that order
        self.n_streams += 1
        return NamedStream(("compute", "copy_out", "copy_in")[self.n_streams - 1])

    def event(self, timing=False):
        self.n_events += 1
        return LoggedEvent(self.log, self.n_events)

    def alloc_pinned(self, nbytes):
        self.log.append(f"pinned host slab: {nbytes / MiB:.1f} MiB, allocated once")
        return super().alloc_pinned(nbytes)

    def _copy_to_host(self, src, dst, stream):
        self.log.append(f"    copy {src.nbytes / MiB:.1f} MiB device -> host on {stream.name}")

    def _copy_to_device(self, src, dst, stream):
        self.log.append(f"    copy {src.nbytes / MiB:.1f} MiB host -> device on {stream.name}")

    def _run(self, op, args, stream, kwargs):
        self.log.append(f"kernel {op.name} on {stream.name}")


dev = LoggingMeta()
Runtime(net, eager, dev).run()
first_prefetch = next(i for i, line in enumerate(dev.log) if "host -> device" in line)
print("\n".join(dev.log[:13]))
print("    ...")
print("\n".join(dev.log[first_prefetch - 3:first_prefetch + 4]))
# What you should see: conv1's forward kernels, then an event on compute that the copy_out stream waits
# for, the copy, and an event on copy_out; relu1, norm1 and pool1 run while the copy is in flight; only
# before conv2 (where conv1's block is released) does compute wait for it. Prefetches run on copy_in.

# %% [markdown]
# ## What offload saves, and what it moves

# %%
counted = {label: simulate(net, cfg.replace(count="paper")) for label, cfg in
           (("liveness", MemoryConfig(liveness=True)), ("liveness + offload", eager))}
t = counted["liveness + offload"]
planned = sum(net.tensors()[tr.tensor].nbytes for tr in plan.transfers)
for label, tr in counted.items():
    print(f"{label:20} peak {tr.peak_bytes / MiB:8,.1f} MiB (paper count), peak/l_peak {tr.ratio:.2f}")
print(f"moved: {t.d2h_bytes / MiB:,.1f} MiB to the host, {t.h2d_bytes / MiB:,.1f} MiB back, host peak "
      f"{t.host_peak_bytes / MiB:,.1f} MiB; the plan's transfers add up to {planned / MiB:,.1f} MiB: "
      f"{planned == t.d2h_bytes == t.h2d_bytes}")
# What you should see: True, and a peak a quarter lower: the CONV outputs no longer wait on the device
# for backward. The price is the PCIe traffic, hidden behind compute on a GPU when the copy is shorter
# than the layers it overlaps.
save_plot("plot_compare_timelines", counted, "04_alexnet_offload.png",
          title=f"AlexNet batch {batch}: liveness, then eager offload (paper count)")

# %% [markdown]
# ## The LRU tensor cache under a shrinking budget
# `MemoryConfig.superneurons()` turns the cache on: offload becomes lazy. Nothing moves until an
# allocation would fail; then unlocked tensors go to the host, least recently used first: CONV outputs
# before anything else (because `offload` is on: they are the cheapest to move relative to their compute),
# then other activations and gradients. A tensor the running op reads or writes is locked. A hit is a read
# that finds its tensor on the device; a miss brings it back. Budgets go from the unlimited run's
# peak down to the smallest that works (`smallest_budget`, a binary search on the meta device).

# %%
extra = optimizer_specs(net)  # SGD momentum, as a training run keeps it
configs = {"superneurons()": MemoryConfig.superneurons(),
           "eager, no cache": MemoryConfig(liveness=True, offload=True, recompute="cost_aware")}
top = simulate(net, configs["superneurons()"]).peak_bytes
low = smallest_budget(net, configs["superneurons()"], extra=extra)
steps = 3 if QUICK else 6
budgets = [None] + [(low + (top - low) * k // steps) // 1024 * 1024 for k in range(steps - 1, -1, -1)]
print(f"{'config':16} {'budget':>10} {'peak':>10} {'to host':>10} {'back':>10} {'hits':>5} {'misses':>6}")
sweep = []
for budget in budgets:
    for label, cfg in configs.items():
        text = f"{budget / MiB:6,.0f} MiB" if budget else " unlimited"
        try:
            tr = simulate(net, cfg.replace(budget_bytes=budget))
        except BudgetError:
            print(f"{label:16} {text:>10} {'does not fit':>10}")
            continue
        print(f"{label:16} {text:>10} {tr.peak_bytes / MiB:6,.0f} MiB {tr.d2h_bytes / MiB:6,.0f} MiB "
              f"{tr.h2d_bytes / MiB:6,.0f} MiB {tr.cache_hits:5d} {tr.cache_misses:6d}")
        if label == "superneurons()":
            sweep.append((budget, tr))
moved = [tr.d2h_bytes + tr.h2d_bytes for _, tr in sweep]
print(f"\ncache traffic never falls as the budget shrinks: {all(a <= b for a, b in zip(moved, moved[1:]))}; "
      f"nothing moves at the unlimited budget: {moved[0] == 0}")
# What you should see: with the cache, no traffic at all until the budget bites, then traffic and misses
# grow as the budget shrinks, down to the smallest budget. Eager offload moves the same bytes at every
# budget and stops fitting well before the cache does. That is the paper's AlexNet result: with the cache
# nothing moved until batch 896. "back" can exceed "to host": a tensor evicted a second time while its
# host copy is still valid needs no new copy, but it comes back each time it is read. The unlimited run's
# peak is the highest because nothing is moved and `workspace="dynamic"` takes the fastest convolution
# workspaces while memory is free; as the budget shrinks it picks smaller ones (tutorial 06).
save_plot("plot_compare_timelines", {f"budget {b / MiB:,.0f} MiB" if b else "unlimited": tr
                                     for b, tr in (sweep[0], sweep[-1])},
          "04_alexnet_cache_budget.png", title=f"AlexNet batch {batch}, superneurons(): unlimited vs smallest budget")

# %% [markdown]
# ## Exercise
# In the cache cell, replace `MemoryConfig.superneurons()` by `MemoryConfig.superneurons(offload=False)`:
# the cache still evicts least recently used tensors, but no longer CONV outputs first. Does the smallest
# budget change? Compare the traffic ("to host", "back") at the two smallest budgets, and explain, from
# what each evicted tensor costs to bring back, why the paper preferred to move CONV outputs.
