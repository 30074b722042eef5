"""Your own network in: a ``torch.nn.Module`` traced with torch.fx into an snlite :class:`Graph`.

    import torchvision, snlite
    net = torchvision.models.resnet18()
    g = snlite.from_torch(net, (3, 224, 224), batch=32)      # a training graph, ending in softmax_loss
    model = snlite.Model(g, device="host")
    model.set_params(net.state_dict())                       # and back: net.load_state_dict(...)

``torch.fx.symbolic_trace`` turns the module's ``forward`` into a list of nodes (a call of a
submodule, of a function such as ``torch.cat``, or of a tensor method), and shape propagation
runs it once on a batch of one to learn every node's shape. Each node becomes one snlite layer,
named so that snlite's parameter names are PyTorch's ``state_dict`` keys: a submodule's layer is
named by its path (``layer2.0.conv1``); a parameter-free function by the path of the module whose
forward called it and the operation (``layer2.0.add``); a name used twice (torchvision's ResNets
call one ``relu`` module three times) gets ``_1``, ``_2``... as fx names its nodes. The logits the
module returns feed a ``softmax_loss`` whose classes are their width (the last Linear's
``out_features``). Every layer's shape is checked against the one PyTorch computed.

What snlite cannot import stops with one :class:`TorchImportError` naming the fx node, its op and
target, and where in the model it sits; hyper-parameters snlite's layers do not have yet are listed
in ``NOT_YET``, the one place to extend when a layer learns them. torch is imported only inside
these functions: snlite itself never needs it.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import importlib.util
import operator
import os
import sys

from snlite.graph import Graph

SUPPORTED = ("modules Conv2d (grouped and depthwise too), Linear, BatchNorm2d, ReLU, ReLU6, MaxPool2d, "
             "AvgPool2d (ceil mode too), AdaptiveAvgPool2d (where it is the identity or its windows tile the "
             "input), LocalResponseNorm, Dropout, Flatten, Identity; functions relu, relu6, + / torch.add, "
             "torch.cat over channels, torch.flatten(x, 1), max_pool2d, avg_pool2d, adaptive_avg_pool2d and "
             "dropout; one input, logits (N, classes) out")

# hyper-parameters snlite's layers do not have yet: kind -> {attribute: the only value supported}
NOT_YET = {
    "conv2d": {"dilation": (1, 1), "padding_mode": "zeros"},
    "maxpool": {"dilation": (1, 1), "return_indices": False},
    "avgpool": {"divisor_override": None},
    "batchnorm": {"affine": True, "track_running_stats": True},
}


class TorchImportError(ValueError):
    """A module snlite cannot import, and why: the node, its op, where it sits, what is supported."""


def from_torch(module, input_shape, batch: int = 32, name: str | None = None) -> Graph:
    """The training graph of ``module`` on inputs of ``input_shape`` (C, H, W), ``batch`` at a time,
    with PyTorch's parameter names (see the module docstring). ``module`` is neither changed nor
    run in training mode: its shapes are propagated once, in eval mode and without gradients."""
    if importlib.util.find_spec("torch") is None:
        raise ImportError("snlite.from_torch needs PyTorch: pip install -e \".[torch]\"")
    import torch
    from torch.fx.passes.shape_prop import ShapeProp

    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else ()
    if len(shape) != 3 or not all(isinstance(s, int) and s >= 1 for s in shape):
        raise ValueError(f"input_shape must be (C, H, W) of positive integers, got {input_shape!r}")
    gm = _trace(module)
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints tracebacks
            ShapeProp(gm).propagate(torch.zeros((1,) + shape))
    except Exception as e:
        cause = e.__cause__ or e  # ShapeProp wraps the module's own error in a dump of the fx node
        raise TorchImportError(f"PyTorch could not run {type(module).__name__} on an input of shape "
                               f"(1, {', '.join(map(str, shape))}): {cause} (a model made for another "
                               "input size: give it, as input_shape or --input CxHxW)") from None
    finally:
        for m, training in modes.items():
            m.train(training)
    out = _output(gm)
    logits = tuple(out.meta["tensor_meta"].shape)
    if len(logits) != 2:
        raise _error(out, f"the model returns a tensor of shape {logits}; snlite needs logits (N, classes) "
                          "to put a softmax_loss on")
    g = Graph((batch,) + shape, logits[1], name=name or type(module).__name__.lower())
    built = _Importer(g, gm).run()
    g.softmax_loss(built[out])
    return g


def check_source(source: str) -> None:
    """ValueError unless ``source`` is ``torchvision:NAME`` or ``path/to/file.py:CLASS`` with the
    file there: what the command line checks before any work, without importing torch."""
    where, _, attr = source.rpartition(":")
    if not (where and attr.isidentifier()):
        raise ValueError(f"{source!r}: expected torchvision:NAME (e.g. torchvision:resnet18) or "
                         "path/to/file.py:CLASS")
    if where != "torchvision" and not (where.endswith(".py") and os.path.isfile(where)):
        raise ValueError(f"{source!r}: expected torchvision:NAME or path/to/file.py:CLASS, and there is "
                         f"no file {where!r}")


def load_module(source: str, kwargs: dict | None = None):
    """The ``torch.nn.Module`` a command line names: ``torchvision:NAME`` (a model of
    ``torchvision.models``, e.g. ``torchvision:resnet18``) or ``path/to/file.py:CLASS`` (a class of
    that file), constructed with ``kwargs`` (none: its defaults)."""
    import torch

    check_source(source)
    where, _, attr = source.rpartition(":")
    kwargs = dict(kwargs or {})
    if where == "torchvision":
        models = import_torchvision().models
        known = models.list_models(models)
        if attr not in known:
            near = difflib.get_close_matches(attr, known, n=3)
            hint = f"did you mean {', '.join(near)}?" if near else f"it has {', '.join(known)}"
            raise ValueError(f"{source!r}: torchvision has no model {attr!r}; {hint}")
        return _construct(lambda **kw: models.get_model(attr, **kw), f"torchvision.models.{attr}", kwargs)
    spec = importlib.util.spec_from_file_location(f"snlite_user_model_{abs(hash(where))}", where)
    code = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(code)
    except Exception as e:  # noqa: BLE001 - whatever the user's file raises, said in one line
        raise ValueError(f"{where} failed to run: {type(e).__name__}: {e}") from None
    cls = getattr(code, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        found = [n for n, v in vars(code).items() if isinstance(v, type) and issubclass(v, torch.nn.Module)
                 and v.__module__ == code.__name__]
        raise ValueError(f"{source!r}: {where} defines no torch.nn.Module subclass {attr!r}"
                         + (f"; it defines {', '.join(found)}" if found else ""))
    return _construct(cls, attr, kwargs)


def _construct(make, what: str, kwargs: dict):
    """``make(**kwargs)``; a constructor that refuses its arguments, or raises, said in one line."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    try:
        return make(**kwargs)
    except TypeError as e:
        raise ValueError(f"{what}({args}) failed: {e}; give its constructor's arguments with --torch-args, "
                         "a JSON object") from None
    except Exception as e:  # noqa: BLE001 - whatever the user's constructor raises, said in one line
        raise ValueError(f"{what}({args}) failed: {type(e).__name__}: {e}") from None


