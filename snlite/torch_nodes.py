"""fx nodes into snlite layers, for :func:`snlite.torch_import.from_torch`: what each node of a traced
module is (a kind of snlite layer and its hyper-parameters, :func:`_describe`), which hyper-parameters
snlite's layers do not have yet (``NOT_YET``, the one place to extend when a layer learns them), the
walk that adds one layer per node and checks its shape against PyTorch's (:class:`Importer`), and the
one-line error that refuses a node snlite cannot import (:func:`refuse`). torch is imported only inside
:func:`_describe`, which looks a node's module up in torch.nn: snlite itself never needs it.
"""
from __future__ import annotations

import operator

from snlite.graph import Graph

SUPPORTED = ("modules Conv2d (grouped and depthwise too), Linear, BatchNorm2d, ReLU, ReLU6, LeakyReLU, "
             "Sigmoid, Tanh, SiLU, Hardsigmoid, Hardswish, GELU, MaxPool2d, AvgPool2d (ceil mode too), "
             "AdaptiveAvgPool2d (where it is the identity or its windows tile the input), LocalResponseNorm, "
             "Dropout, Flatten, Identity; functions relu, relu6, leaky_relu, sigmoid, tanh, silu, "
             "hardsigmoid, hardswish, gelu, + / torch.add, * / torch.mul of a feature map by a per-channel "
             "gate (N, C, 1, 1), torch.cat and x.chunk over channels, ShuffleNet's channel_shuffle, "
             "torch.flatten(x, 1), x.mean over (H, W), "
             "max_pool2d, avg_pool2d, adaptive_avg_pool2d, dropout, and stochastic depth with p=0; one "
             "input, logits (N, classes) out")

# hyper-parameters snlite's layers do not have yet: kind -> {attribute: the only value supported}
NOT_YET = {
    "conv2d": {"dilation": (1, 1), "padding_mode": "zeros"},
    "maxpool": {"dilation": (1, 1), "return_indices": False},
    "avgpool": {"divisor_override": None},
    "batchnorm": {"affine": True, "track_running_stats": True},
    "gelu": {"approximate": "none"},
}


class TorchImportError(ValueError):
    """A module snlite cannot import, and why: the node, its op, where it sits, what is supported."""


def _where(node) -> str:
    """Where ``node`` sits: the submodule it calls, or the module whose forward called it."""
    if node.op == "call_module":
        return node.target
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def refuse(node, reason: str) -> TorchImportError:
    """The error that refuses ``node``: which fx node, its op and target, where in the model it sits,
    why, and what snlite imports."""
    target = getattr(node.target, "__name__", node.target)
    where = _where(node)
    return TorchImportError(f"cannot import fx node {node.name!r} ({node.op} {target}) in "
                            f"{where or 'the model forward itself'}: {reason}. snlite imports {SUPPORTED}")


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _bind(node, names_defaults, first=1):
    """The hyper-parameters of a call: ``node``'s arguments after the first ``first`` (the tensors)
    by position or keyword, named as the module's attributes, with PyTorch's defaults."""
    args, out = node.args[first:], {}
    for i, (k, default) in enumerate(names_defaults):
        out[k] = args[i] if i < len(args) else node.kwargs.get(k, default)
    return out


POOL_ARGS = {"maxpool": (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1),
                         ("ceil_mode", False), ("return_indices", False)),
             "avgpool": (("kernel_size", None), ("stride", None), ("padding", 0), ("ceil_mode", False),
                         ("count_include_pad", True), ("divisor_override", None))}


