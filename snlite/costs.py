"""Measured per-layer times: what the choice of cheap layers rests on, off the paper's GPU.

SuperNeurons recomputes layers by kind (ReLU, pooling, BN, LRN, dropout) because on a GPU they
cost a few percent of a convolution while holding about half the activations (docs/paper.md
section 5). That is a fact about a GPU, not about the layers: before snlite's host device had
its fast kernels, a max pooling forward on NumPy took longer than the convolution before it, and
recomputing it cost a quarter of a training step. So the kinds stay the default, and a device can
be asked instead:

    ms = measure_layer_costs(graph, "host")                 # this module: one profiled step per rep
    keep = snlite.recompute.expensive_layers(graph, ms)     # plain data: the cheap layers that are not
    config = MemoryConfig.superneurons(recompute_keep=keep) # their outputs stay, as a checkpoint's do

The times are a measurement, so two runs can name different layers; the plan is then decided by
``recompute_keep``, which is plain data: the meta device plans the same bytes from the same tuple.
On the command line: ``snlite costs NET --device host``. (Convolution algorithms are measured the
same way on a real GPU: :func:`snlite.workspace.measure_conv_costs`.)
"""
from __future__ import annotations

import statistics

import numpy as np

from snlite.config import MemoryConfig
from snlite.device import get_device
from snlite.train import Model


def span_of(label: str) -> tuple[str, str]:
    """(layer, phase) of a profiled span (``Model.stream_events``): "conv1 forward" -> ("conv1",
    "forward"); a copy, "conv1 to host", -> ("copy", "to host")."""
    if " to " in label:
        return "copy", "to " + label.rsplit(" to ", 1)[1]
    layer, _, phase = label.rpartition(" ")
    return layer, phase


def measure_layer_costs(graph, device="host", reps: int = 3, seed: int = 0) -> dict[str, float]:
    """Milliseconds of every layer's forward step on ``device`` ("host", "cuda" or a Device): the
    median over ``reps`` profiled forward-and-backward passes of the baseline (each layer's forward
    runs once per pass, nothing recomputed), after one pass that warms up (on a GPU, compiles the
    kernels). The batch is random, the weights those of ``seed``; the model is discarded after.
    A layer whose forward launches nothing takes 0.0."""
    if isinstance(reps, bool) or not isinstance(reps, (int, np.integer)) or reps < 1:
        raise ValueError(f"measure_layer_costs: reps must be an int >= 1, got {reps!r}")
    device = get_device(device)
    if not device.has_data:
        raise ValueError(f"measure_layer_costs: the {device.name} device runs no kernels, "
                         f"so it has no times; measure on 'host' or 'cuda'")
    model = Model(graph, MemoryConfig(), device=device, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(graph.input_shape).astype(np.float32)
    labels = rng.integers(0, graph.num_classes, graph.input_shape[0]).astype(np.int32)
    model.forward_backward(x, labels)  # warm-up
    model.profile = True
    runs: dict[str, list[float]] = {name: [] for name in graph.layers}
    for _ in range(reps):
        model.forward_backward(x, labels)
        for e in model.stream_events:
            layer, phase = span_of(e["label"])
            if phase == "forward" and layer in runs:
                runs[layer].append(e["end_ms"] - e["start_ms"])
    model.profile = False
    return {name: statistics.median(ms) if ms else 0.0 for name, ms in runs.items()}


def cost_table(graph, forward_ms: dict, keep=()) -> str:
    """The measured times in route order, as text: layer, kind, ms, and which cheap layers stay."""
    rows = [f"{'layer':24} {'kind':13} {'forward ms':>10}  recomputation"]
    for name in graph.route()[0]:
        layer = graph.layers[name]
        role = ("checkpoint" if layer.checkpoint
                else "kept: too slow to re-run" if name in keep else "dropped, re-run")
        if layer.alias_input:
            role = "a view"
        rows.append(f"{name:24} {layer.kind:13} {forward_ms.get(name, 0.0):10.3f}  {role}")
    return "\n".join(rows)
