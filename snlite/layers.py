"""Layers: what each one computes, and what each route step reads and writes, declared as data.

Each layer class states, as class attributes, the *roles* its forward and backward steps read
and write, following cuDNN's conventions as the paper did (docs/paper.md section 1):

- ReLU, pooling and LRN backward read x, y and dy; conv and linear backward read x and dy.
- ReLU and LRN backward write dx into dy's buffer (``bwd_inplace``), softmax's into y's (it has
  no dy: the loss starts backward there); ReLU forward is not in place; dropout backward writes a
  separate dx, as cuDNN's does.
- Dropout backward reads only dy: its mask is a hash of (seed, element), drawn again from the
  forward's seed, so nothing of dropout is saved between forward and backward.

Roles are ``x`` (every input), ``y`` (the output), ``dy`` (the output's gradient), ``dx`` (every
input's gradient), ``labels``, and the layer's own ``saved`` tensors (e.g. BatchNorm's batch mean);
parameters are read by both steps and their gradients written by the backward step; buffers
(BatchNorm's running statistics) are read and written by the training forward.
:class:`snlite.graph.Graph` turns roles into tensor names; the executor turns names into views
and calls :meth:`Layer.forward` / :meth:`Layer.backward` with them.

This module holds the layers that compute features and the registry of every layer type
(``LAYER_TYPES``); :class:`Layer` and :class:`StepIO` are in :mod:`snlite.layers_base`, the data,
loss, join and flatten layers in :mod:`snlite.layers_structural`, the normalizations (batch, layer,
local response) and the layer scale in :mod:`snlite.layers_norm`, the activations in
:mod:`snlite.layers_activation`, a vision transformer's attention and token layers in
:mod:`snlite.layers_attention`. All are importable from here.
"""
from __future__ import annotations

import math

from kernels.conv import check_groups
from kernels.conv import output_shape as conv_output_shape, workspace_bytes as conv_workspace_bytes
from kernels.pooling import pool_output_shape
from snlite.layers_activation import (ACTIVATIONS, CELU, ELU, GELU, SELU, GELUTanh, Hardsigmoid,  # noqa: F401
                                      Hardswish, LeakyReLU, Mish, ReLU, ReLU6, Sigmoid, SiLU, Softplus, Tanh)
from snlite.layers_attention import (Attention, ClassToken, PatchMerge, PositionEmbedding, TokenSelect,
                                     WindowAttention)
from snlite.layers_base import Layer, StepIO, _uniform_fan_in
from snlite.layers_norm import LRN, BatchNorm2d, LayerNorm, LayerScale
from snlite.layers_structural import Add, ChannelShuffle, Concat, Data, Flatten, Narrow, SoftmaxLoss