def _trace(module):
    import torch
    from torch.fx.proxy import TraceError

    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"from_torch expects a torch.nn.Module, got {type(module).__name__}")
    bad = sorted({str(p.dtype) for p in module.state_dict().values() if p.is_floating_point()}
                 - {"torch.float32"})
    if bad:
        raise TorchImportError(f"{type(module).__name__} holds {', '.join(bad)} tensors; snlite trains in "
                               "float32")
    try:
        return torch.fx.symbolic_trace(module)
    except TraceError as e:
        raise TorchImportError(
            f"torch.fx could not trace {type(module).__name__}: its forward branches or loops on the values "
            f"of a tensor (fx: {e}). snlite plans one static graph before anything runs, the same layers on "
            "tensors of the same shapes every iteration, so it cannot follow a forward whose path depends on "
            "the data. Make the branch depend on a Python value (a constructor argument, self.training) "
            "or import the static part of the model") from None


def import_torchvision():
    """``torchvision``, imported; its classification models are pure Python and need none of its C ops.

    A torchvision built for CUDA (the package registry's default) cannot load its C extension next to
    a CPU-only torch, and torchvision 0.28's ``__init__`` then fails registering a shape function for
    its ``nms`` operator ("operator torchvision::nms does not exist"). Where that extension did not
    load, the two operators it registers unguarded (``nms``, ``qnms``: detection, which snlite never
    calls) are declared first, without a kernel, so the import gets through; calling them still raises.
    A torchvision built for the CPU (download.pytorch.org/whl/cpu) loads its extension and is left alone."""
    import torch

    if importlib.util.find_spec("torchvision") is None:
        raise ImportError("torchvision is not installed: pip install -e \".[torch]\"")
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # a Library undefines its operators when it is collected
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-finished first import
    import torchvision
    return torchvision


_KEEP = []


def _output(gm):
    node = next(n for n in gm.graph.nodes if n.op == "output")
    value = node.args[0]
    meta = getattr(value, "meta", {}).get("tensor_meta")
    if hasattr(meta, "shape"):
        return value
    several = value if isinstance(value, (tuple, list, dict)) else meta  # or a named tuple (GoogLeNet's)
    if not isinstance(several, (tuple, list, dict)):
        raise _error(node, f"the model returns {type(value).__name__}, not one tensor of logits")
    kind = getattr(value, "target", None) or next(k for k in (dict, tuple, list) if isinstance(value, k))
    raise _error(node, f"the model returns {kind.__name__} of {len(several)} outputs, not one tensor of "
                       "logits: snlite puts one softmax_loss on one output, so construct the model without "
                       "the others (torchvision's googlenet and inception_v3 in training: aux_logits=False, "
                       "on the command line --torch-args '{\"aux_logits\": false}')")


