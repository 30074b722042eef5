# %% [markdown]
# # 07 End to end: train with everything on, then go deep
#
# What you will learn:
# - training a small CNN (BatchNorm, dropout, two convolutions) on the 8x8 handwritten digits with every
#   SuperNeurons optimization on (`MemoryConfig.superneurons()`), squeezed to the smallest memory budget
#   it runs in, so the LRU cache really moves tensors and recomputation really rebuilds them;
# - the proof that none of it changes a bit: a baseline model trained side by side ends with the same
#   losses and bit-identical weights;
# - reading the trace of a real run (`model.trace`), and that the planned peak is the executed peak;
# - the paper's depth experiment: the deepest ResNet that fits 12 GiB at batch 16, with and without;
# - its headline at batch 1, where the parameters, not the activations, fill the GPU.
#
# Run it: `python tutorials/07_end_to_end.py` from the repository root (after `pip install -e ".[digits]"`;
# without scikit-learn it falls back to synthetic images), or cell by cell (`# %%` cells in VS Code or
# Jupyter). About 48 s on one core of a 2-core AMD EPYC, most of it the three depth
# searches; 12 s with SNLITE_TUTORIAL_QUICK=1. No GPU: the host device runs NumPy
# kernels (`device="auto"` would pick a real GPU when there is one).

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import time

import numpy as np

import snlite
from snlite import BudgetError, MemoryConfig, Model, simulate
from snlite.data import digits, synthetic
from snlite.lesson import GiB, KiB, QUICK, expect, save_plot
from snlite import search
from snlite.budget import fits, smallest_budget


# %% [markdown]
# ## The data and the network

# %%
real_digits = True
try:
    train, test = digits(standardize=True)  # scikit-learn's bundled digits, no download
except ImportError:
    real_digits = False
    print('scikit-learn is missing (pip install -e ".[digits]"): using synthetic 8x8 images instead')
    train = synthetic(1400, (1, 8, 8), 10, seed=0)
    test = synthetic(360, (1, 8, 8), 10, seed=1)
batch = 32
print(f"train: {train}\ntest:  {test}")

g = snlite.Graph((batch, 1, 8, 8), train.num_classes, name="digits_cnn")
x = g.relu(g.batchnorm(g.conv2d(g.input(), 16, 3, padding=1)))
x = g.maxpool(g.relu(g.conv2d(x, 32, 3, padding=1)), 2)
x = g.dropout(g.relu(g.linear(g.flatten(x), 64)), 0.25)
g.softmax_loss(g.linear(x, train.num_classes))
print(g.summary())

# %% [markdown]
# ## Everything on, at the smallest budget that works
# `smallest_budget` searches on the meta device; the momentum buffers SGD keeps are part of the budget.

# %%
need = smallest_budget(g, MemoryConfig.superneurons())
sn = MemoryConfig.superneurons(budget_bytes=need)
base = MemoryConfig.baseline()
print(f"baseline peak {simulate(g, base).peak_bytes / KiB:,.0f} KiB; superneurons() runs in "
      f"{need / KiB:,.0f} KiB")
print(snlite.Scheduler(g, sn))
refused = None
try:
    Model(g, sn.replace(budget_bytes=need - 16 * KiB), device="host")
except BudgetError as e:
    refused = str(e)
    print(f"\n16 KiB less is refused before anything runs:\n  {refused[:300]}...")
expect("every stage on", sn.liveness and sn.offload and sn.cache and sn.recompute == "cost_aware"
       and sn.workspace == "dynamic")
expect("a budget below the smallest is refused with an error that names the step, the live tensors and the "
       "smallest budget that works, raised while the model is built, before a single kernel runs",
       refused is not None and "at step" in refused and "Live there" in refused and f"{need:,d}" in refused)

# %% [markdown]
# ## Train both, side by side, and compare every bit
# Same seed, same batches, same SGD. The SuperNeurons model evicts tensors to the host and back, drops
# and rebuilds cheap layers' outputs (dropout rebuilds its mask from a hash of seed, iteration and
# layer; a recomputed BatchNorm does not update its running statistics), and picks conv algorithms by
# free memory. None of this may change a single bit.

