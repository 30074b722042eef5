"""``snlite demo``: a tiny CNN, the one arena its tensors live in, and a few training steps.

The lesson in four prints:

1. the network, layer by layer (``Graph.summary``);
2. where each of its tensors sits in the one device arena the executor allocates: weights,
   their gradients, activations, and the gradients of the activations. Tensors a step writes in
   place (ReLU's backward writes dx into dy's buffer, as cuDNN does) share an offset. This is the
   baseline SuperNeurons starts from: every tensor has a slot for the whole iteration;
3. how those bytes split by kind: in a CNN the activations and their gradients dominate, which
   is why SuperNeurons frees, offloads and recomputes *them*;
4. the loss going down and the accuracy going up on a synthetic task (which quarter of an 8x8
   image holds a bright blob, :func:`snlite.data.synthetic`).

Runs in a few seconds on the host device (NumPy), needs neither a GPU nor scikit-learn.
"""
from __future__ import annotations

import time

from snlite.data import synthetic
from snlite.graph import Graph
from snlite.runtime import storage_roots
from snlite.train import Model

SHOW_ROWS = 30  # arena rows printed before "... more" (the tiny CNN has 25 tensors)


def tiny_cnn(batch: int = 8, shape=(1, 8, 8), classes: int = 4) -> Graph:
    """conv 3x3 (4 channels) -> ReLU -> 2x2 max pool -> linear: 2 learnable layers."""
    g = Graph((batch,) + tuple(shape), classes, name="tiny_cnn")
    x = g.maxpool(g.relu(g.conv2d(g.input(), 4, 3, padding=1)), 2)
    g.softmax_loss(g.linear(g.flatten(x), classes))
    return g


def arena_table(model: Model, rows: int = SHOW_ROWS) -> str:
    """The arena, in offset order: tensor, kind, shape, bytes, offset; then the bytes by kind."""
    ex = model.executor
    shared = storage_roots(ex.steps)  # tensor -> the tensor whose buffer it was written into
    names = sorted(ex.tensors, key=lambda n: (ex.offsets[n], n in shared))
    lines = [f"{'tensor':22} {'kind':12} {'shape':16} {'bytes':>9} {'offset':>9}"]
    for n in names[:rows]:
        t = ex.tensors[n]
        note = f"  (in {shared[n]}'s buffer)" if n in shared else ""
        lines.append(f"{n:22} {t.kind:12} {str(t.shape):16} {t.nbytes:9,d} {ex.offsets[n]:9,d}{note}")
    if len(names) > rows:
        lines.append(f"... {len(names) - rows} more tensors")
    by_kind: dict[str, int] = {}
    for n, t in ex.tensors.items():
        if n not in shared:  # count shared storage once
            by_kind[t.kind] = by_kind.get(t.kind, 0) + t.nbytes
    lines.append(f"{len(names)} tensors in one arena of {ex.arena_bytes:,d} bytes (slots aligned to 256 bytes)")
    lines.append("by kind: " + ", ".join(f"{k} {b:,d}" for k, b in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)


def run(device="host", steps: int = 30, batch: int = 8, lr: float = 0.02, momentum: float = 0.9, seed: int = 0,
        out=print) -> dict:
    """The demo; returns ``{"losses": [...], "accuracy_before": a, "accuracy_after": b}``."""
    graph = tiny_cnn(batch)
    model = Model(graph, device=device, seed=seed)
    out(f"snlite demo on {model.device!r}: {graph.name}, batch {batch}, "
        f"one arena of {model.executor.arena_bytes:,d} bytes\n")
    out(graph.summary() + "\n")
    out(arena_table(model) + "\n")
    if not model.device.has_data:
        out(f"The {model.device.name} device holds no data: the layout above is all it computes. "
            "Run with --device host to train.")
        return {"losses": [], "accuracy_before": None, "accuracy_after": None}

    train = synthetic(steps * batch, graph.input_shape[1:], graph.num_classes, seed=seed)
    test = synthetic(64, graph.input_shape[1:], graph.num_classes, seed=seed + 1)
    before = model.evaluate(test.x, test.labels)
    out(f"training {steps} steps of SGD (lr {lr}, momentum {momentum}) on {train.name} data: "
        f"which quarter of the image holds a bright blob")
    losses, start = [], time.perf_counter()
    for step, (x, labels) in enumerate(train.batches(batch, shuffle=False), 1):
        losses.append(model.step(x, labels, lr=lr, momentum=momentum))
        if step == 1 or step % 5 == 0 or step == steps:
            out(f"step {step:3d}  loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - start
    after = model.evaluate(test.x, test.labels)
    out(f"{steps} steps in {seconds:.2f} s\n\ntest accuracy {before:.0%} before training, {after:.0%} after "
        f"({len(test)} held-out images, chance is {1 / graph.num_classes:.0%})")
    out("Next: snlite train lenet --data digits   (a real data set; needs scikit-learn)")
    return {"losses": losses, "accuracy_before": before, "accuracy_after": after}
