# %% [markdown]
# # 01 Where memory goes
#
# What you will learn:
# - the execution route, SuperNeurons' Algorithm 1: the order in which a network's layers run forward
#   and backward, on the paper's example DAG, on a small net with a residual join, and on AlexNet;
# - what each route step reads and writes (`g.steps()`), and from that the layer-wise memory
#   l_i^f and l_i^b, and l_peak, the largest of them: the paper's goal for the whole network's peak;
# - the baseline's peak for AlexNet at batch 200, by category (weights, their gradients, momentum, the
#   input batch, activations, activation gradients), planned on the meta device with `snlite.simulate`.
#
# Run it: `python tutorials/01_where_memory_goes.py` from the repository root (after `pip install -e .`),
# or cell by cell (`# %%` cells in VS Code or Jupyter). A few seconds; no GPU, no data.

# %% Setup: quick mode, the output folder, plots and checked claims, from one helper (snlite.lesson)
import snlite
from snlite import MemoryConfig, simulate
from snlite.lesson import MiB, expect, save_plot
from snlite.liveness import step_tensors
from snlite.route import execution_route
from snlite.trace import CATEGORIES


# %% [markdown]
# ## The route: Algorithm 1 on the paper's example
# Depth-first from the data layer; a layer with several inputs (a join) runs only when its last
# predecessor has called it. Backward is the same algorithm on the reversed graph, from the last layer.
# `snlite.route` works on any DAG given as plain data: `{node: [successors in order]}`.

# %%
edges = "a-b b-c b-d c-e d-f f-g f-h e-i g-i h-i i-j"
successors = {}
for e in edges.split():
    src, dst = e.split("-")
    successors.setdefault(src, []).append(dst)
    successors.setdefault(dst, [])
forward, backward = execution_route(successors, "a")
route = [f"{n}{k}" for k, n in enumerate(forward + backward, 1)]
print("forward: ", " ".join(route[:len(forward)]))
print("backward:", " ".join(route[len(forward):]))
paper = "a1 b2 c3 e4 d5 f6 g7 h8 i9 j10 j11 i12 e13 c14 g15 h16 f17 d18 b19 a20".split()
expect("the route of docs/paper.md section 2, step for step", route == paper)
expect("i (a join of e, g and h) runs only at step 9, after h; in backward the fork f (read by g and h) "
       "waits for both g15 and h16",
       forward.index("i") > max(map(forward.index, "egh"))
       and backward.index("f") > max(map(backward.index, "gh")))

# %% [markdown]
# ## The route of a small net, and what each step touches
# A graph built with `snlite.Graph` has one route step per layer and phase. Each step declares the
# tensors it reads and writes, following cuDNN's conventions (conv backward reads x and dy; ReLU
# backward reads x, y, dy and writes dx into dy's buffer: `inplace`). Everything after this is
# computed from these declarations.

# %%
g = snlite.Graph(input_shape=(8, 1, 8, 8), num_classes=4, name="small")
x = g.input()
y = g.relu(g.conv2d(x, 4, 3, padding=1, name="conv1"), name="relu1")
z = g.add(y, g.conv2d(y, 4, 3, padding=1, name="conv2"), name="join")  # a residual join
g.softmax_loss(g.linear(g.flatten(g.maxpool(z, 2, name="pool")), 4, name="fc"))
print(" -> ".join(g.route()[0]))
kinds = {name: t.kind for name, t in g.tensors().items()}


def moving(names):
    """The tensors that come and go (weights and their gradients live for the whole run)."""
    return ",".join(t for t in names if kinds[t] not in ("weight", "weight_grad"))


print(f"{'step':>4} {'layer':8} {'phase':9} {'reads':46} {'writes':28} in place")
for s in g.steps():
    print(f"{s.index:>4} {s.layer:8} {s.phase:9} {moving(s.reads):46} {moving(s.writes):28} "
          f"{','.join(f'{a}<-{b}' for a, b in s.inplace)}")
print(f"{len(g.steps())} steps = 2 x {len(g.layers)} layers")
relu1_back = next(s for s in g.steps() if s.layer == "relu1" and s.phase == "backward")
expect("relu1's output is read by conv2 and by join (a fork), so it has two gradients, relu1.grad@conv2 and "
       "relu1.grad@join, both read by relu1's backward step, which sums them",
       {"relu1.grad@conv2", "relu1.grad@join"} <= set(relu1_back.reads)
       and len(g.steps()) == 2 * len(g.layers))

# %% [markdown]
# ## AlexNet: the route, and the layer-wise memory l_i
# l_i^f is what layer i's forward step touches, l_i^b what its backward step touches, each tensor once (a
# dx that a backward step writes into dy's buffer is one buffer). The paper counts only activations and
# their gradients ("the paper's count"; weights and the input batch apart).
# l_peak = max_i l_i is a lower bound for any schedule: that one step needs all of it at once.