class Conv2d(Layer):
    """PyTorch's Conv2d (no dilation). ``groups`` (attribute, default 1) splits the channels into
    groups convolved separately: the weight is (out_channels, in_channels / groups, KH, KW), as
    PyTorch's; groups = in_channels is a depthwise convolution. ``linear_weight`` (attribute, 1x1
    only): the weight is stored (out_channels, in_channels), as a Linear's, for a Linear applied to
    every pixel's channels (ConvNeXt's, after its permute to (N, H, W, C)); the kernels see it as
    (out, in, 1, 1), the same bytes."""

    kind = "conv2d"
    checkpoint = True
    bwd_reads = ("x", "dy")

    @property
    def groups(self) -> int:
        return self.attrs.get("groups", 1)

    def infer_shape(self):
        a = self.attrs
        x = self.in_shapes[0]
        if len(x) != 4:
            raise ValueError(f"conv2d {self.name!r}: expected an (N, C, H, W) input, got {x}")
        try:
            groups = check_groups(x[1], a["out_channels"], self.groups)
            self.w_shape = (a["out_channels"], x[1] // groups) + a["kernel"]
            return tuple(conv_output_shape(x, self.w_shape, a["stride"], a["padding"], groups))
        except ValueError as e:
            raise ValueError(f"conv2d {self.name!r}: {str(e).removeprefix('conv2d: ')}") from None

    def params(self):
        p = {"weight": self.w_shape[:2] if self.attrs.get("linear_weight") else self.w_shape}
        if self.attrs["bias"]:
            p["bias"] = (self.w_shape[0],)
        return p

    def flops(self):
        return 2 * math.prod(self.out_shape) * math.prod(self.w_shape[1:])

    def workspace_bytes(self, op, algo, chunk=1):
        a = self.attrs
        return conv_workspace_bytes(op, algo, self.in_shapes[0], self.w_shape, a["stride"],
                                    a["padding"], chunk, groups=self.groups)

    def init_params(self, rng):
        fan_in = math.prod(self.w_shape[1:])
        return {k: _uniform_fan_in(rng, s, fan_in) for k, s in self.params().items()}

    def _conv_kw(self, io, op):
        a = self.attrs
        kw = dict(stride=a["stride"], padding=a["padding"], algo=io.algo.get(op, "direct"),
                  workspace=io.workspace, chunk=io.chunk.get(op, 1))
        if self.groups > 1:  # the kernels' default is 1: a plain conv's calls stay as they were
            kw["groups"] = self.groups
        return kw

    def forward(self, io):
        io.run("conv2d_forward", io.x[0], self._4d(io.params), io.y, **self._conv_kw(io, "forward"))
        if "bias" in io.params:
            io.run("bias_add", io.y, io.params["bias"])

    def backward(self, io):
        io.run("conv2d_backward_filter", io.x[0], io.dy, self._4d(io.grads),
               **self._conv_kw(io, "backward_filter"))
        if "bias" in io.grads:
            io.run("bias_backward", io.dy, io.grads["bias"])
        io.run("conv2d_backward_data", io.dy, self._4d(io.params), io.dx[0],
               **self._conv_kw(io, "backward_data"))

    def _4d(self, views):
        """The weight (or its gradient) as the kernels take it: a ``linear_weight``'s (out, in) view
        reshaped to (out, in, 1, 1), no copy."""
        w = views["weight"]
        return w.reshape(self.w_shape) if self.attrs.get("linear_weight") else w


class Linear(Layer):
    """PyTorch's Linear on an (N, in_features) input. Like PyTorch's, it does not flatten: a 4-D
    input is an error that says to add ``g.flatten`` (Caffe's InnerProduct flattened silently)."""

    kind = "linear"
    checkpoint = True
    bwd_reads = ("x", "dy")

    def infer_shape(self):
        x = self.in_shapes[0]
        if len(x) != 2:
            raise ValueError(f"linear {self.name!r}: expected an (N, in_features) input, got shape {x}; "
                             "flatten it first: g.linear(g.flatten(x), ...) (PyTorch's Linear "
                             "does not flatten)")
        self.in_features = x[1]
        return (x[0], self.attrs["out_features"])

    def params(self):
        p = {"weight": (self.attrs["out_features"], self.in_features)}
        if self.attrs["bias"]:
            p["bias"] = (self.attrs["out_features"],)
        return p

    def flops(self):
        return 2 * self.out_shape[0] * self.in_features * self.out_shape[1]

    def init_params(self, rng):
        return {k: _uniform_fan_in(rng, s, self.in_features) for k, s in self.params().items()}

    def forward(self, io):
        io.run("linear_forward", io.x[0], io.params["weight"], io.y)
        if "bias" in io.params:
            io.run("bias_add", io.y, io.params["bias"])

    def backward(self, io):
        io.run("linear_backward_filter", io.x[0], io.dy, io.grads["weight"])
        if "bias" in io.grads:
            io.run("bias_backward", io.dy, io.grads["bias"])
        io.run("linear_backward_data", io.dy, io.params["weight"], io.dx[0])


class ChannelScale(Layer):
    """Squeeze-and-excitation's last step: x (N, C, H, W) times a gate (N, C, 1, 1), each channel of
    each image by its own number. Its backward reads both inputs: the gate's gradient is dy * x summed
    over (h, w). A checkpoint, as a residual Add is: rebuilding it would need both inputs kept."""

    kind = "channel_scale"
    checkpoint = True
    n_inputs = 2
    bwd_reads = ("x", "dy")

    def infer_shape(self):
        x, gate = self.in_shapes
        if len(x) != 4 or gate != (x[0], x[1], 1, 1):
            raise ValueError(f"channel_scale {self.name!r}: expected an (N, C, H, W) input and an "
                             f"(N, C, 1, 1) gate, got {x} and {gate}")
        return x

    def forward(self, io):
        io.run("channel_scale_forward", io.x[0], io.x[1], io.y)

    def backward(self, io):
        io.run("channel_scale_backward", io.x[0], io.x[1], io.dy, io.dx[0], io.dx[1])


class _Pool(Layer):
    """Max or average pooling; ``ceil_mode`` (attribute, default False) counts the windows as
    PyTorch's ceil mode does (kernels.pooling), the last ones running off the end of the input."""

    bwd_reads = ("x", "y", "dy")  # cuDNN's pooling backward reads all three

    def infer_shape(self):
        a = self.attrs
        try:
            return tuple(pool_output_shape(self.in_shapes[0], a["kernel"], a["stride"],
                                           a["padding"], op=self.kind, ceil_mode=a.get("ceil_mode", False)))
        except ValueError as e:
            raise ValueError(f"{self.kind} {self.name!r}: {e}") from None

    def flops(self):
        k = self.attrs["kernel"]
        return math.prod(self.out_shape) * (k[0] * k[1] if isinstance(k, tuple) else k * k)

    def _kw(self):
        a = self.attrs
        kw = dict(kernel=a["kernel"], stride=a["stride"], padding=a["padding"])
        if a.get("ceil_mode"):  # the kernels' default is floor mode: a floor-mode layer's calls stay the same
            kw["ceil_mode"] = True
        return kw


class MaxPool2d(_Pool):
    kind = "maxpool"

    def forward(self, io):
        io.run("maxpool2d_forward", io.x[0], io.y, **self._kw())

    def backward(self, io):
        io.run("maxpool2d_backward", io.x[0], io.y, io.dy, io.dx[0], **self._kw())


class AvgPool2d(_Pool):
    kind = "avgpool"

    def _kw(self):
        return dict(super()._kw(), count_include_pad=self.attrs["count_include_pad"])

    def forward(self, io):
        io.run("avgpool2d_forward", io.x[0], io.y, **self._kw())

    def backward(self, io):
        io.run("avgpool2d_backward", io.dy, io.dx[0], **self._kw())


class Dropout(Layer):
    """PyTorch's inverted dropout. The mask is a hash of (seed, element): the forward and the
    backward draw it from the same per-layer, per-iteration seed (``io.seed``), so no mask is
    stored, and a recomputed forward draws it again bit for bit. The backward writes a separate
    dx, as cuDNN's does (the paper's accounting)."""

    kind = "dropout"
    bwd_reads = ("dy",)

    def forward(self, io):
        if io.train:
            io.run("dropout_forward", io.x[0], io.y, p=self.attrs["p"], seed=io.seed, **self._group())
        else:
            io.run("copy", io.x[0], io.y)

    def backward(self, io):
        io.run("dropout_backward", io.dy, io.dx[0], p=self.attrs["p"], seed=io.seed, **self._group())

    def _group(self) -> dict:
        return {}


class Dropout2d(Dropout):
    """PyTorch's Dropout2d: whole channels dropped, one decision per image and channel (the mask's
    hash drawn at (n, c): ``group`` H * W in ``kernels.dropout``), the rest scaled by 1 / (1 - p)."""

    kind = "dropout2d"

    def infer_shape(self):
        x = self.in_shapes[0]
        if len(x) != 4:
            raise ValueError(f"dropout2d {self.name!r}: expected an (N, C, H, W) input (it drops whole "
                             f"channels), got {x}; for (N, features) use g.dropout")
        return x

    def _group(self) -> dict:
        return {"group": self.out_shape[2] * self.out_shape[3]}


# every layer type, by kind (the activation classes are imported above to be named here too: __all__)
LAYER_TYPES = {cls.kind: cls for cls in (Data, Conv2d, Linear, *ACTIVATIONS, MaxPool2d, AvgPool2d,
                                          BatchNorm2d, LayerNorm, LayerScale, LRN, Dropout, Dropout2d,
                                          ChannelScale, Add, Concat, Narrow, ChannelShuffle, Flatten,
                                          SoftmaxLoss, Attention, ClassToken, PositionEmbedding, TokenSelect,
                                          WindowAttention, PatchMerge)}

__all__ = ["LAYER_TYPES", "Layer", "StepIO"] + [c.__name__ for c in LAYER_TYPES.values()]
