"""The graph builder: any DAG of snlite's layers, with shape inference, the execution route,
and every route step's reads and writes as plain data (compiled by :mod:`snlite.steps`).

    g = Graph(input_shape=(8, 3, 32, 32), num_classes=10)
    x = g.input()
    y = g.relu(g.batchnorm(g.conv2d(x, 16, 3, padding=1)))
    g.softmax_loss(g.linear(g.flatten(g.maxpool(y, 2)), 10))

Tensor names (what the planner and the executor share):
``<layer>`` its output; ``<layer>.weight`` / ``.bias`` / ``.running_mean``... its parameters and
buffers (PyTorch's state_dict names), ``<param>.grad`` their gradients; ``<layer>.<saved>`` the
tensors its forward saves (``bn1.save_mean``); ``<layer>.grad`` the gradient of its output, or one
``<layer>.grad@<consumer>`` per consumer when several layers read it (a fork): the layer's
backward step first sums them, in consumer order, into the first one.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from kernels.lrn import MAX_SIZE as LRN_MAX_SIZE
from snlite.graph_transformer import TransformerBuilders
from snlite.layers import LAYER_TYPES, Layer
from snlite.checks import check_number, int_pair, integer, is_int, pool_args, who
from snlite.records import record, without_cycle_collection
from snlite.route import execution_route
from snlite.steps import Compiled, Step, StepCompiler, TensorSpec

RESERVED_CHARS = "@#:"  # in tensor names snlite makes: grad@consumer, relu1#r2 (a recomputed copy), data:in
PREFIX = {"conv2d": "conv", "linear": "fc", "batchnorm": "bn", "dropout": "drop", "softmax_loss": "softmax",
          "relu6": "relu6_", "layernorm": "ln"}


@record
class Node:
    """What a builder method returns: a layer's output, to pass to the next layer."""

    graph: "Graph"
    name: str
    shape: tuple

    def __repr__(self) -> str:
        return f"Node({self.name!r}, shape={self.shape})"