# %%
epochs = 1 if QUICK else 3
max_steps = 10 if QUICK else None
models = {"baseline": Model(g, base, device="host", seed=0),
          "superneurons": Model(g, sn, device="host", seed=0)}
losses = {k: [] for k in models}
before = models["superneurons"].evaluate(test.x, test.labels)
t0 = time.perf_counter()
for epoch in range(epochs):
    for i, (xb, yb) in enumerate(train.batches(batch, shuffle=True, seed=epoch)):
        if max_steps is not None and i >= max_steps:
            break
        for k, m in models.items():
            losses[k].append(m.step(xb, yb, lr=0.05, momentum=0.9, weight_decay=1e-4))
    print(f"epoch {epoch + 1}: mean loss of the last 20 steps {np.mean(losses['baseline'][-20:]):.4f} "
          f"(baseline), {np.mean(losses['superneurons'][-20:]):.4f} (superneurons)")
seconds = time.perf_counter() - t0
pa, pb = models["baseline"].params, models["superneurons"].params
same_losses = losses["baseline"] == losses["superneurons"]
same_weights = all(np.array_equal(pa[n], pb[n]) for n in pa)
print(f"{len(losses['baseline'])} steps x 2 models in {seconds:.1f} s")
after = {k: m.evaluate(test.x, test.labels) for k, m in models.items()}
print(f"test accuracy: {before:.1%} before training; after: {after['baseline']:.1%} (baseline), "
      f"{after['superneurons']:.1%} (superneurons), chance {1 / train.num_classes:.0%}")
expect(f"the same losses at every step, and all {len(pa)} weight and buffer tensors bit-identical",
       same_losses and same_weights,
       why="the optimizations change where tensors live and when, never what is computed.")
expect("the same test accuracy for both, above chance" + ("" if QUICK or not real_digits else
                                                          " (above 90% on the digits after three epochs)"),
       after["baseline"] == after["superneurons"] > 1 / train.num_classes
       and (QUICK or not real_digits or after["baseline"] > 0.9))

# %% [markdown]
# ## Read the trace of the last training step
# The table below has one row per op, in KiB on the device by kind: the weights (`wts`), their gradients
# (`wgrad`), the momentum (`opt`), the batch (`input`), activations (`act`), their gradients (`grad`), conv
# workspace (`wksp`) and blocks held for a copy still in flight (`flight`); then what waits in pinned host
# memory (`host`) and what the peak counts (`counted`). Ops are the route's steps plus what the plan
# inserts (recomputations, SGD updates in backward), so an op's number runs ahead of its step's.

# %%
m = models["superneurons"]
tr = m.trace
print(tr.summary())
planned = simulate(g, sn)  # one iteration as planned on the meta device
print(f"\nthe plan on the meta device: peak {planned.peak_bytes:,d} bytes; this run on the host device: "
      f"{tr.peak_bytes:,d}")
print(f"largest tensors at the peak: {', '.join(f'{n} ({b // KiB} KiB)' for n, b in tr.peak_tensors[:4])}")
rows = planned.table().splitlines()
print(f"\nthe ops around the peak (op {planned.peak_op}), KiB by category:")
print("\n".join([rows[0]] + rows[1 + max(0, planned.peak_op - 4):planned.peak_op + 4]))
expect("some KiB to the host and back with a few cache misses (the budget is tight), and several recomputed "
       "layer forwards (phase \"recompute\" around the peak)",
       tr.d2h_bytes > 0 and tr.h2d_bytes > 0 and tr.cache_misses > 0 and tr.recompute_count > 1)
expect("the planned peak equals the executed one, byte for byte", planned.peak_bytes == tr.peak_bytes,
       why="the meta device makes the same allocations from the same pool as the host and CUDA devices.")
save_plot("plot_compare_timelines", {k: mm.trace for k, mm in models.items()}, "07_digits_train_step.png",
          title="digits CNN, one training step: baseline vs superneurons() at its smallest budget")

