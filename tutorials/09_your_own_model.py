# %% [markdown]
# # 09 Your own model
#
# What you will learn:
# - how a PyTorch network becomes an snlite graph: `torch.fx` traces its `forward` into a list of calls,
#   shape propagation runs it once to learn every shape, and each call becomes one layer named after
#   PyTorch's parameter names (`snlite.from_torch`);
# - the three questions people ask of their own network, answered on the meta device in seconds: does it
#   fit in my GPU? what is the largest batch that fits? which strategy should I use?
# - how to read the answer in the tools you already use: PyTorch's memory viewer (pytorch.org/memory_viz)
#   and Perfetto (ui.perfetto.dev);
# - how close the prediction is: PyTorch trains the same network one step on the CPU, and every tensor it
#   holds is counted.
#
# Run it: `python tutorials/09_your_own_model.py` from the repository root, after
# `pip install -e ".[torch,plot]"` (PyTorch and torchvision, CPU builds). About 14 s on a CPU; no GPU.

# %% Setup: quick mode, the output folder and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import MemoryConfig, bench_torch, chrome_trace, memory_snapshot, simulate, timing
from snlite.budget import fits
from snlite.lesson import GiB, MiB, OUT, QUICK, expect
from snlite.pipeline import place
from snlite.search import max_batch
from snlite.torch_import import import_torchvision

torchvision = import_torchvision()  # `import torchvision`, where its C extension matches your torch

# %% [markdown]
# ## A torchvision network, imported
# ResNet-18 as torchvision defines it, untrained. `from_torch` needs the input's shape (C, H, W) and the
# batch; the graph it returns ends in a softmax loss over the model's logits, ready to plan or train.

# %%
net = torchvision.models.resnet18()
shape, batch = (3, 224, 224), 64
g = snlite.from_torch(net, shape, batch=batch)
print(f"{g.name}: {len(g.layers)} layers, {g.param_count():,d} parameters, {g.flops() / 1e9:,.1f} GFLOPs "
      f"forward at batch {batch}")
print("first layers:", ", ".join(list(g.layers)[:8]), "...")
expect("snlite counts exactly the parameters PyTorch does", g.param_count() == sum(p.numel() for p in
       net.parameters()), why="each layer's weights are named as in net.state_dict(), so model.set_params("
       "net.state_dict()) loads them and the trained weights go back with net.load_state_dict().")

# %% [markdown]
# ## Question 1: does it fit?
# Say the GPU has 4 GiB free. The baseline keeps everything; SuperNeurons frees, offloads and recomputes.
# `fits` places one training iteration (SGD with momentum) under the budget on the meta device.

# %%
budget = 4 * GiB
presets = {"baseline": MemoryConfig(), "liveness": MemoryConfig(liveness=True),
           "superneurons()": MemoryConfig.superneurons()}
peaks = {}
for label, config in presets.items():
    peaks[label] = simulate(g, config).peak_bytes
    print(f"{label:15} peak {peaks[label] / MiB:8,.0f} MiB   fits in 4 GiB: "
          f"{fits(g, config.replace(budget_bytes=budget))}")
expect("at batch 64 the baseline needs about 3.6 GiB and superneurons() about a third of that",
       3.3 * GiB < peaks["baseline"] < 3.9 * GiB and peaks["superneurons()"] < peaks["baseline"] / 2.5)

# %% [markdown]
# ## Question 2: what is the largest batch?
# `max_batch` asks "does it fit?" of a graph built at each batch it tries (here: the network imported
# again at that batch), starting from a guess and placing as few times as it can.

# %%
def build(b):
    return snlite.from_torch(net, shape, batch=b)


largest = {}
for label in ("baseline", "superneurons()"):
    found = max_batch(build, presets[label].replace(budget_bytes=budget))
    largest[label] = found.value
    print(f"{label:15} largest batch in 4 GiB: {found.value:4,d}  ({found.probes} placements, "
          f"{found.seconds:.1f} s)")
expect("superneurons() trains ResNet-18 in 4 GiB with a batch several times the baseline's",
       largest["superneurons()"] > 4 * largest["baseline"])

# %% [markdown]
# ## Question 3: which strategy?
# Less memory costs time: copies that do not hide behind compute, and forward layers run twice. The GPU
# time model (`snlite.timing`) estimates one training step on an H200 for each, every one with the dynamic
# convolution workspace (tutorial 06: the fastest algorithm whose workspace fits at that moment); the
# answer is the fastest that fits. The peak is each plan's without a budget, so do not expect
# `superneurons()` to be lowest there: its LRU tensor cache moves a tensor only when memory runs short,
# and with no budget nothing runs short, so it copies nothing and keeps more on the device than
# `+ offload`'s copies made at fixed points do (which is also why its step is faster); "fits" is under the
# 4 GiB budget.

# %%
dynamic = MemoryConfig(workspace="dynamic")
strategies = {"baseline": dynamic, "liveness": dynamic.replace(liveness=True),
              "+ offload": dynamic.replace(liveness=True, offload=True),
              "+ recompute": dynamic.replace(liveness=True, offload=True, recompute="cost_aware"),
              "superneurons()": MemoryConfig.superneurons()}
