# %% [markdown]
# # 04 Offload, prefetch and the LRU tensor cache
#
# What you will learn:
# - the Unified Tensor Pool's eager schedule: each CONV output goes to pinned host memory after its forward,
#   its device block is released when the next CONV starts, and it comes back (prefetch) in backward
#   one CONV segment ahead of need; as data: `Scheduler(...).plan()` and its `transfers`;
# - the mechanics, as the program the placement pass writes: one pinned host slab taken once, a compute
#   stream and two copy streams, events that make a copy wait for the kernel that produced its data, and
#   compute wait only where it must; the streams overlapping on the adversarial device;
# - what one missing wait does: the race checker's report, and wrong numbers on the adversarial device;
# - the bytes moved and the peak saved;
# - the LRU tensor cache (the paper's Algorithm 2): move nothing until an allocation fails, then evict
#   the least recently used unlocked tensors. Hits, misses and traffic as the memory budget shrinks.
#
# Run it: `python tutorials/04_offload_prefetch_cache.py` from the repository root (after
# `pip install -e .`), or cell by cell (`# %%` cells in VS Code or Jupyter). About 4.5 s; no GPU.

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import BudgetError, MemoryConfig, Scheduler, simulate
from snlite.adversary import AdversarialDevice
from snlite.checker import find_races
from snlite.data import synthetic
from snlite.demo import small_cnn
from snlite.budget import smallest_budget
from snlite.errors import HostBudgetError
from snlite.program import Copy, Free, Launch, Wait
from snlite.search import min_budget
from snlite.train import Model
from snlite.lesson import MiB, QUICK, expect, save_plot  # noqa: F401  (expect: claims the lesson checks)


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
moved = [tr.tensor for tr in plan.transfers]
expect("conv1..conv4 travel to the host and back; conv5 stays", moved == ["conv1", "conv2", "conv3", "conv4"],
       why="conv5's output is needed again as soon as backward reaches it.")
expect("each comes back when backward starts the CONV after it, one segment before it is read",
       all(layer_of[tr.prefetch_before] == f"conv{k + 2} backward" for k, tr in enumerate(plan.transfers)))

# %% [markdown]
# ## The mechanics, as a program: pinned memory, three streams, events
# Before anything runs, the placement pass turns the plan into a *program*: every allocation at its
# offset in the arena, every copy on its stream with the events it records and waits for, every
# kernel launch. Kernels run on `compute`, copies to the host on `copy_out`, copies back on
# `copy_in`. Each copy out waits for an event recorded on compute after the kernel that produced its
# tensor (`ready`); compute waits for the copy's event only where it must: before it frees the
# block the copy reads (`release`), and before it reads a tensor a copy is bringing back (`landed`).
# A copy back waits on `copy_in` for compute too (`reuse`): its fresh block was someone else's a moment
# ago, and the kernels that used it must be done before the copy overwrites it.

# %%
program = snlite.place(net, eager)
rows = program.table().splitlines()
out_copy = next(i for i, r in enumerate(rows) if "device -> host" in r)
back_copy = next(i for i, r in enumerate(rows) if "host -> device (prefetch" in r)
print("\n".join(rows[:2] + rows[out_copy - 5:out_copy + 10] + ["   ..."] + rows[back_copy - 3:back_copy + 7]))
body = program.body
k = next(i for i, ins in enumerate(body) if isinstance(ins, Copy) and ins.tensor == "conv1"
         and ins.why == "offload")
release = next(i for i in range(k, len(body)) if isinstance(body[i], Wait) and body[i].why == "release")
expect("conv1's copy to the host waits for an event recorded on compute after conv1's forward (ready)",
       isinstance(body[k - 1], Wait) and body[k - 1].why == "ready" and body[k - 1].stream == "copy_out")
expect("relu1, norm1 and pool1 are launched while the copy is in flight; compute waits for it only before "
       "freeing conv1's block",
       [i.layer for i in body[k:release] if isinstance(i, Launch)] == ["relu1", "norm1", "pool1"]
       and isinstance(body[release + 1], Free) and body[release + 1].tensor == "conv1")
back = next(i for i, ins in enumerate(body) if isinstance(ins, Copy) and ins.tensor == "conv4"
            and ins.why == "prefetch")
landed = next(i for i in range(back, len(body)) if isinstance(body[i], Wait) and body[i].why == "landed")
expect("in backward, conv4 comes back on copy_in while conv5's backward runs; compute waits for it just "
       "before relu4's backward reads it",
       [i.layer for i in body[back:landed] if isinstance(i, Launch)] == ["conv5"]
       and isinstance(body[landed + 1], Launch) and body[landed + 1].layer == "relu4")