# %% [markdown]
# ## Go deeper: the largest ResNet that fits 12 GiB at batch 16
# The paper's depth experiment (a 12 GB K40): Caffe reached ResNet-148, TensorFlow 592, SuperNeurons
# 1920. Here ResNets grow in the third stage, one bottleneck unit (3 layers) at a time: depth = 3 units + 2.
# "Fits" means one iteration places on the meta device under the budget (weights, gradients, momentum,
# batch, activations and workspace all inside it): `snlite.budget.fits` asks only that, so it skips the
# cache's time-aware second placement, which never raises the peak. Each probe places a network of
# thousands of layers, so the search must be frugal: a first guess from a straight line through two
# small networks, then steps from it (1% of the guess, each step twice as long as the last) until one
# probe fits and the next does not, then bisection until the bracket is narrow (a few percent; 1 unit
# would cost more probes). A good guess is worth the most: two probes, where a bad one costs many.
#
# What the line is drawn through matters. Without the cache, a run needs its peak: the line through the
# peaks of 50 and 100 units. With the cache, the peak is whatever the budget allows (it moves tensors to
# the host when memory runs short); what must fit is the busiest step, `l_peak`, plus a little slack
# (fragmentation, the dynamic workspace, momentum fetched for its update). That slack does not grow with
# depth (a deeper ResNet adds units, not a busier step), so it is measured once, on the 50-unit network,
# as its smallest budget (`search.min_budget`) less its l_peak.

# %%
budget = 12 * GiB
depth_batch = 16
precision = 32  # stop when the bracket is narrower than 1/precision of the depth found
cap = 300 if QUICK else 10_000  # the most residual units tried (quick mode stops early: "at least")


def resnet(units):
    return snlite.models.resnet(3 * units + 2, batch=depth_batch)


def first_guess(config):
    """Where the line through 50 and 100 units crosses the budget (see above)."""
    plain = config.replace(cache=False, workspace="none")  # no budget, no cache: linear in units
    if not config.cache:
        p50, p100 = (simulate(resnet(u), plain).peak_bytes for u in (50, 100))
        room = budget
    else:  # where memory runs short, optimizer_state="auto" keeps the momentum on the host: count it there
        plain = plain.replace(optimizer_state="host")
        p50, p100 = (simulate(resnet(u), plain).l_peak_bytes for u in (50, 100))
        least = search.min_budget(resnet(50), config, resolution=64)  # to 64 KiB: a guess needs no finer
        room = budget - (least.budget_bytes - p50)  # less the slack
    return min(cap, max(50, int(50 + (room - p50) * 50 / (p100 - p50))))


