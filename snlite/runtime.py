"""The runtime: executes a graph's route on a device, step by step.

This is the baseline execution of the networks milestone: every tensor of the iteration has
its own place in one arena for the whole iteration, except where a step writes into another
tensor's buffer (ReLU, LRN, dropout, add and softmax backward, as cuDNN does): those tensors
share storage. The memory scheduler (liveness, offload, recomputation) will replace
:func:`static_layout` with a plan that reuses memory; the executor stays the same.
"""
from __future__ import annotations

import numpy as np

from snlite.device import align_up, nbytes_of
from snlite.graph import Graph, Step, TensorSpec
from snlite.layers import StepIO


def storage_roots(steps: list[Step]) -> dict[str, str]:
    """tensor -> the tensor whose buffer it lives in (itself, unless written in place)."""
    root: dict[str, str] = {}
    for step in steps:
        for new, old in step.inplace:
            root[new] = root.get(old, old)
    return root


def static_layout(tensors: dict[str, TensorSpec], steps: list[Step], extra_bytes: int = 0) -> tuple[dict, int]:
    """Offsets for every tensor, each in its own 256-byte-aligned slot for the whole iteration
    (in-place pairs share a slot). Returns ``(offsets, arena_bytes)``; ``extra_bytes`` are
    reserved at the end (the convolution workspace)."""
    root = storage_roots(steps)
    offsets, top = {}, 0
    for name, spec in tensors.items():
        if name in root:
            continue
        offsets[name] = top
        top = align_up(top + spec.nbytes)
    for name in tensors:
        if name in root:
            offsets[name] = offsets[root[name]]
    return offsets, top + align_up(extra_bytes)


def dropout_seed(seed: int, iteration: int, layer_index: int) -> int:
    """A 32-bit seed that depends only on (model seed, iteration, layer): splitmix64 mixing."""
    z = (seed * 0x9E3779B97F4A7C15 + iteration * 0xBF58476D1CE4E5B9 + layer_index * 0x94D049BB133111EB) & (2**64 - 1)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & (2**64 - 1)
    return (z ^ (z >> 31)) & 0xFFFFFFFF


class Executor:
    """Runs forward/backward steps of ``graph`` on ``device`` with tensors at fixed offsets."""

    def __init__(self, graph: Graph, device, extra_tensors: dict[str, TensorSpec] | None = None):
        self.graph, self.device = graph, device
        self.steps = graph.steps()
        self.tensors = dict(graph.tensors())
        self.tensors.update(extra_tensors or {})
        self.workspace_bytes = 0  # the direct convolution needs none
        self.offsets, self.arena_bytes = static_layout(self.tensors, self.steps, self.workspace_bytes)
        self.arena = device.alloc_arena(self.arena_bytes)
        self._views: dict[str, object] = {}
        self._layer_index = {name: i for i, name in enumerate(graph.layers)}

    def view(self, name: str, shape=None):
        """The device view of tensor ``name`` (reshaped to ``shape`` if given)."""
        v = self._views.get(name)
        if v is None:
            spec = self.tensors[name]
            v = self._views[name] = self.device.view(self.arena, self.offsets[name], spec.shape, spec.dtype)
        if shape is not None and tuple(shape) != tuple(v.shape):
            v = v.reshape(tuple(shape))
        return v

    def step_io(self, step: Step, train: bool, iteration: int, seed: int) -> StepIO:
        g, name = self.graph, step.layer
        layer = g.layers[name]
        shape_of = {i: g.layers[i].out_shape for i in g.inputs[name]}
        io = StepIO(run=self.device.run, train=train)
        io.x = [self.view(g.output_tensor(i), shape_of[i]) for i in g.inputs[name]]
        io.y = self.view(g.output_tensor(name), layer.out_shape)
        io.params = {p: self.view(f"{name}.{p}") for p in layer.params()}
        io.buffers = {b: self.view(f"{name}.{b}") for b in layer.buffers()}
        io.saved = {s: self.view(f"{name}.{s}") for s in layer.saved()}
        io.labels = self.view("labels")
        io.seed = dropout_seed(seed, iteration, self._layer_index[name])
        if step.phase == "backward":
            io.grads = {p: self.view(f"{name}.{p}.grad") for p in layer.params()}
            dys = g.output_grads(name)
            io.dy = self.view(dys[0], layer.out_shape) if dys else None
            io.dx = [self.view(t, shape_of[i]) for t, i in zip(g.input_grads(name), g.inputs[name])]
        return io

    def run_step(self, step: Step, train=True, iteration=0, seed=0, update_running=True) -> None:
        layer = self.graph.layers[step.layer]
        if step.accumulate:  # a fork: sum the consumers' gradients into the first, in order
            first = self.graph.output_grads(step.layer)[0]
            for t in step.accumulate:
                self.device.run("accumulate", self.view(first), self.view(t, self.tensors[first].shape))
        io = self.step_io(step, train, iteration, seed)
        io.update_running = update_running
        (layer.forward if step.phase == "forward" else layer.backward)(io)

    def load_batch(self, x: np.ndarray, labels: np.ndarray | None) -> None:
        data = self.graph.layers["data"]
        x = np.asarray(x, dtype=np.float32)
        if x.shape != data.out_shape:
            raise ValueError(f"input batch has shape {x.shape}, the graph expects {data.out_shape}")
        self.device.write(np.ascontiguousarray(x), self.view("data"))
        if labels is not None:
            labels = np.asarray(labels)
            k = self.graph.num_classes
            if labels.shape != (x.shape[0],) or labels.min() < 0 or labels.max() >= k:
                raise ValueError(f"labels must be {x.shape[0]} integers in [0, {k}); got shape {labels.shape}, "
                                 f"range [{labels.min()}, {labels.max()}]")
            self.device.write(labels.astype(np.int32), self.view("labels"))


__all__ = ["Executor", "dropout_seed", "static_layout", "storage_roots", "nbytes_of"]
