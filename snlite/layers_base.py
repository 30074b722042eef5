"""What every layer is: :class:`Layer`, whose class attributes declare the roles its forward and
backward steps read and write, and :class:`StepIO`, the views a step works on, by role.
:mod:`snlite.layers` explains the roles and holds the registry of layer types.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np


@dataclass
class StepIO:
    """The views one step works on, by role, and how to run kernels (filled in by the executor)."""

    run: object  # run(op_name, *args, **kwargs) on the device and stream of this step
    x: list = field(default_factory=list)
    y: object = None
    dy: object = None
    dx: list = field(default_factory=list)
    params: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)
    labels: object = None
    train: bool = True
    update_running: bool = True  # BatchNorm: False when a forward step is recomputed
    seed: int = 0  # dropout: a 32-bit seed for this layer and iteration
    algo: dict = field(default_factory=dict)  # conv: op -> algorithm ("direct" where absent)
    chunk: dict = field(default_factory=dict)  # conv: op -> images per im2col chunk
    workspace: object = None  # conv: a 1-D float32 view, large enough for the chosen algorithms


class UndeclaredRole(AssertionError):
    """A step used a tensor its layer's declarations do not name (``fwd_reads``, ``bwd_reads``...)."""


class Undeclared:
    """What a step finds in place of a tensor its layer does not declare for that step: any use of
    it raises :class:`UndeclaredRole`. Without it such a read works wherever the tensor happens to be
    resident (the baseline keeps everything) and reads freed or stale memory where liveness, offload
    or recomputation planned by the declarations."""

    def __init__(self, layer, phase: str, role: str, fix: str | None = None):
        reads = f"{type(layer).__name__}.{'fwd' if phase == 'forward' else 'bwd'}_reads"
        self._said = (f"{layer.kind} layer {layer.name!r}: its {phase} uses {role}, which its declarations "
                      f"do not name, so the memory plan need not keep it: "
                      + (fix or f"add {role!r} to {reads}"))

    def __getattr__(self, name):  # .shape, .dtype, a device array's interface: any use at all
        raise UndeclaredRole(self._said)

    def _refuse(self, *args, **kwargs):
        raise UndeclaredRole(self._said)

    __array__ = __getitem__ = __setitem__ = __len__ = __iter__ = _refuse  # np.asarray(t), t[i], len(t)...

    def __repr__(self) -> str:
        return f"<undeclared: {self._said}>"


def declared(layer, phase: str) -> set:
    """The roles a step of ``layer`` may use: its declared reads and writes (saved tensors by their
    names), and the parameters its step reads: all of them forward, the weights (not the bias: dbias
    needs only dy) and their gradients backward."""
    if phase == "forward":
        return {*layer.fwd_reads, *layer.fwd_writes, "params", "buffers"}
    return {*layer.bwd_reads, *layer.bwd_writes, "weights", "grads"}


class Layer:
    """A layer of the graph. Subclasses set the roles below and implement forward/backward."""

    kind: ClassVar[str] = "layer"
    checkpoint: ClassVar[bool] = False  # SuperNeurons keeps checkpoint outputs; cheap layers are recomputed
    n_inputs: ClassVar[int | None] = 1  # None: any number >= 2 (joins)
    fwd_reads: ClassVar[tuple] = ("x",)
    fwd_writes: ClassVar[tuple] = ("y",)
    bwd_reads: ClassVar[tuple] = ("dy",)
    bwd_writes: ClassVar[tuple] = ("dx",)
    bwd_inplace: ClassVar[bool] = False  # dx (of the first input) is written into dy's buffer (softmax: y's)
    alias_input: ClassVar[bool] = False  # the output is the input's storage, reshaped (flatten)
    builder_args: ClassVar[tuple] = ()  # an activation's arguments after x, by PyTorch's names (from_torch)

    def __init__(self, name: str, in_shapes: list[tuple], **attrs):
        self.name = name
        self.in_shapes = [tuple(s) for s in in_shapes]
        self.attrs = attrs
        self.out_shape = self.infer_shape()

    # declarations --------------------------------------------------------------
    def infer_shape(self) -> tuple:
        return self.in_shapes[0]

    def params(self) -> dict[str, tuple]:
        """Learnable parameters, PyTorch's local names (``weight``, ``bias``) -> shape."""
        return {}

    def buffers(self) -> dict[str, tuple]:
        """Non-learnable state kept across iterations (BatchNorm's running statistics)."""
        return {}

    def saved(self) -> dict[str, tuple[tuple, str]]:
        """Tensors the forward writes for the backward to read: local name -> (shape, dtype)."""
        return {}

    def flops(self) -> int:
        """Forward floating-point operations (a multiply-add counts 2)."""
        return math.prod(self.out_shape)

    def workspace_bytes(self, op: str, algo: str, chunk: int = 1) -> int:
        return 0

    def init_params(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {}

    def state_name(self, local: str) -> str:
        """The tensor name (PyTorch's state_dict name) of a parameter or buffer: ``<layer>.<local>``,
        unless the attribute ``names`` gives another (a parameter of the model itself, ViT's
        ``class_token``; MultiheadAttention's ``in_proj_weight``, held by its in-projection's layer)."""
        return self.attrs.get("names", {}).get(local) or f"{self.name}.{local}"

    # execution -----------------------------------------------------------------
    def forward(self, io: StepIO) -> None:
        raise NotImplementedError

    def backward(self, io: StepIO) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name}: {self.in_shapes} -> {self.out_shape}>"


def _uniform_fan_in(rng, shape, fan_in):
    """PyTorch's default init for conv and linear (kaiming_uniform with a=sqrt(5) and its bias)."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    return rng.uniform(-bound, bound, size=shape).astype(np.float32)
