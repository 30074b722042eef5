"""The route compiled into steps: every tensor of one training iteration as a :class:`TensorSpec`
(name, shape, dtype, kind, bytes), and every step of the route as a :class:`Step` naming the tensors it
reads and writes. This is the plain data every planning stage takes; :class:`snlite.graph.Graph` builds
it once per graph (``g.tensors()``, ``g.steps()``).

Each layer declares its tensors by role (``x``, ``y``, ``dy``, ``dx``, ``params``, saved tensors: see
:mod:`snlite.layers_base`); :class:`StepCompiler` turns the roles into names (the naming rules are in
:mod:`snlite.graph`'s docstring) and checks that every step reads only what an earlier step wrote.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from snlite.records import record

KINDS = ("input", "weight", "weight_grad", "buffer", "optimizer", "activation", "gradient")


@functools.cache
def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


_setattr = object.__setattr__  # past a frozen dataclass's own __setattr__, which refuses


@dataclass(frozen=True, init=False)
class TensorSpec:
    """A tensor of the network: its name, shape, dtype, what kind of memory it is, and ``nbytes``, its
    size, worked out once (not a field): planners ask for it hundreds of thousands of times."""

    name: str
    shape: tuple
    dtype: str
    kind: str  # one of KINDS

    def __init__(self, name: str, shape: tuple, dtype: str, kind: str):
        # the dataclass's __init__ and a __post_init__ in one call (a micro-optimisation: a deep net has
        # 127,000 specs), each set as a frozen dataclass sets it, which keeps reading them fast
        _setattr(self, "name", name)
        _setattr(self, "shape", shape)
        _setattr(self, "dtype", dtype)
        _setattr(self, "kind", kind)
        _setattr(self, "nbytes", math.prod(shape) * _itemsize(dtype))


@record
class Step:
    """One step of the route: a layer's forward or backward, and the tensors it touches."""

    index: int
    layer: str
    kind: str
    phase: str  # "forward" | "backward"
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    inplace: tuple[tuple[str, str], ...] = ()  # (written, read): written takes over read's buffer
    accumulate: tuple[str, ...] = ()  # fork gradients summed, in order, into reads' first gradient first

    def __str__(self) -> str:
        return f"{self.index:4d} {self.layer} {self.phase}"


@record
class Compiled:
    """What a graph compiles to, once: the route, every tensor's spec, the 2N steps, and the names
    of each layer's output, of its output's gradients and of its inputs' gradients."""

    route: tuple  # (forward, backward) layer orders (snlite.route)
    tensors: dict  # name -> TensorSpec
    steps: list  # the 2N steps, every forward in route order, then every backward
    outputs: dict  # layer -> the tensor holding its output (a flatten's is its input's)
    output_grads: dict  # layer -> its output's gradients, one per consumer
    input_grads: dict  # (layer, input layer) -> the gradient its backward writes


