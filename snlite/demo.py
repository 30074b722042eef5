"""``snlite demo``: a small CNN trained under the baseline and under everything SuperNeurons
does, to show what each optimization saves, and that none of them changes a single bit.

The lesson in four prints:

1. the network, layer by layer (``Graph.summary``);
2. the scheduler's stages under SuperNeurons' optimizations, and the first ops of its plan (the
   offload eager, as in docs/paper.md section 4: ``superneurons()``' tensor cache would move nothing
   in a net this small, and its schedule is the paper's);
3. peak memory of one training iteration as the optimizations are added one by one, planned on
   the meta device (``snlite.simulate``): liveness frees tensors after their last use, offload
   parks CONV outputs on the host, recomputation drops cheap layers' outputs and rebuilds them,
   updating in backward frees each weight gradient as soon as its layer's SGD step has run;
4. training on the host device under the baseline and under SuperNeurons side by side: the
   losses and weights are bit-identical, and each run's peak equals what was planned.

Runs in seconds on the host device (NumPy); needs neither a GPU nor scikit-learn.
"""
from __future__ import annotations

import time

import numpy as np

from snlite.config import MemoryConfig
from snlite.data import synthetic
from snlite.graph import Graph
from snlite.pipeline import simulate
from snlite.scheduler import Scheduler
from snlite.train import Model

MAX_STEPS = 2_000  # the demo makes its synthetic images up front (steps x batch) and trains two models
WHY_MAX_STEPS = "the demo makes its images up front; train longer with snlite train"

LADDER = [
    ("baseline", MemoryConfig()),
    ("+ liveness", MemoryConfig(liveness=True)),
    ("+ offload", MemoryConfig(liveness=True, offload=True)),
    ("+ recompute", MemoryConfig(liveness=True, offload=True, recompute="cost_aware")),
    ("+ update in backward", MemoryConfig(liveness=True, offload=True, recompute="cost_aware",
                                          update_in_backward=True)),
]


def small_cnn(batch: int = 8, shape=(1, 8, 8), classes: int = 4) -> Graph:
    """conv-BN-ReLU, conv-ReLU, 2x2 max pool, linear: two CONV layers so that offload has work."""
    g = Graph((batch,) + tuple(shape), classes, name="small_cnn")
    x = g.relu(g.batchnorm(g.conv2d(g.input(), 8, 3, padding=1)))
    x = g.maxpool(g.relu(g.conv2d(x, 8, 3, padding=1)), 2)
    g.softmax_loss(g.linear(g.flatten(x), classes))
    return g


def ladder_table(graph: Graph) -> str:
    rows = [f"{'configuration':20} {'peak':>10} {'l_peak':>10} {'peak/l_peak':>12} {'recomputed':>11} "
            f"{'to host':>10}"]
    for label, cfg in LADDER:
        tr = simulate(graph, cfg)
        rows.append(f"{label:20} {tr.peak_bytes:10,d} {tr.l_peak_bytes:10,d} {tr.ratio:12.2f} "
                    f"{tr.recompute_count:11d} {tr.d2h_bytes:10,d}")
    return "\n".join(rows)


def run(device="host", steps: int = 30, batch: int = 8, lr: float = 0.02, momentum: float = 0.9,
        seed: int = 0, out=print) -> dict:
    """The demo; returns the losses of both runs, whether they are bit-identical, and accuracies."""
    graph = small_cnn(batch)
    sn = MemoryConfig(liveness=True, offload=True, recompute="cost_aware", workspace="dynamic",
                      update_in_backward=True)
    out(f"snlite demo: {graph.name}, batch {batch}\n")
    out(graph.summary() + "\n")
    sched = Scheduler(graph, sn)
    out(str(sched) + "\n")
    out(sched.plan().table(limit=12) + "\n")
    out("peak device memory of one training iteration, in bytes, planned on the meta device:")
    out(ladder_table(graph) + "\n")
    models = {"baseline": Model(graph, MemoryConfig(), device=device, seed=seed),
              "superneurons": Model(graph, sn, device=device, seed=seed)}
    if not models["baseline"].device.has_data:
        out(f"The {device} device holds no data: the plan and the table above are what it computes. "
            "Run with --device host to train.")
        return {"losses": {}, "identical": None, "accuracy_before": None, "accuracy_after": None}
    train = synthetic(steps * batch, graph.input_shape[1:], graph.num_classes, seed=seed)
    test = synthetic(64, graph.input_shape[1:], graph.num_classes, seed=seed + 1)
    before = models["superneurons"].evaluate(test.x, test.labels)
    out(f"training {steps} steps of SGD (lr {lr}, momentum {momentum}) on {train.name} data under both "
        f"configurations, on the {device} device:")
    losses = {k: [] for k in models}
    start = time.perf_counter()
    for step, (x, labels) in enumerate(train.batches(batch, shuffle=False), 1):
        for k, m in models.items():
            losses[k].append(m.step(x, labels, lr=lr, momentum=momentum))
        if step == 1 or step % 5 == 0 or step == steps:
            out(f"step {step:3d}  loss {losses['baseline'][-1]:.6f} (baseline)  "
                f"{losses['superneurons'][-1]:.6f} (superneurons)")
    seconds = time.perf_counter() - start
    pa, pb = models["baseline"].params, models["superneurons"].params
    identical = losses["baseline"] == losses["superneurons"] and all(np.array_equal(pa[n], pb[n]) for n in pa)
    after = models["superneurons"].evaluate(test.x, test.labels)
    out(f"{steps} steps in {seconds:.2f} s; losses and weights bit-identical: {identical}")
    for k, m in models.items():
        out(f"{k:13} peak {m.trace.peak_bytes:,d} bytes (planned {simulate(graph, m.config).peak_bytes:,d})")
    out(f"\ntest accuracy {before:.0%} before training, {after:.0%} after ({len(test)} held-out images, "
        f"chance is {1 / graph.num_classes:.0%})")
    out("Next: snlite train lenet --data digits   (a real data set; needs scikit-learn)")
    return {"losses": losses, "identical": identical, "accuracy_before": before, "accuracy_after": after}