def _describe(node, gm):
    """(kind, hyper-parameters, inputs, in_place) of a call node, or a TorchImportError."""
    import torch
    import torch.nn.functional as F

    nn = torch.nn
    tensors = [a for a in node.args if hasattr(a, "op")]
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        attrs = {k: getattr(m, k) for k in ("kernel_size", "stride", "padding", "dilation", "ceil_mode",
                                            "return_indices", "count_include_pad", "divisor_override")
                 if hasattr(m, k)}
        table = [(nn.Conv2d, "conv2d", lambda: dict(out_channels=m.out_channels, kernel_size=m.kernel_size,
                                                    stride=m.stride, padding=m.padding, dilation=m.dilation,
                                                    groups=m.groups, padding_mode=m.padding_mode,
                                                    bias=m.bias is not None)),
                 (nn.Linear, "linear", lambda: dict(out_features=m.out_features, bias=m.bias is not None)),
                 (nn.BatchNorm2d, "batchnorm", lambda: dict(eps=m.eps, momentum=m.momentum, affine=m.affine,
                                                            track_running_stats=m.track_running_stats)),
                 (nn.ReLU, "relu", lambda: dict(inplace=m.inplace)),
                 (nn.ReLU6, "relu6", lambda: dict(inplace=m.inplace)),
                 (nn.LeakyReLU, "leaky_relu", lambda: dict(negative_slope=m.negative_slope)),
                 (nn.Sigmoid, "sigmoid", dict), (nn.Tanh, "tanh", dict), (nn.SiLU, "silu", dict),
                 (nn.Hardsigmoid, "hardsigmoid", dict), (nn.Hardswish, "hardswish", dict),
                 (nn.GELU, "gelu", lambda: dict(approximate=m.approximate)),
                 (nn.MaxPool2d, "maxpool", lambda: attrs), (nn.AvgPool2d, "avgpool", lambda: attrs),
                 (nn.AdaptiveAvgPool2d, "adaptive_avgpool", dict),
                 (nn.LocalResponseNorm, "lrn", lambda: dict(size=m.size, alpha=m.alpha, beta=m.beta, k=m.k)),
                 (nn.Dropout, "dropout", lambda: dict(p=m.p, inplace=m.inplace)),
                 (nn.Flatten, "flatten", lambda: dict(start_dim=m.start_dim, end_dim=m.end_dim)),
                 (nn.Identity, "identity", dict)]
        for cls, kind, hp in table:
            if type(m) is cls:
                return kind, hp(), tensors, bool(getattr(m, "inplace", False))
        raise refuse(node, f"the module {type(m).__name__} has no snlite layer")
    fn, kw = node.target, node.kwargs
    if node.op == "call_function":
        if fn in (F.relu, torch.relu, torch.relu_):
            return "relu", {}, tensors[:1], fn is torch.relu_ or _bind(node, (("inplace", False),))["inplace"]
        if fn is F.relu6:
            return "relu6", {}, tensors[:1], _bind(node, (("inplace", False),))["inplace"]
        if fn in (torch.sigmoid, F.sigmoid, torch.tanh, F.tanh):
            return fn.__name__, {}, tensors[:1], False
        if fn is F.leaky_relu:
            hp = _bind(node, (("negative_slope", 0.01), ("inplace", False)))
            return "leaky_relu", hp, tensors[:1], hp["inplace"]
        if fn is F.gelu:
            return "gelu", _bind(node, (("approximate", "none"),)), tensors[:1], False
        if fn in (F.silu, F.hardsigmoid, F.hardswish):
            return fn.__name__, {}, tensors[:1], _bind(node, (("inplace", False),))["inplace"]
        if fn in (operator.mul, torch.mul):
            return "mul", {}, tensors, False
        if fn is torch.mean:
            return "mean", _bind(node, (("dim", None), ("keepdim", False))), tensors[:1], False
        if getattr(fn, "__name__", "") == "channel_shuffle" and fn.__module__.startswith("torchvision"):
            return "channel_shuffle", _bind(node, (("groups", None),)), tensors[:1], False
        if fn is torch.chunk:
            return "chunk", _bind(node, (("chunks", None), ("dim", 0))), tensors[:1], False
        if fn is operator.getitem and _is_chunk(node.args[0]):
            return "narrow", {"part": node.args[1]}, [node.args[0]], False
        if getattr(fn, "__name__", "") == "stochastic_depth" and fn.__module__.startswith("torchvision"):
            hp = _bind(node, (("p", None), ("mode", None), ("training", True)))
            if hp["p"] and hp["training"]:
                raise refuse(node, f"stochastic depth (p={hp['p']}) skips whole residual branches at random, "
                                   "which no snlite layer does; build the model without it (torchvision's "
                                   "EfficientNet: stochastic_depth_prob=0.0, on the command line "
                                   "--torch-args '{\"stochastic_depth_prob\": 0}')")
            return "identity", hp, tensors[:1], False
        if fn in (operator.add, operator.iadd, torch.add):
            if kw.get("alpha", 1) != 1 or len(tensors) != 2:
                raise refuse(node, "only the sum of two tensors is supported")
            return "add", {}, tensors, fn is operator.iadd
        if fn in (torch.cat, torch.concat):
            dim = _bind(node, (("dim", 0),))["dim"]
            return "concat", {"dim": dim}, list(node.args[0] if node.args else kw["tensors"]), False
        if fn is torch.flatten:
            return "flatten", _bind(node, (("start_dim", 0), ("end_dim", -1))), tensors[:1], False
        if fn is F.adaptive_avg_pool2d:
            return "adaptive_avgpool", {}, tensors[:1], False
        if fn in (F.max_pool2d, F.avg_pool2d):
            kind = "maxpool" if fn is F.max_pool2d else "avgpool"
            return kind, _bind(node, POOL_ARGS[kind]), tensors[:1], False
        if fn is F.dropout:
            hp = _bind(node, (("p", 0.5), ("training", True), ("inplace", False)))
            return ("dropout" if hp["training"] else "identity"), hp, tensors[:1], hp["inplace"]
    elif node.op == "call_method":
        if fn in ("relu", "relu_"):
            return "relu", {}, tensors[:1], fn == "relu_"
        if fn in ("add", "add_", "__iadd__") and len(tensors) == 2 and kw.get("alpha", 1) == 1:
            return "add", {}, tensors, fn != "add"
        if fn == "flatten":
            return "flatten", _bind(node, (("start_dim", 0), ("end_dim", -1))), tensors[:1], False
        if fn in ("sigmoid", "tanh", "mul") and len(tensors) == (2 if fn == "mul" else 1):
            return fn, {}, tensors, False
        if fn == "mean":
            return "mean", _bind(node, (("dim", None), ("keepdim", False))), tensors[:1], False
        if fn == "chunk":
            return "chunk", _bind(node, (("chunks", None), ("dim", 0))), tensors[:1], False
    raise refuse(node, "no snlite layer computes it")