big = build(largest["baseline"] * 2)  # twice the baseline's largest batch
print(f"{'batch ' + str(big.input_shape[0]):15} {'peak MiB':>9} {'step ms (H200)':>15}  fits 4 GiB")
rows = {}
for label, config in strategies.items():
    program = place(big, config)
    step_ms = timing.estimate(program, big, "H200").step_ms
    rows[label] = (simulate(big, config).peak_bytes, step_ms, fits(big, config.replace(budget_bytes=budget)))
    print(f"{label:15} {rows[label][0] / MiB:9,.0f} {step_ms:15,.1f}  {rows[label][2]}")
choice = min((r[1], label) for label, r in rows.items() if r[2])[1]
expect("superneurons() copies nothing to the host without a budget: its cache moves data only when memory "
       "runs short", simulate(big, MemoryConfig.superneurons()).d2h_bytes == 0
       and simulate(big, strategies["+ offload"]).d2h_bytes > 0)
print(f"the fastest that fits: {choice}")
expect("the baseline and liveness alone no longer fit at twice the baseline's batch; a strategy with the "
       "tensor pool's offload or recomputation does", not rows["baseline"][2] and not rows["liveness"][2]
       and choice not in ("baseline", "liveness"))

# %% [markdown]
# ## Reading the plan in the tools you already use
# The program is every allocation, copy and kernel of the iteration. Two files show it:
# - a PyTorch memory snapshot: drag it onto pytorch.org/memory_viz ("Active Memory Timeline");
# - a Chrome trace: open it at ui.perfetto.dev (or chrome://tracing): one track per stream, the time model's
#   kernels and copies, and a counter of device memory.
# (`snlite plan NET --memory-snapshot F.pickle --chrome-trace F.json` writes the same for the zoo.)

# %%
config = MemoryConfig.superneurons(budget_bytes=budget)
program = place(big, config)
OUT.mkdir(parents=True, exist_ok=True)
memory_snapshot.write(OUT / "09_resnet18.pickle", memory_snapshot.snapshot(program))
timeline = timing.estimate(program, big, "H200")
chrome_trace.write(OUT / "09_resnet18.json", chrome_trace.chrome_trace(
    timeline, f"resnet18, batch {big.input_shape[0]}, {config.describe()}", chrome_trace.held_bytes(program)))
print(f"wrote {OUT / '09_resnet18.pickle'} and {OUT / '09_resnet18.json'}")
expect("the snapshot's arena is the program's, and no larger than the budget",
       memory_snapshot.snapshot(program)["segments"][0]["total_size"] == program.arena_bytes <= budget)

# %% [markdown]
# ## Prediction against reality
# PyTorch trains the same ResNet-18 one step on the CPU (SGD with momentum), and every tensor storage it
# holds is counted op by op (`snlite.bench_torch`). snlite's prediction is for the configuration that
# behaves like PyTorch's autograd: liveness, nothing offloaded or recomputed. `python -m snlite.bench torch`
# does this for fifteen torchvision models.

# %%
r = bench_torch.compare("resnet18", batch=2 if QUICK else 8)
t, s = r["pytorch"], r["snlite"]
print(f"batch {r['batch']}: PyTorch holds at most {t['peak_bytes'] / MiB:,.1f} MiB, snlite predicts "
      f"{s['peak_bytes'] / MiB:,.1f} MiB ({s['peak_bytes'] / t['peak_bytes']:.2f}x)")
for kind in bench_torch.KINDS:
    print(f"  {kind:42} PyTorch {t['by_kind'][kind] / MiB:8,.1f}   "
          f"snlite {s['by_kind'][kind] / MiB:8,.1f} MiB")
same = all(abs(s["by_kind"][k] - t["by_kind"][k]) < 0.001 * t["by_kind"][k]
           for k in ("weights", "optimizer state"))
expect("the weights and the momentum agree within 0.1%; snlite predicts more than PyTorch holds, never less, "
       "and the difference is in the weight gradients and the activations",
       same and t["peak_bytes"] <= s["peak_bytes"] < 1.4 * t["peak_bytes"],
       why="snlite rounds each tensor up to the pool's 1 KiB blocks; it holds every weight gradient from "
           "the iteration's start, where PyTorch makes each as backward reaches it (zero_grad set them to "
           "None); and its ReLU keeps its output beside its input, as cuDNN's backward reads both, where "
           "torchvision's ReLUs write in place: one activation where snlite has two.")

# %% [markdown]
# ## Exercise
# Import another network: `torchvision.models.densenet121()`, `mobilenet_v3_large()` (Hardswish and
# squeeze-and-excitation), `efficientnet_b0(stochastic_depth_prob=0.0)` (SiLU; snlite has no layer that
# skips branches at random), `convnext_tiny(stochastic_depth_prob=0.0)` (LayerNorm over channels between
# permutes), `vit_b_16()` (a vision transformer: its attention is a checkpoint, its LayerNorms and GELUs
# are recomputed) or one of your own (`from_torch` names the first call it cannot import and
# where it sits). Which of the three answers change most, and why? Then give `MemoryConfig.superneurons()`
# `recompute="memory"` and see what the largest batch buys and costs.