class StepCompiler:
    """Turns each layer's roles into tensor names and the route into steps, in two passes: forward
    (outputs, parameters, buffers, saved tensors and the forward steps), then backward (gradients and
    the backward steps). Each layer's roles are worked out once, in the first pass, for both steps.
    :meth:`run` returns the :class:`Compiled` graph."""

    def __init__(self, g, succ, route):
        self.g, self.succ, (self.fwd, self.bwd) = g, succ, route
        self.tensors: dict[str, TensorSpec] = {}

    def tensor(self, name, shape, kind, dtype="float32"):
        if name in self.tensors:
            raise ValueError(f"two tensors of the graph are both named {name!r}: rename a layer")
        self.tensors[name] = TensorSpec(name, tuple(shape), dtype, kind)
        return name

    def run(self):
        g, steps = self.g, []
        act, dys, dxs = {}, {}, {}
        roles = {}  # layer -> its tensors by role, and its own "params", "grads" and "buffers"
        for name in self.fwd:  # output names, in forward order (a flatten's is its input's)
            layer = g.layers[name]
            if layer.alias_input:
                act[name] = act[g.inputs[name][0]]
            else:
                kind = "input" if layer.kind == "data" else "activation"
                act[name] = self.tensor(name, layer.out_shape, kind)
            own = roles[name] = {"x": [act[i] for i in g.inputs[name]], "y": [act[name]],
                                 "labels": ["labels"], "params": [], "grads": []}
            for p, shape in layer.params().items():
                own["params"].append(self.tensor(layer.state_name(p), shape, "weight"))
                own["grads"].append(self.tensor(f"{layer.state_name(p)}.grad", shape, "weight_grad"))
            # the parameters the backward reads: all but the bias (dbias needs only dy)
            own["weights"] = [layer.state_name(p) for p in layer.params() if p != "bias"]
            own["buffers"] = [self.tensor(layer.state_name(b), s, "buffer")
                              for b, s in layer.buffers().items()]
            for s, (shape, dtype) in layer.saved().items():
                own[s] = [self.tensor(f"{name}.{s}", shape, "activation", dtype)]
            steps.append(self.forward_step(len(steps), layer, own))
        self.tensor("labels", (g.input_shape[0],), "input", "int32")
        for name in self.bwd:  # gradient names, consumers before producers
            layer = g.layers[name]
            own = roles[name]
            own["dy"] = dys[name] = [dxs[(c, name)] for c in self.succ[name]]
            own["dx"] = []
            for p in g.inputs[name]:  # the gradient of each input: a flatten's is its own output's
                if layer.alias_input:
                    grad = dys[name][0]
                else:
                    tname = f"{p}.grad" if len(self.succ[p]) == 1 else f"{p}.grad@{name}"
                    grad = self.tensor(tname, g.layers[p].out_shape, "gradient")
                dxs[(name, p)] = grad
                own["dx"].append(grad)
            steps.append(self.backward_step(len(steps), layer, own))
        self.check_dataflow(steps)
        clash = next((f"{n}.momentum" for n, t in self.tensors.items()
                      if t.kind == "weight" and f"{n}.momentum" in self.tensors), None)
        if clash:
            raise ValueError(f"a tensor of the graph is named {clash!r}, the name of SGD's momentum buffer "
                             f"for {clash.rsplit('.', 1)[0]}: rename that layer")
        return Compiled((self.fwd, self.bwd), self.tensors, steps, act, dys, dxs)

    def check_dataflow(self, steps) -> None:
        """Every tensor a step reads was written before (or is a weight/buffer): a layer whose
        declarations miss a write would make every memory plan wrong, so fail loudly here."""
        written = {n for n, t in self.tensors.items() if t.kind in ("weight", "buffer")}
        for step in steps:
            if not written.issuperset(step.reads):
                missing = [t for t in step.reads if t not in written]
                raise AssertionError(f"step {step.index} ({step.layer} {step.phase}) reads {missing} before "
                                     f"any step writes them: the {step.kind} layer's declarations "
                                     "are incomplete")
            written.update(step.writes)
            if step.inplace:
                written.update(new for new, _ in step.inplace)

    @staticmethod
    def forward_step(index, layer, roles) -> Step:
        if layer.alias_input:  # flatten: nothing moves
            return Step(index, layer.name, layer.kind, "forward", (), ())
        reads = [t for r in layer.fwd_reads for t in roles[r]] + roles["params"] + roles["buffers"]
        writes = [t for r in layer.fwd_writes for t in roles[r]]
        if layer.kind == "batchnorm":
            writes += roles["buffers"]
        return Step(index, layer.name, layer.kind, "forward", tuple(reads), tuple(writes))

    @staticmethod
    def backward_step(index, layer, roles) -> Step:
        dy = roles["dy"]
        if layer.alias_input:  # flatten: only fork gradients are summed
            return Step(index, layer.name, layer.kind, "backward", tuple(dy), (), accumulate=tuple(dy[1:]))
        reads = [t for r in layer.bwd_reads for t in roles[r]] + roles["weights"]
        writes = [t for r in layer.bwd_writes for t in roles[r]] + roles["grads"]
        inplace = ()
        if layer.bwd_inplace and roles["dx"]:
            inplace = ((roles["dx"][0], (dy or roles["y"])[0]),)
        accumulate = tuple(dy[1:]) if layer.kind != "data" else ()
        return Step(index, layer.name, layer.kind, "backward", tuple(reads), tuple(writes), inplace,
                    accumulate)