class Graph(TransformerBuilders):
    """A network under construction; see the module docstring (a vision transformer's builder methods:
    :mod:`snlite.graph_transformer`)."""

    def __init__(self, input_shape, num_classes: int, name: str = "net"):
        try:
            shape = tuple(input_shape)
        except TypeError:
            shape = ()
        if len(shape) not in (2, 4) or not all(is_int(s) and s >= 1 for s in shape):
            raise ValueError(f"input_shape must be (N, C, H, W) or (N, features) of positive integers, "
                             f"got {input_shape!r}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self.input_shape = tuple(int(s) for s in shape)
        self.num_classes, self.name = integer(num_classes, "num_classes", 2), name
        self._layers: dict[str, Layer] = {}
        self._inputs: dict[str, list[str]] = {}
        # read-only views: a graph changes only through its builders, which drop what was compiled from
        # it (an edit of layers by hand left the cached steps of the old graph to plan with)
        self.layers: Mapping[str, Layer] = MappingProxyType(self._layers)
        self.inputs: Mapping[str, list[str]] = MappingProxyType(self._inputs)
        self._counts: dict[str, int] = {}
        self._loss: str | None = None
        self._cache = None

    def __getstate__(self) -> dict:  # copy and pickle the dicts, not their read-only views
        return {k: v for k, v in self.__dict__.items() if k not in ("layers", "inputs")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.layers, self.inputs = MappingProxyType(self._layers), MappingProxyType(self._inputs)

    # building -------------------------------------------------------------------
    def _add(self, kind: str, inputs, name, **attrs) -> Node:
        if kind not in LAYER_TYPES:
            raise ValueError(f"unknown layer type {kind!r}; known: {sorted(LAYER_TYPES)}")
        if self.loss_layer is not None:
            raise ValueError(f"cannot add {who(kind, name)} after softmax_loss: the loss must be "
                             "the last layer")
        in_names, in_shapes = [], []
        for n in inputs:
            if not isinstance(n, Node) or n.graph is not self:
                raise ValueError(f"{who(kind, name)}: inputs must be nodes returned by this "
                                 f"graph, got {n!r}")
            in_names.append(n.name)
            in_shapes.append(n.shape)
        if len(in_names) > 1 and len(set(in_names)) != len(in_names):
            raise ValueError(f"{who(kind, name)}: the same tensor appears twice among its inputs "
                             f"{in_names}")
        if name is None:  # conv1, conv2, bn1, relu1...
            name = self._numbered(PREFIX.get(kind, kind))
        if not isinstance(name, str) or not name or any(c in name for c in RESERVED_CHARS):
            raise ValueError(f"layer name {name!r}: a name is a non-empty string without '@', '#' or ':' "
                             "(snlite's own names use them: fork gradients, recomputed copies, pinned slots)")
        if name in self.layers:
            raise ValueError(f"layer name {name!r} is already used by a {self.layers[name].kind} layer: give "
                             f"this {kind} another name (or leave name out for a numbered one)")
        layer = LAYER_TYPES[kind](name, in_shapes, **attrs)
        self._layers[name] = layer
        self._inputs[name] = in_names
        if kind == "softmax_loss":
            self._loss = name
        self._cache = None
        return Node(self, name, layer.out_shape)

    def _numbered(self, prefix: str) -> str:
        """The next free name ``<prefix><k>``."""
        self._counts[prefix] = self._counts.get(prefix, 0) + 1
        while f"{prefix}{self._counts[prefix]}" in self.layers:
            self._counts[prefix] += 1
        return f"{prefix}{self._counts[prefix]}"

    def input(self) -> Node:
        """The data layer (created on the first call)."""
        if "data" in self.layers:
            return Node(self, "data", self.layers["data"].out_shape)
        return self._add("data", [], "data", shape=self.input_shape)

    def conv2d(self, x, out_channels, kernel, stride=1, padding=0, bias=True, groups=1, name=None) -> Node:
        """PyTorch's Conv2d; ``groups`` divides the input and output channels (groups=C: depthwise)."""
        what = who("conv2d", name)
        groups = integer(groups, f"{what}: groups")
        # groups=1 is left out of the attributes: a plain conv's layer stays as it always was
        return self._add("conv2d", [x], name, out_channels=integer(out_channels, f"{what}: out_channels"),
                         kernel=int_pair(kernel, f"{what}: kernel"),
                         stride=int_pair(stride, f"{what}: stride"),
                         padding=int_pair(padding, f"{what}: padding", 0), bias=bool(bias),
                         **({"groups": groups} if groups > 1 else {}))

    def pointwise_linear(self, x, out_features, bias=True, name=None) -> Node:
        """A Linear applied to every pixel's channels of an (N, C, H, W) map (PyTorch's Linear after a
        permute to (N, H, W, C), as in ConvNeXt's blocks): a 1x1 convolution whose weight is stored as
        the Linear's, (out_features, C)."""
        what = who("conv2d", name)
        if isinstance(x, Node) and len(x.shape) != 4:
            raise ValueError(f"{what}: pointwise_linear takes an (N, C, H, W) input, got {x.shape}; a Linear "
                             "of (N, features) is g.linear(x, out_features)")
        return self._add("conv2d", [x], name, out_channels=integer(out_features, f"{what}: out_features"),
                         kernel=(1, 1), stride=(1, 1), padding=(0, 0), bias=bool(bias), linear_weight=True)

    def linear(self, x, out_features, bias=True, name=None) -> Node:
        """PyTorch's Linear on (N, features): its weight (out_features, features), as PyTorch stores it."""
        out_features = integer(out_features, f"{who('linear', name)}: out_features")
        return self._add("linear", [x], name, out_features=out_features, bias=bool(bias))

    def relu(self, x, name=None) -> Node:
        """PyTorch's ReLU: max(x, 0)."""
        return self._add("relu", [x], name)

    def relu6(self, x, name=None) -> Node:
        """PyTorch's ReLU6: min(max(x, 0), 6) (MobileNet's activation)."""
        return self._add("relu6", [x], name)

    def leaky_relu(self, x, negative_slope=0.01, name=None) -> Node:
        """PyTorch's LeakyReLU: x where x > 0, else negative_slope times x."""
        slope = check_number(negative_slope, f"{who('leaky_relu', name)}: negative_slope")
        return self._add("leaky_relu", [x], name, negative_slope=slope)

    def sigmoid(self, x, name=None) -> Node:
        """PyTorch's Sigmoid (squeeze-and-excitation's gate)."""
        return self._add("sigmoid", [x], name)

    def tanh(self, x, name=None) -> Node:
        """PyTorch's Tanh."""
        return self._add("tanh", [x], name)

    def gelu(self, x, name=None) -> Node:
        """PyTorch's GELU, exact (approximate="none")."""
        return self._add("gelu", [x], name)

    def gelu_tanh(self, x, name=None) -> Node:
        """PyTorch's GELU with its tanh approximation (approximate="tanh", as in GPT-2 and BERT)."""
        return self._add("gelu_tanh", [x], name)

    def silu(self, x, name=None) -> Node:
        """PyTorch's SiLU, x * sigmoid(x) (EfficientNet's activation)."""
        return self._add("silu", [x], name)

    def hardsigmoid(self, x, name=None) -> Node:
        """PyTorch's Hardsigmoid, min(max(x + 3, 0), 6) / 6 (MobileNet-V3's gate)."""
        return self._add("hardsigmoid", [x], name)

    def hardswish(self, x, name=None) -> Node:
        """PyTorch's Hardswish, x * hardsigmoid(x) (MobileNet-V3's activation)."""
        return self._add("hardswish", [x], name)

    def elu(self, x, alpha=1.0, name=None) -> Node:
        """PyTorch's ELU: x where x > 0, else alpha (exp(x) - 1)."""
        return self._add("elu", [x], name, alpha=check_number(alpha, f"{who('elu', name)}: alpha"))

    def selu(self, x, name=None) -> Node:
        """PyTorch's SELU (self-normalizing: a scaled ELU with fixed constants)."""
        return self._add("selu", [x], name)

    def celu(self, x, alpha=1.0, name=None) -> Node:
        """PyTorch's CELU: x where x > 0, else alpha (exp(x / alpha) - 1); alpha must not be 0."""
        alpha = check_number(alpha, f"{who('celu', name)}: alpha")
        if alpha == 0:
            raise ValueError(f"{who('celu', name)}: alpha must not be 0 (CELU divides x by it)")
        return self._add("celu", [x], name, alpha=alpha)

    def softplus(self, x, beta=1.0, threshold=20.0, name=None) -> Node:
        """PyTorch's Softplus: log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""
        what = who("softplus", name)
        beta = check_number(beta, f"{what}: beta")
        if beta == 0:
            raise ValueError(f"{what}: beta must not be 0 (Softplus divides by it)")
        threshold = check_number(threshold, f"{what}: threshold")
        return self._add("softplus", [x], name, beta=beta, threshold=threshold)

    def mish(self, x, name=None) -> Node:
        """PyTorch's Mish: x tanh(softplus(x))."""
        return self._add("mish", [x], name)

    def narrow(self, x, start, size, name=None) -> Node:
        """Channels [start, start + size) of x: a part of PyTorch's ``x.chunk(k, dim=1)``."""
        what = who("narrow", name)
        return self._add("narrow", [x], name, start=integer(start, f"{what}: start", 0),
                         size=integer(size, f"{what}: size"))

    def channel_shuffle(self, x, groups, name=None) -> Node:
        """ShuffleNet's channel shuffle of x's channels in ``groups`` groups."""
        groups = integer(groups, f"{who('channel_shuffle', name)}: groups")
        return self._add("channel_shuffle", [x], name, groups=groups)

    def channel_scale(self, x, gate, name=None) -> Node:
        """x (N, C, H, W) times gate (N, C, 1, 1), channel by channel: squeeze-and-excitation's scale."""
        return self._add("channel_scale", [x, gate], name)

    def maxpool(self, x, kernel, stride=None, padding=0, ceil_mode=False, name=None) -> Node:
        """PyTorch's MaxPool2d (``ceil_mode`` as its, SqueezeNet's and GoogLeNet's)."""
        return self._add("maxpool", [x], name,
                         **pool_args("maxpool", name, kernel, stride, padding, ceil_mode))

    def avgpool(self, x, kernel, stride=None, padding=0, count_include_pad=True, ceil_mode=False,
                name=None) -> Node:
        """PyTorch's AvgPool2d (``count_include_pad`` and ``ceil_mode`` as its)."""
        return self._add("avgpool", [x], name,
                         **pool_args("avgpool", name, kernel, stride, padding, ceil_mode),
                         count_include_pad=bool(count_include_pad))

    def batchnorm(self, x, eps=1e-5, momentum=0.1, name=None) -> Node:
        """PyTorch's BatchNorm2d (BatchNorm1d on (N, features)): the batch's statistics, running ones kept."""
        what = who("batchnorm", name)
        return self._add("batchnorm", [x], name, eps=check_number(eps, f"{what}: eps", 0.0),
                         momentum=check_number(momentum, f"{what}: momentum", 0.0, 1.0))

    def layernorm(self, x, eps=1e-5, name=None) -> Node:
        """PyTorch's LayerNorm over the channels of an (N, C, H, W) map: each pixel normalized across
        its C channels, then scaled and shifted per channel (ConvNeXt's, ``eps=1e-6`` there)."""
        return self._add("layernorm", [x], name, eps=check_number(eps, f"{who('layernorm', name)}: eps", 0.0))

    def layer_scale(self, x, init=1e-6, param="layer_scale", name=None) -> Node:
        """ConvNeXt's layer scale: x times a learned per-channel parameter (C, 1, 1) named ``param``
        (``<layer>.layer_scale`` in the state_dict, as torchvision's), starting at ``init``."""
        what = who("layer_scale", name)
        if not isinstance(param, str) or not param.isidentifier() or param == "bias":
            raise ValueError(f"{what}: param must name the parameter (an identifier other than 'bias', "
                             f"e.g. 'layer_scale' or 'gamma'), got {param!r}")
        return self._add("layer_scale", [x], name, init=check_number(init, f"{what}: init"), param=param)

    def lrn(self, x, size=5, alpha=1e-4, beta=0.75, k=1.0, name=None) -> Node:
        """PyTorch's LocalResponseNorm across ``size`` channels (AlexNet's)."""
        what = who("lrn", name)
        size = integer(size, f"{what}: size")
        if size > LRN_MAX_SIZE:
            raise ValueError(f"{what}: size must be at most {LRN_MAX_SIZE} (the kernel's window), got {size}")
        return self._add("lrn", [x], name, size=size, alpha=check_number(alpha, f"{what}: alpha", 0.0),
                         beta=check_number(beta, f"{what}: beta"),
                         k=check_number(k, f"{what}: k", 0.0, open_low=True))

    def dropout(self, x, p=0.5, name=None) -> Node:
        """PyTorch's Dropout: each value zeroed with probability p, the rest scaled by 1 / (1 - p)."""
        p = check_number(p, f"{who('dropout', name)}: p", 0.0, 1.0, open_high=True)
        return self._add("dropout", [x], name, p=p)

    def dropout2d(self, x, p=0.5, name=None) -> Node:
        """PyTorch's Dropout2d: each channel of each image dropped whole with probability p."""
        p = check_number(p, f"{who('dropout2d', name)}: p", 0.0, 1.0, open_high=True)
        return self._add("dropout2d", [x], name, p=p)

    def add(self, *xs, name=None) -> Node:
        """The sum of two or more maps of one shape (a residual join), as nodes or one list of them."""
        xs = list(xs[0]) if len(xs) == 1 and isinstance(xs[0], (list, tuple)) else list(xs)
        if len(xs) < 2:
            raise ValueError(f"{who('add', name)}: needs at least two inputs, got {len(xs)}")
        return self._add("add", xs, name)

    def concat(self, xs, name=None) -> Node:
        """torch.cat of a list of maps over the channels (Inception's and DenseNet's joins)."""
        if isinstance(name, Node):  # g.concat(a, b): the second node taken for the name
            raise ValueError("concat takes its inputs as one list: g.concat([a, b, ...]), not g.concat(a, b)")
        if not isinstance(xs, (list, tuple)):
            raise ValueError(f"{who('concat', name)}: expected a list of nodes, got {xs!r}")
        if len(xs) < 2:
            raise ValueError(f"{who('concat', name)}: needs at least two inputs, got {len(xs)}")
        return self._add("concat", list(xs), name)

    def flatten(self, x, name=None) -> Node:
        """torch.flatten(x, 1): (N, C, H, W) as (N, C * H * W), the same storage."""
        return self._add("flatten", [x], name)

    def softmax_loss(self, y, name="softmax") -> Node:
        """CrossEntropyLoss (mean over the batch) of the logits ``y`` (N, classes): the last layer."""
        return self._add("softmax_loss", [y], name, num_classes=self.num_classes)

    # what was built -----------------------------------------------------------------
    @property
    def loss_layer(self) -> str | None:
        """The softmax_loss layer's name (None until it is added)."""
        return self._loss

    def consumers(self) -> dict[str, list[str]]:
        """layer -> the layers that read its output, in the order they were added."""
        out = {name: [] for name in self.layers}
        for name, ins in self.inputs.items():
            for i in ins:
                out[i].append(name)
        return out

    def route(self) -> tuple[list[str], list[str]]:
        """(forward, backward) layer orders of Algorithm 1 (see :mod:`snlite.route`)."""
        return self._compiled().route

    def tensors(self) -> dict[str, TensorSpec]:
        """Every tensor of one training iteration, by name."""
        return self._compiled().tensors

    def steps(self) -> list[Step]:
        """The 2N route steps: every layer's forward in route order, then every backward."""
        return self._compiled().steps

    def output_tensor(self, name: str) -> str:
        """The tensor holding layer ``name``'s output (a flatten's is its input's, reshaped)."""
        return self._compiled().outputs[name]

    def output_grads(self, name: str) -> list[str]:
        """The gradients of ``name``'s output, one per consumer; its backward sums them into the first."""
        return self._compiled().output_grads[name]

    def input_grads(self, name: str) -> list[str]:
        """The gradient tensors ``name``'s backward writes, one per input."""
        grads = self._compiled().input_grads
        return [grads[(name, i)] for i in self.inputs[name]]

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, input {self.input_shape}, {len(self.layers)} layers, "
                f"{self.num_classes} classes)")

    def param_count(self) -> int:
        """The number of learnable parameters (PyTorch's sum of numel over parameters())."""
        return sum(math.prod(s) for l in self.layers.values() for s in l.params().values())

    def flops(self) -> int:
        """Forward FLOPs of one batch."""
        return sum(l.flops() for l in self.layers.values())

    def summary(self) -> str:
        """A table of the layers in route order: kind, output shape, parameters, checkpoint."""
        rows = [f"{'layer':24} {'kind':13} {'output':22} {'params':>12}  checkpoint"]
        for name in self.route()[0]:
            l = self.layers[name]
            p = sum(math.prod(s) for s in l.params().values())
            rows.append(f"{name:24} {l.kind:13} {str(l.out_shape):22} {p:12,d}  "
                        f"{'yes' if l.checkpoint else ''}")
        rows.append(f"{len(self.layers)} layers, {self.param_count():,d} parameters, {self.flops():,d} "
                    "forward FLOPs")
        return "\n".join(rows)

    # compiling roles into names ----------------------------------------------------
    def _compiled(self) -> Compiled:
        if self._cache is None:
            if self.loss_layer is None:
                raise ValueError("the graph has no softmax_loss layer: end it with g.softmax_loss(logits)")
            with without_cycle_collection():  # tens of thousands of specs and steps, and no cycle among them
                succ = self.consumers()
                route = execution_route(succ, "data")
                self._cache = StepCompiler(self, succ, route).run()
        return self._cache


def graph_of(graph) -> Graph:
    """``graph``, refused unless it is a :class:`Graph` (a model's name or a PyTorch module is not)."""
    if not isinstance(graph, Graph):
        raise ValueError(f"graph must be a snlite.Graph, got {type(graph).__name__} {graph!r:.60}; build one "
                         "with snlite.models.get_model(NAME, batch), snlite.Graph(...) or "
                         "snlite.from_torch(module, input_shape)")
    return graph