def _is_chunk(node) -> bool:
    """Whether ``node`` is a ``chunk`` call (whose parts the getitem nodes after it take)."""
    import torch

    op = getattr(node, "op", None)
    return (op == "call_method" and node.target == "chunk") or \
        (op == "call_function" and node.target is torch.chunk)


def _not_yet(kind, hp) -> str | None:
    """What ``hp`` asks of a ``kind`` layer that snlite does not do yet, or None."""
    for key, supported in NOT_YET.get(kind, {}).items():
        value = hp.get(key, supported)
        if isinstance(supported, tuple):
            value = _pair(value)
        if value != supported:
            return f"{key}={value!r} is not supported yet (snlite's {kind} has only {key}={supported!r})"
    if kind == "batchnorm" and hp["momentum"] is None:
        return "momentum=None (a cumulative average) is not supported yet: give the running statistics a " \
            "momentum"
    if kind == "conv2d" and isinstance(hp["padding"], str):
        return f"padding={hp['padding']!r} is not supported yet: give the padding in pixels"
    return None


class Importer:
    """Walks the traced graph in order and adds one snlite layer per node."""

    def __init__(self, g: Graph, gm):
        self.g, self.gm = g, gm
        self.built, self.used, self.called = {}, set(), set()
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}

    def run(self) -> dict:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if self.built:
                    raise refuse(node, "the model takes a second input; snlite graphs have one")
                self.built[node] = self.g.input()
            elif node.op == "get_attr":
                raise refuse(node, "the forward reads a parameter or buffer directly, outside a submodule")
            elif node.op != "output":
                self.visit(node)
        return self.built

    def name(self, node, kind) -> str:
        base = node.target if node.op == "call_module" else ".".join(p for p in (_where(node), kind) if p)
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def visit(self, node) -> None:
        kind, hp, inputs, in_place = _describe(node, self.gm)
        reason = _not_yet(kind, hp) or self._shared(node)
        if reason:
            raise refuse(node, reason)
        missing = [a for a in inputs if a not in self.built]
        if missing or not inputs:
            raise refuse(node, f"its input {missing[0].name!r} is not a tensor snlite built" if missing
                         else "it reads no tensor")
        if in_place:  # the dataflow is the fx graph's only if nobody reads the overwritten tensor later
            late = [u.name for u in inputs[0].users if self.order[u] > self.order[node]]
            if late:
                raise refuse(node, f"it overwrites {inputs[0].name!r} in place, which {late} read afterwards")
        if kind == "chunk":  # no layer: each part is one when a getitem takes it
            self.built[node] = self.chunk(node, hp, self.built[inputs[0]])
            return
        want = tuple(node.meta["tensor_meta"].shape)[1:]
        xs = [self.built[a] for a in inputs]
        node_out = self.build(node, kind, hp, xs, want)
        if tuple(node_out.shape[1:]) != want:
            raise refuse(node, f"snlite's {kind} computes a shape {node_out.shape[1:]}, PyTorch's {want}")
        self.built[node] = node_out

    def _shared(self, node) -> str | None:
        """Why ``node`` cannot be imported if it calls a module with weights a second time, else None."""
        if node.op != "call_module":
            return None
        again = node.target in self.called
        self.called.add(node.target)
        module = self.gm.get_submodule(node.target)
        weights = next(module.parameters(), None) is not None or next(module.buffers(), None) is not None
        if again and weights:
            return (f"it calls {node.target} a second time, whose weights PyTorch shares between the calls; "
                    "each snlite layer owns its weights, so give each call a module of its own "
                    "(copy.deepcopy) to plan the network with them apart")
        return None

    def build(self, node, kind, hp, xs, want):
        g, x = self.g, xs[0]
        if kind == "identity" or (kind in ("concat", "flatten", "adaptive_avgpool") and len(xs) == 1
                                  and tuple(x.shape[1:]) == want):
            return x  # a one-tensor cat, a flatten of what is flat, an adaptive pool to the same size
        name = self.name(node, kind)
        if kind == "conv2d":
            return g.conv2d(x, hp["out_channels"], hp["kernel_size"], hp["stride"], hp["padding"], hp["bias"],
                            groups=hp["groups"], name=name)
        if kind == "linear":
            if len(x.shape) != 2:
                raise refuse(node, f"a Linear on a {len(x.shape)}-d input: snlite's acts on (N, features)")
            return g.linear(x, hp["out_features"], hp["bias"], name=name)
        if kind == "batchnorm":
            return g.batchnorm(x, hp["eps"], hp["momentum"], name=name)
        if kind == "relu":
            return g.relu(x, name=name)
        if kind in ("relu6", "sigmoid", "tanh", "silu", "hardsigmoid", "hardswish", "gelu"):
            return getattr(g, kind)(x, name=name)
        if kind == "leaky_relu":
            return g.leaky_relu(x, hp["negative_slope"], name=name)
        if kind == "mul":
            return self.channel_scale(node, xs, name)
        if kind == "narrow":
            source, parts = x
            start, size = parts[hp["part"]]
            return g.narrow(source, start, size, name=name)
        if kind == "channel_shuffle":
            return g.channel_shuffle(x, hp["groups"], name=name)
        if kind == "mean":
            dims = hp["dim"] if isinstance(hp["dim"], (tuple, list)) else (hp["dim"],)
            spatial = all(isinstance(d, int) for d in dims) and sorted(d % 4 for d in dims) == [2, 3]
            if len(x.shape) != 4 or not spatial:
                raise refuse(node, f"a mean over dims {hp['dim']}: snlite averages an (N, C, H, W) tensor "
                                   "over (H, W) only (x.mean((2, 3)), a global average pool)")
            pooled = g.avgpool(x, x.shape[2:], name=name)
            return pooled if hp["keepdim"] else g.flatten(pooled, name=f"{name}.flatten")
        if kind == "lrn":
            return g.lrn(x, hp["size"], hp["alpha"], hp["beta"], hp["k"], name=name)
        if kind == "dropout":
            return g.dropout(x, hp["p"], name=name)
        if kind in ("maxpool", "avgpool"):
            k = hp["kernel_size"]
            pool = g.maxpool if kind == "maxpool" else g.avgpool
            extra = {} if kind == "maxpool" else {"count_include_pad": hp["count_include_pad"]}
            stride = k if hp["stride"] in (None, ()) else hp["stride"]  # F.max_pool2d's stride=[] is kernel
            return pool(x, k, stride, hp["padding"], ceil_mode=bool(hp["ceil_mode"]), name=name, **extra)
        if kind == "adaptive_avgpool":
            (h, w), (oh, ow) = x.shape[2:], want[1:]
            if h % oh or w % ow:
                raise refuse(node, f"adaptive average pooling from {h}x{w} to {oh}x{ow} has windows of "
                                   "different sizes, which no snlite layer computes yet; choose an input "
                                   f"size whose features divide into {oh}x{ow} (224x224 for torchvision's "
                                   "VGG and AlexNet)")
            return g.avgpool(x, (h // oh, w // ow), name=name)
        if kind == "concat":
            if hp["dim"] not in (1, -3) or any(len(a.shape) != 4 for a in xs):
                raise refuse(node, f"a cat along dim {hp['dim']}: snlite's concat joins (N, C, H, W) tensors "
                                   "along channels (dim 1)")
            return g.concat(xs, name=name)
        if kind == "flatten":
            if hp["start_dim"] != 1 or hp["end_dim"] != -1:
                raise refuse(node, "only flatten(x, 1), all but the batch dimension, is supported")
            return g.flatten(x, name=name)
        if kind == "add":
            if xs[0].shape != xs[1].shape:
                raise refuse(node, f"a broadcast sum of {xs[0].shape} and {xs[1].shape}; snlite adds equal "
                                   "shapes")
            if xs[0].name == xs[1].name:
                raise refuse(node, "x + x: snlite's add takes two different tensors")
            return g.add(xs[0], xs[1], name=name)
        raise AssertionError(f"no builder for {kind}")

    def chunk(self, node, hp, x):
        """(x, [(start, size) of each part]) for ``x.chunk(chunks, dim=1)``, as PyTorch splits: parts of
        ceil(C / chunks) channels, the last one smaller if they do not divide evenly."""
        if hp["dim"] not in (1, -3) or len(x.shape) != 4:
            raise refuse(node, f"a chunk along dim {hp['dim']}: snlite splits (N, C, H, W) tensors along "
                               "channels (dim 1)")
        c = x.shape[1]
        size = -(-c // hp["chunks"])
        return x, [(start, min(size, c - start)) for start in range(0, c, size)]

    def channel_scale(self, node, xs, name):
        """x * gate or gate * x, the gate (N, C, 1, 1) and x (N, C, H, W): squeeze-and-excitation's scale."""
        shapes = [tuple(a.shape) for a in xs]
        if len(xs) != 2:
            raise refuse(node, "a product with a number: no snlite layer scales by a constant")
        for x, gate in (xs, xs[::-1]):
            if len(x.shape) == 4 and tuple(gate.shape) == tuple(x.shape[:2]) + (1, 1):
                return self.g.channel_scale(x, gate, name=name)
        raise refuse(node, f"a product of tensors of shapes {shapes}; snlite multiplies only a feature map "
                           "(N, C, H, W) by a per-channel gate (N, C, 1, 1), as squeeze-and-excitation does")