def torch_params(module) -> dict:
    """``module``'s state_dict as float32 NumPy arrays, what :meth:`snlite.train.Model.set_params`
    takes (it also takes the state_dict itself); the batch counters ``num_batches_tracked`` are left
    out: snlite's batch normalization updates with a fixed momentum and never reads them."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()
            if not k.endswith("num_batches_tracked")}


# ---------------------------------------------------------------------------------------------- nodes
def _where(node) -> str:
    """Where ``node`` sits: the submodule it calls, or the module whose forward called it."""
    if node.op == "call_module":
        return node.target
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def _error(node, reason: str) -> TorchImportError:
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
                 (nn.MaxPool2d, "maxpool", lambda: attrs), (nn.AvgPool2d, "avgpool", lambda: attrs),
                 (nn.AdaptiveAvgPool2d, "adaptive_avgpool", dict),
                 (nn.LocalResponseNorm, "lrn", lambda: dict(size=m.size, alpha=m.alpha, beta=m.beta, k=m.k)),
                 (nn.Dropout, "dropout", lambda: dict(p=m.p, inplace=m.inplace)),
                 (nn.Flatten, "flatten", lambda: dict(start_dim=m.start_dim, end_dim=m.end_dim)),
                 (nn.Identity, "identity", dict)]
        for cls, kind, hp in table:
            if type(m) is cls:
                return kind, hp(), tensors, kind in ("relu", "relu6", "dropout") and m.inplace
        raise _error(node, f"the module {type(m).__name__} has no snlite layer")
    fn, kw = node.target, node.kwargs
    if node.op == "call_function":
        if fn in (F.relu, torch.relu, torch.relu_):
            return "relu", {}, tensors[:1], fn is torch.relu_ or _bind(node, (("inplace", False),))["inplace"]
        if fn is F.relu6:
            return "relu6", {}, tensors[:1], _bind(node, (("inplace", False),))["inplace"]
        if fn in (operator.add, operator.iadd, torch.add):
            if kw.get("alpha", 1) != 1 or len(tensors) != 2:
                raise _error(node, "only the sum of two tensors is supported")
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
    raise _error(node, "no snlite layer computes it")


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


class _Importer:
    """Walks the traced graph in order and adds one snlite layer per node."""

    def __init__(self, g: Graph, gm):
        self.g, self.gm = g, gm
        self.built, self.used = {}, set()
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}

    def run(self) -> dict:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if self.built:
                    raise _error(node, "the model takes a second input; snlite graphs have one")
                self.built[node] = self.g.input()
            elif node.op == "get_attr":
                raise _error(node, "the forward reads a parameter or buffer directly, outside a submodule")
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
        reason = _not_yet(kind, hp)
        if reason:
            raise _error(node, reason)
        missing = [a for a in inputs if a not in self.built]
        if missing or not inputs:
            raise _error(node, f"its input {missing[0].name!r} is not a tensor snlite built" if missing
                         else "it reads no tensor")
        if in_place:  # the dataflow is the fx graph's only if nobody reads the overwritten tensor later
            late = [u.name for u in inputs[0].users if self.order[u] > self.order[node]]
            if late:
                raise _error(node, f"it overwrites {inputs[0].name!r} in place, which {late} read afterwards")
        want = tuple(node.meta["tensor_meta"].shape)[1:]
        xs = [self.built[a] for a in inputs]
        node_out = self.build(node, kind, hp, xs, want)
        if tuple(node_out.shape[1:]) != want:
            raise _error(node, f"snlite's {kind} computes a shape {node_out.shape[1:]}, PyTorch's {want}")
        self.built[node] = node_out

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
                raise _error(node, f"a Linear on a {len(x.shape)}-d input: snlite's acts on (N, features)")
            return g.linear(x, hp["out_features"], hp["bias"], name=name)
        if kind == "batchnorm":
            return g.batchnorm(x, hp["eps"], hp["momentum"], name=name)
        if kind == "relu":
            return g.relu(x, name=name)
        if kind == "relu6":
            return g.relu6(x, name=name)
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
                raise _error(node, f"adaptive average pooling from {h}x{w} to {oh}x{ow} has windows of "
                                   "different sizes, which no snlite layer computes yet; choose an input "
                                   f"size whose features divide into {oh}x{ow} (224x224 for torchvision's "
                                   "VGG and AlexNet)")
            return g.avgpool(x, (h // oh, w // ow), name=name)
        if kind == "concat":
            if hp["dim"] not in (1, -3) or any(len(a.shape) != 4 for a in xs):
                raise _error(node, f"a cat along dim {hp['dim']}: snlite's concat joins (N, C, H, W) tensors "
                                   "along channels (dim 1)")
            return g.concat(xs, name=name)
        if kind == "flatten":
            if hp["start_dim"] != 1 or hp["end_dim"] != -1:
                raise _error(node, "only flatten(x, 1), all but the batch dimension, is supported")
            return g.flatten(x, name=name)
        if kind == "add":
            if xs[0].shape != xs[1].shape:
                raise _error(node, f"a broadcast sum of {xs[0].shape} and {xs[1].shape}; snlite adds equal "
                                   "shapes")
            if xs[0].name == xs[1].name:
                raise _error(node, "x + x: snlite's add takes two different tensors")
            return g.add(xs[0], xs[1], name=name)
        raise AssertionError(f"no builder for {kind}")