# %% [markdown]
# ## Watching the streams overlap
# The host device runs the program's instructions one by one, in program order, whatever their stream, so
# it cannot show overlap (nor a missing wait).
# The adversarial device keeps each stream as a queue and runs work only when it must: with
# `order="late"`, compute runs as far ahead as the events allow and copies wait until someone waits for
# them. Logging what it runs, in the order it runs it, on a small CNN (AlexNet is too big to train on a
# laptop in a lesson):

# %%
small = small_cnn(batch=8)


class Watched(AdversarialDevice):
    """The adversarial device, writing down each kernel and copy when it actually runs."""

    def __init__(self, order):
        super().__init__(order)
        self.ran = []

    def _enqueue(self, stream, work):
        name = getattr(stream, "name", "default")
        label = self.label

        def logged():
            self.ran.append(f"{name:8} {label}")
            work()
        super()._enqueue(stream, logged)

    def _run(self, op, args, stream, kwargs):
        self.label = f"kernel {op.name}"
        super()._run(op, args, stream, kwargs)

    def _copy_to_host(self, src, dst, stream):
        self.label = f"copy {src.nbytes:,d} bytes device -> host"
        super()._copy_to_host(src, dst, stream)

    def _copy_to_device(self, src, dst, stream):
        self.label = f"copy {src.nbytes:,d} bytes host -> device"
        super()._copy_to_device(src, dst, stream)

    def _alloc(self, nbytes, pinned, stream):
        self.label = "NaN fill"
        return super()._alloc(nbytes, pinned, stream)


x, labels = next(synthetic(8, small.input_shape[1:], small.num_classes).batches(8, shuffle=False))
dev = Watched("late")
model = Model(small, eager, device=dev)
dev.ran.clear()
model.step(x, labels, lr=0.01)
offload = next(i for i, r in enumerate(dev.ran) if "device -> host" in r)
print("\n".join(dev.ran[offload - 6:offload + 2]))
ran = dev.ran
convs = [i for i, r in enumerate(ran) if "conv2d_forward" in r]
expect("the batch arrives on copy_in first", ran[0].startswith("copy_in") and "host -> device" in ran[0])
expect("the copy of conv1's output to the host runs after the kernels that followed conv1 (its bias, batch "
       "norm and relu) and before the next conv", convs[0] + 3 < offload < convs[1],
       why="compute ran ahead while the copy waited, as it may on a GPU, until compute had to free conv1's "
           "block for the next conv and waited for the copy. Every wait in the program holds, so the "
           "numbers are right.")

# %% [markdown]
# ## Remove one wait: the race checker and the wrong numbers
# Delete the `release` wait before conv1's block is freed. On the simulator and the host device nothing
# changes. On a GPU, the next kernel may overwrite the block while the copy is still reading it, and the
# host copy (brought back for backward) is garbage. The race checker finds it without running anything;
# the adversarial device turns it into wrong numbers.

# %%
small_program = model.programs["grads"]
release = next(i for i, ins in enumerate(small_program.body) if isinstance(ins, Wait)
               and ins.why == "release")
broken = small_program.without(release)
print(f"removed #{release}: {small_program.body[release]}\n")
races = find_races(broken)
print(races[0].explain(broken))
print(f"\n{len(races)} race(s) in all; the intact program has {len(find_races(small_program))}")


def three_steps(device, program=None):
    m = Model(small, eager, device=device, seed=1)
    if program is not None:
        m.programs["grads"] = program
    return [m.step(x, labels, lr=0.05) for _ in range(3)]


right = three_steps("host")
print(f"host device, broken program:          {three_steps('host', broken)}")
print(f"adversarial device, intact program:   {three_steps(AdversarialDevice('late'))}")
print(f"adversarial device, broken program:   {three_steps(AdversarialDevice('late'), broken)}")
print(f"the right losses:                     {right}")
first, second = races[0].first, races[0].second
expect("the checker names the copy of conv1 to the host and the free of its block, on two streams with "
       "nothing ordering them", first.tensor == "conv1" and isinstance(broken.body[first.at[1]], Copy)
       and isinstance(broken.body[second.at[1]], Free) and first.stream != second.stream)
expect("the host device (in program order) trains the broken program to the right losses; the "
       "adversarial device trains the intact one to them too, and the broken one to other losses",
       three_steps("host", broken) == right == three_steps(AdversarialDevice("late"))
       and three_steps(AdversarialDevice("late"), broken) != right,
       why="the adversarial device's compute stream overwrote conv1's block before the copy read it. The "
           "first loss is still right (it comes from the forward pass, before backward reads the spoiled "
           "copy back); the gradients are not, so the weights and every later loss differ. The 4 races: "
           "the copy against the free of its block and against conv2's forward, which writes there next, "
           "in each of the two iterations the checker walks.")

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
saved = 1 - t.peak_bytes / counted["liveness"].peak_bytes
expect(f"the bytes moved are the plan's transfers, and the peak is about a quarter lower ({saved:.0%})",
       planned == t.d2h_bytes == t.h2d_bytes and 0.2 < saved < 0.3,
       why="the CONV outputs no longer wait on the device for backward. The price is the PCIe traffic, "
           "hidden behind compute on a GPU when the copy is shorter than the layers it overlaps.")
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
configs = {"superneurons()": MemoryConfig.superneurons(),
           "eager, no cache": MemoryConfig(liveness=True, offload=True, recompute="cost_aware")}