# %%
batch = 200
net = snlite.models.alexnet(batch=batch)
tensors = net.tensors()
print(f"AlexNet, batch {batch}: {len(net.layers)} layers, {len(net.steps())} route steps, "
      f"{net.param_count():,d} parameters")
print("forward: ", " ".join(net.route()[0]))
print("backward:", " ".join(net.route()[1]))


def layer_bytes(step):
    """l_i of one step, the paper's count: the activations and gradients it reads or writes, each once."""
    return sum(tensors[t].nbytes for t in step_tensors(step.reads, step.writes, step.inplace)
               if tensors[t].kind in ("activation", "gradient"))


l_f = {s.layer: layer_bytes(s) for s in net.steps() if s.phase == "forward"}
l_b = {s.layer: layer_bytes(s) for s in net.steps() if s.phase == "backward"}
print(f"\n{'layer':8} {'kind':13} {'output':20} {'l^f MiB':>9} {'l^b MiB':>9}")
for name in net.route()[0]:
    layer = net.layers[name]
    print(f"{name:8} {layer.kind:13} {str(layer.out_shape):20} {l_f[name] / MiB:9.1f} {l_b[name] / MiB:9.1f}")
l_peak = max(max(l_f.values()), max(l_b.values()))
where = max(l_b, key=l_b.get) if max(l_b.values()) >= max(l_f.values()) else max(l_f, key=l_f.get)
print(f"l_peak = {l_peak / MiB:,.1f} MiB, at {where}")
fc = [n for n, layer in net.layers.items() if layer.kind == "linear"]
fc_weights = sum(t.nbytes for n, t in tensors.items() if t.kind == "weight" and n.split(".")[0] in fc)
all_weights = sum(t.nbytes for t in tensors.values() if t.kind == "weight")
expect(f"the early layers (conv1, relu1, norm1: 55x55 maps of 96 channels) dominate, and l_peak is at one of "
       f"them ({where}); the FC layers hold most of the weights ({fc_weights / all_weights:.0%}) but little "
       f"activation memory (at most {max(max(l_f[n], l_b[n]) for n in fc) / l_peak:.0%} of l_peak)",
       where in ("conv1", "relu1", "norm1") and fc_weights > all_weights / 2
       and max(max(l_f[n], l_b[n]) for n in fc) < l_peak / 10)

# %% [markdown]
# ## The baseline's peak, by category
# The baseline gives every tensor its own memory for the whole iteration. `simulate` runs one training
# iteration on the meta device (shapes and bytes only) through the same runtime, pool and allocations
# that the host and CUDA devices use, and returns a trace: bytes by category at every op.

# %%
trace = simulate(net, MemoryConfig.baseline())
at_peak = trace.steps[trace.peak_op]
print(f"baseline peak {trace.peak_bytes / MiB:,.1f} MiB at step {trace.peak_step} "
      f"({at_peak.layer} {at_peak.phase}), everything counted")
print(f"{'category':14} {'MiB':>9} {'share':>6}")
for c in CATEGORIES:
    b = at_peak.device_bytes.get(c, 0)
    print(f"{c:14} {b / MiB:9.1f} {b / trace.peak_bytes:6.1%}")
paper_count = simulate(net, MemoryConfig(count="paper"))
print(f"the paper's count (activations + gradients): {paper_count.peak_bytes / MiB:,.1f} MiB; "
      f"l_peak {paper_count.l_peak_bytes / MiB:,.1f} MiB; peak / l_peak = {paper_count.ratio:.2f}")

weight_bytes = sum(t.nbytes for t in tensors.values() if t.kind in ("weight", "buffer"))
handed = {new for s in net.steps() for new, _ in s.inplace}  # written into another tensor's buffer
own_buffers = sum(t.nbytes for t in tensors.values()  # each at its own size, as the paper counts
                  if t.kind in ("activation", "gradient") and t.name not in handed)
print(f"weights: {weight_bytes / MiB:,.1f} MiB = 4 bytes x {net.param_count():,d} parameters; "
      f"their gradients and the momentum take as much again, each")
print(f"every activation and gradient buffer, summed: {own_buffers / MiB:,.1f} MiB")
act_grad = sum(at_peak.device_bytes.get(c, 0) for c in ("activations", "gradients"))
expect(f"activations and their gradients are most of the peak ({act_grad / trace.peak_bytes:.0%})",
       act_grad > trace.peak_bytes / 2)
expect("in the baseline their peak is simply the sum of all their buffers (the paper-count peak)",
       own_buffers == paper_count.peak_bytes, why="nothing is ever freed. Tutorial 02 frees them.")
save_plot("plot_timeline", trace, "01_alexnet_baseline.png", title=f"AlexNet batch {batch}, baseline")

# %% [markdown]
# ## Exercise
# Change `batch = 200` to `batch = 100` and run again. Which categories halve, and which stay the same?
# Then replace `MemoryConfig.baseline()` by `MemoryConfig(liveness=True)` in the last cell: which layer
# is now at the peak, and why is it a backward step? (Tutorial 02 explains.)