def deepest(config):
    """(lo, hi, guess, probes): ResNets of lo residual units fit, of hi do not (lo >= 50, the smallest
    grown ResNet; lo is None if even that fails; hi is None if the cap fits), the first guess, and how
    many budgeted placements it took."""
    probes = [0]

    def ok(u):
        probes[0] += 1
        return fits(resnet(u), config.replace(budget_bytes=budget))

    guess = first_guess(config)
    step = max(1, guess // 100)  # 1% of the guess, twice as long each time
    if ok(guess):  # step up until a probe fails
        lo, hi = guess, min(cap, guess + step)
        while ok(hi):
            if hi == cap:
                return cap, None, guess, probes[0]
            step *= 2
            lo, hi = hi, min(cap, hi + step)
    else:  # step down until a probe fits
        hi, lo = guess, max(50, guess - step)
        while not ok(lo):
            if lo == 50:
                return None, 50, guess, probes[0]
            step *= 2
            hi, lo = lo, max(50, lo - step)
    while hi - lo > max(1, lo // precision):  # bisect: lo fits, hi does not
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, hi, guess, probes[0]


results, guesses = {}, {}
print(f"{'configuration':14} {'fits':>12} {'does not fit':>13} {'first guess':>12} {'probes':>7} "
      f"{'seconds':>8}")
for label, config in (("baseline", MemoryConfig()), ("superneurons", MemoryConfig.superneurons())):
    t0 = time.perf_counter()
    lo, hi, guess, probes = deepest(config)
    results[label], guesses[label] = lo, guess
    print(f"{label:14} {'ResNet-' + str(3 * lo + 2) if lo else '-':>12} "
          f"{'ResNet-' + str(3 * hi + 2) if hi else '(not tried)':>13} "
          f"{'ResNet-' + str(3 * guess + 2):>12} {probes:7d} {time.perf_counter() - t0:8.1f}")
if results["baseline"] and results["superneurons"]:
    print(f"superneurons goes at least {results['superneurons'] / results['baseline']:.1f}x deeper than the "
          f"baseline (the paper: 1920 / 148 = {1920 / 148:.1f}x Caffe, 3.24x TensorFlow)")
base_units, sn_units = results["baseline"], results["superneurons"]
expect("several times deeper with superneurons() than the baseline",
       base_units and sn_units and sn_units >= 3 * base_units)
expect("each straight line guesses its answer almost exactly (within 5%)",
       all(results[k] and abs(guesses[k] - results[k]) <= 0.05 * results[k] for k in results),
       why="without the cache the peak grows by the same bytes for every unit added; with it, l_peak does, "
           "and the slack beyond it stays put. Draw the superneurons() line through the peaks instead (as "
           "for the baseline) and see how far off it lands. (`snlite maxdepth` runs the same experiment "
           "from the command line, and bisects down to one unit.)")

# %% [markdown]
# ## The paper's headline: batch 1
# At batch 1 the paper trained 2,500 residual units (ResNet-7,502 by snlite's count, 3 x units + 2 layers
# deep) on the same 12 GB GPU. Activations are small there, and the cache moves most of them to the host;
# what fills the GPU is the parameters, which a plain training loop holds three times over all
# iteration: the weights, their gradients and SGD's momentum (one copy is 10.5 GiB at 2,500 units). For
# the paper's figure to fit, the weights must be nearly all that stays: each gradient freed as soon as it
# has been applied, and the momentum somewhere else. superneurons() does both: each layer's SGD step runs
# inside backward, right after that layer's gradient is complete, and frees it (`update_in_backward`); and
# where memory runs short the momentum waits in pinned host memory between updates, prefetched on a copy
# stream before the update that needs it (`optimizer_state="auto"`). `search.max_depth` runs the
# search: a straight-line guess, then probes that place one iteration without running it.

# %%
headline_budget = GiB // 2 if QUICK else 12 * GiB  # quick mode: the same story in a 24th of the memory
t0 = time.perf_counter()
found = search.max_depth(1, MemoryConfig.superneurons(budget_bytes=headline_budget))
print(f"batch 1 in {headline_budget / GiB:g} GiB: ResNet-{found.value:,d} ({(found.value - 2) // 3:,d} "
      f"units) fits, ResNet-{found.next_value:,d} does not; {found.probes} probes, "
      f"{time.perf_counter() - t0:.1f} s (the paper: 2,500 units in 12 GB)")
kinds = found.trace.by_kind()
for kind, (on_device, on_host) in kinds.items():
    print(f"  {kind:42} device {on_device / GiB:6.2f} GiB   host {on_host / GiB:6.2f} GiB")
weights, grads, momentum = kinds["weights"][0], kinds["weight gradients"][0], kinds["optimizer state"]
expect("at the peak the weights fill nearly all of the device (over 90%), their gradients are one layer's "
       "(under 1% of the weights), and the momentum waits on the host",
       weights > 0.9 * found.trace.peak_bytes and grads < 0.01 * weights and momentum[1] > 0.9 * weights,
       why="each gradient lives from its layer's backward step to the update right after it, and the "
           "momentum comes to the device only for its layer's update.")
per_gib = found.value * (12 * GiB / headline_budget)  # quick mode's half GiB, scaled to the paper's 12
expect("as deep per GiB as the paper's 7,502 layers in 12 GB, or deeper"
       + (" (scaled from half a GiB)" if QUICK else ""),
       per_gib >= search.PAPER_DEPTH_AT_BATCH[1],
       why="the weights are all that stays: snlite's bottleneck units have about 1.1 M parameters each, so "
           "12 GiB holds about 2,860 of them.")

# %% [markdown]
# ## Exercise
# 1. In the training cell, give the SuperNeurons model `seed=1` instead of `seed=0`. Which check fails
#    first, and why does that prove the comparison is not vacuous?
# 2. In the batch-1 cell, search under `MemoryConfig.superneurons(optimizer_state="device")`, then under
#    `update_in_backward=False` as well. How deep does each go, and which row of `by_kind()` explains it?