top = simulate(net, configs["superneurons()"]).peak_bytes
low = smallest_budget(net, configs["superneurons()"])
steps = 3 if QUICK else 6
budgets = [None] + [(low + (top - low) * k // steps) // 1024 * 1024 for k in range(steps - 1, -1, -1)]
print(f"{'config':16} {'budget':>10} {'peak':>10} {'to host':>10} {'back':>10} {'hits':>5} {'misses':>6}")
sweep, eager_fits = [], []
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
        else:
            eager_fits.append(budget)
traffic = [tr.d2h_bytes + tr.h2d_bytes for _, tr in sweep]
expect("with the cache, no traffic at all until the budget bites, then traffic grows as the budget shrinks, "
       "down to the smallest budget", traffic[0] == 0 and all(a <= b for a, b in zip(traffic, traffic[1:]))
       and traffic[-1] > 0 and len(sweep) == len(budgets),
       why="that is the paper's AlexNet result: with the cache nothing moved until batch 896. \"back\" can "
           "exceed \"to host\": a tensor evicted a second time while its host copy is still valid needs no "
           "new copy, but it comes back each time it is read.")
expect("eager offload stops fitting well before the cache does", len(eager_fits) < len(sweep),
       why="it moves the same bytes at every budget, whatever the budget. The unlimited run's peak is the "
           "highest because nothing is moved and workspace=\"dynamic\" takes the fastest convolution "
           "workspaces while memory is free; as the budget shrinks it picks smaller ones (tutorial 06).")
save_plot("plot_compare_timelines", {f"budget {b / MiB:,.0f} MiB" if b else "unlimited": tr
                                     for b, tr in (sweep[0], sweep[-1])},
          "04_alexnet_cache_budget.png",
          title=f"AlexNet batch {batch}, superneurons(): unlimited vs smallest budget")

# %% [markdown]
# ## Two budgets: device memory against pinned host memory
# Whatever leaves the device waits in one pinned host slab, and pinned memory is scarce too: the
# operating system cannot page it out. `host_budget_bytes` bounds it (`--host-budget` on the command
# line). The sweep above showed the cache moving more as the device budget shrank, and under a tight
# budget `superneurons()` also parks SGD's momentum on the host (`optimizer_state="auto"`): what the
# device gives up, the host must hold. `snlite.search.min_budget` finds `superneurons()`' smallest
# device budget under each host budget. (`snlite compare NET --budget B --host-budget H` runs every
# strategy under both and says which memory each ran out of.)

# %%
least = {}
print(f"{'pinned host memory':>18}  smallest device budget")
for host in (None, 1024, 768, 512, 300, 100):
    try:
        least[host] = min_budget(net, MemoryConfig.superneurons(host_budget_bytes=host and host * MiB))
        text = f"{least[host].budget_bytes / MiB:,.1f} MiB"
    except HostBudgetError:
        least[host] = None
        text = "none: not even the staged batch and its results fit"
    print(f"{f'{host:,d} MiB' if host else 'unlimited':>18}  {text}")
device = [least[h].budget_bytes for h in (None, 1024, 768, 512, 300)]
expect("the less pinned host memory, the larger the smallest device budget; under 100 MiB no device "
       "budget fits", device == sorted(device) and device[0] < device[-1] and least[100] is None,
       why="with less room on the host, less can leave the device, so the device must keep it. The staged "
           "batch (200 images) alone needs more than 100 MiB of the slab, whatever the device holds.")

# %% [markdown]
# ## Exercise
# In the cache cell, replace `MemoryConfig.superneurons()` by `MemoryConfig.superneurons(offload=False)`:
# the cache still evicts least recently used tensors, but no longer CONV outputs first. Does the smallest
# budget change? Compare the traffic ("to host", "back") at the two smallest budgets: which moves more?
# The paper preferred CONV outputs for time, not bytes: a CONV output's copy hides behind the next
# convolution's long compute, where a cheap layer's output is wanted back almost at once. Estimate both
# programs' step time on a GPU at their smallest budgets (after `import snlite.timing`,
# `snlite.timing.estimate(snlite.place(net, config), net, "H200").step_ms`) and see whether the time
# model agrees with the paper where the byte counts do not.
