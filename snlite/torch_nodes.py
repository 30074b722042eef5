"""What each fx node of a traced module is, for :func:`snlite.torch_import.from_torch`: a kind of
snlite layer and its hyper-parameters (:func:`describe`), which hyper-parameters snlite's layers do not
have yet (``NOT_YET``, the one place to extend when a layer learns one; a value that snlite computes as
a layer of its own, GELU's ``approximate="tanh"``, is renamed to that kind first), and the one-line error that
refuses a node snlite cannot import (:func:`refuse`). The walk that adds the layers is
:mod:`snlite.torch_walk`. torch is imported only inside :func:`describe`, which looks a node's module
up in torch.nn: snlite itself never needs it.
"""
from __future__ import annotations

import operator

SUPPORTED = ("modules Conv2d (grouped and depthwise too; padding 'same' for odd kernels), Linear, "
             "BatchNorm2d, BatchNorm1d and LayerNorm on (N, features), ReLU, ReLU6, LeakyReLU, Sigmoid, "
             "Tanh, SiLU, Hardsigmoid, Hardswish, GELU (exact or tanh), ELU, SELU, CELU, Softplus, Mish, "
             "MaxPool2d, AvgPool2d (ceil mode too), AdaptiveAvgPool2d and AdaptiveMaxPool2d (where they are "
             "the identity or their windows tile the input), LocalResponseNorm, Dropout, Dropout2d, Flatten, "
             "Identity, and LayerNorm and Linear over the channels between ConvNeXt's permute(0, 2, 3, "
             "1) and permute(0, 3, 1, 2), and ViT's tokens (N, T, D) (its patches reshaped to (N, D, H * "
             "W) or flatten(2), then permute(0, 2, 1) or transpose(1, 2)) with LayerNorm, Linear, "
             "self-attention by MultiheadAttention (batch_first, no mask, no dropout, need_weights=False), "
             "the class token (torch.cat of a (1, 1, D) parameter expanded, first), the position embedding "
             "(+ a (1, T, D) parameter), x[:, i] and x.mean(dim=1), and Swin's window attention (V1) and "
             "patch merging on maps whose sides its windows tile; "
             "functions relu, relu6, leaky_relu, sigmoid, tanh, silu, "
             "hardsigmoid, hardswish, gelu, elu, selu, celu, softplus, mish, + / torch.add, * / "
             "torch.mul of a feature map by a per-channel gate (N, C, 1, 1) or by a per-channel "
             "parameter (C, 1, 1) (ConvNeXt's layer scale), layer_norm over the channels, torch.cat and "
             "x.chunk over channels, ShuffleNet's channel_shuffle, torch.flatten(x, 1), "
             "x.view(x.size(0), -1) or any reshape to (N, features), x.squeeze() of (N, C, 1, 1), x.mean "
             "over (H, W), log_softmax(x, 1) as the last op (softmax_loss applies it), max_pool2d, "
             "avg_pool2d, adaptive_avg_pool2d, adaptive_max_pool2d, dropout, dropout2d, and stochastic "
             "depth with p=0; one input, logits (N, classes) out")

# hyper-parameters snlite's layers do not have yet: kind -> {attribute: the only value supported}
NOT_YET = {
    "conv2d": {"dilation": (1, 1), "padding_mode": "zeros"},
    "maxpool": {"dilation": (1, 1), "return_indices": False},
    "avgpool": {"divisor_override": None},
    "adaptive_maxpool": {"return_indices": False},
    "batchnorm": {"affine": True, "track_running_stats": True},
    "gelu": {"approximate": "none"},
    "layernorm": {"elementwise_affine": True, "bias": True},
    "window_attention": {"attention_dropout": 0.0, "dropout": 0.0},
    "multihead_attention": {"batch_first": True, "dropout": 0.0, "add_bias_kv": False, "add_zero_attn": False,
                            "same_embed_dim": True, "self_attention": True, "attn_mask": None,
                            "key_padding_mask": None, "is_causal": False},
}


class TorchImportError(ValueError):
    """A module snlite cannot import, and why: the node, its op, where it sits, what is supported."""


def where(node) -> str:
    """Where ``node`` sits: the submodule it calls, or the module whose forward called it."""
    if node.op == "call_module":
        return node.target
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def refuse(node, reason: str) -> TorchImportError:
    """The error that refuses ``node``: which fx node, its op and target, where in the model it sits,
    why, and what snlite imports."""
    target = getattr(node.target, "__name__", node.target)
    place = where(node)
    return TorchImportError(f"cannot import fx node {node.name!r} ({node.op} {target}) in "
                            f"{place or 'the model forward itself'}: {reason}. snlite imports {SUPPORTED}")


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _padding(m):
    """A Conv2d's padding in pixels: PyTorch's "valid" is 0, and "same" (stride 1) is half the dilated
    kernel on each side where that is a whole number; an even kernel's "same" stays a string (refused)."""
    if m.padding == "valid":
        return (0, 0)
    if m.padding == "same":
        spans = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
        return tuple(s // 2 for s in spans) if all(s % 2 == 0 for s in spans) else "same"
    return m.padding


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


def describe(node, gm):
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
                                                    stride=m.stride, padding=_padding(m), dilation=m.dilation,
                                                    groups=m.groups, padding_mode=m.padding_mode,
                                                    bias=m.bias is not None)),
                 (nn.Linear, "linear", lambda: dict(out_features=m.out_features, bias=m.bias is not None)),
                 (nn.BatchNorm2d, "batchnorm", lambda: dict(eps=m.eps, momentum=m.momentum, affine=m.affine,
                                                            track_running_stats=m.track_running_stats)),
                 (nn.BatchNorm1d, "batchnorm", lambda: dict(eps=m.eps, momentum=m.momentum, affine=m.affine,
                                                            track_running_stats=m.track_running_stats)),
                 (nn.ReLU, "relu", lambda: dict(inplace=m.inplace)),
                 (nn.ReLU6, "relu6", lambda: dict(inplace=m.inplace)),
                 (nn.LeakyReLU, "leaky_relu", lambda: dict(negative_slope=m.negative_slope)),
                 (nn.Sigmoid, "sigmoid", dict), (nn.Tanh, "tanh", dict), (nn.SiLU, "silu", dict),
                 (nn.Hardsigmoid, "hardsigmoid", dict), (nn.Hardswish, "hardswish", dict),
                 (nn.GELU, "gelu", lambda: dict(approximate=m.approximate)),
                 (nn.ELU, "elu", lambda: dict(alpha=m.alpha, inplace=m.inplace)),
                 (nn.SELU, "selu", lambda: dict(inplace=m.inplace)),
                 (nn.CELU, "celu", lambda: dict(alpha=m.alpha, inplace=m.inplace)),
                 (nn.Softplus, "softplus", lambda: dict(beta=m.beta, threshold=m.threshold)),
                 (nn.Mish, "mish", lambda: dict(inplace=m.inplace)),
                 (nn.MaxPool2d, "maxpool", lambda: attrs), (nn.AvgPool2d, "avgpool", lambda: attrs),
                 (nn.AdaptiveAvgPool2d, "adaptive_avgpool", dict),
                 (nn.AdaptiveMaxPool2d, "adaptive_maxpool", lambda: dict(return_indices=m.return_indices)),
                 (nn.LocalResponseNorm, "lrn", lambda: dict(size=m.size, alpha=m.alpha, beta=m.beta, k=m.k)),
                 (nn.Dropout, "dropout", lambda: dict(p=m.p, inplace=m.inplace)),
                 (nn.Dropout2d, "dropout2d", lambda: dict(p=m.p, inplace=m.inplace)),
                 (nn.Flatten, "flatten", lambda: dict(start_dim=m.start_dim, end_dim=m.end_dim)),
                 (nn.LogSoftmax, "log_softmax", lambda: dict(dim=m.dim)),
                 (nn.LayerNorm, "layernorm", lambda: dict(normalized_shape=tuple(m.normalized_shape),
                                                          eps=m.eps, elementwise_affine=m.elementwise_affine,
                                                          bias=getattr(m, "bias", None) is not None)),
                 (nn.Identity, "identity", dict),
                 (nn.MultiheadAttention, "multihead_attention", lambda: _attention(node, m))]
        for cls, kind, hp in table:
            if type(m) is cls:
                return (*_gelu_tanh(kind, hp()), tensors, bool(getattr(m, "inplace", False)))
        if isinstance(m, (nn.TransformerEncoder, nn.TransformerEncoderLayer)):
            raise refuse(node, f"the module {type(m).__name__} has no snlite layer, and torch.fx cannot "
                               "trace into it (its fast path branches on the tensors); write its block of "
                               "nn.LayerNorm, nn.MultiheadAttention(batch_first=True) and nn.Linear, as "
                               "torchvision's ViT EncoderBlock does")
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
            return (*_gelu_tanh("gelu", _bind(node, (("approximate", "none"),))), tensors[:1], False)
        if fn in (F.elu, F.celu):
            hp = _bind(node, (("alpha", 1.0), ("inplace", False)))
            return fn.__name__, hp, tensors[:1], hp["inplace"]
        if fn in (F.selu, torch.selu):
            return "selu", {}, tensors[:1], _bind(node, (("inplace", False),))["inplace"]
        if fn is F.softplus:
            return "softplus", _bind(node, (("beta", 1.0), ("threshold", 20.0))), tensors[:1], False
        if fn in (F.silu, F.hardsigmoid, F.hardswish, F.mish):
            return fn.__name__, {}, tensors[:1], _bind(node, (("inplace", False),))["inplace"]
        if fn in (operator.mul, torch.mul):
            return "mul", {}, tensors, False
        if fn is torch.mean:
            return "mean", _bind(node, (("dim", None), ("keepdim", False))), tensors[:1], False
        if getattr(fn, "__name__", "") == "channel_shuffle" and fn.__module__.startswith("torchvision"):
            return "channel_shuffle", _bind(node, (("groups", None),)), tensors[:1], False
        if fn is torch.chunk:
            return "chunk", _bind(node, (("chunks", None), ("dim", 0))), tensors[:1], False
        if fn is operator.getitem and is_chunk(node.args[0]):
            return "narrow", {"part": node.args[1]}, [node.args[0]], False
        index = node.args[1] if fn is operator.getitem else None
        if isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None) \
                and isinstance(index[1], int):
            return "token_select", {"index": index[1]}, tensors[:1], False  # x[:, i] of (N, T, D)
        swin = _torchvision(fn, "swin_transformer")
        if swin == "_get_relative_position_bias":  # a view of the table: the attention's layer reads it
            return "relative_position_bias", {"window": tuple(node.args[2])}, list(node.args[:2]), False
        if swin == "shifted_window_attention":
            hp = _bind(node, (("qkv_weight", None), ("proj_weight", None), ("relative_position_bias", None),
                              ("window_size", None), ("num_heads", None), ("shift_size", None),
                              ("attention_dropout", 0.0), ("dropout", 0.0), ("qkv_bias", None),
                              ("proj_bias", None), ("logit_scale", None), ("training", True)))
            return "window_attention", hp, tensors[:1], False
        if swin == "_patch_merging_pad":
            return "patch_merge", {}, tensors[:1], False
        if getattr(fn, "__name__", "") == "stochastic_depth" and fn.__module__.startswith("torchvision"):
            hp = _bind(node, (("p", None), ("mode", None), ("training", True)))
            if hp["p"] and hp["training"]:
                raise refuse(node, f"stochastic depth (p={hp['p']}) skips whole residual branches at random, "
                                   "which no snlite layer does; build the model without it (torchvision's "
                                   "EfficientNet and ConvNeXt: stochastic_depth_prob=0.0, on the command "
                                   "line --torch-args '{\"stochastic_depth_prob\": 0}')")
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
        if fn is torch.reshape:
            return "reshape", {}, tensors[:1], False
        if fn in (F.log_softmax, torch.log_softmax):
            return "log_softmax", _bind(node, (("dim", None),)), tensors[:1], False
        if fn is torch.transpose:
            return "permute", {"dims": _transposed(node, *node.args[1:3])}, tensors[:1], False
        if fn is torch.permute:
            return "permute", {"dims": tuple(_bind(node, (("dims", None),))["dims"])}, tensors[:1], False
        if fn is F.layer_norm:
            hp = _bind(node, (("normalized_shape", None), ("weight", None), ("bias", None), ("eps", 1e-5)))
            affine = [hp.pop("weight"), hp.pop("bias")]
            hp.update(normalized_shape=tuple(hp["normalized_shape"]), params=affine,
                      elementwise_affine=affine[0] is not None, bias=affine[1] is not None)
            return "layernorm", hp, tensors[:1], False
        if fn is F.adaptive_avg_pool2d:
            return "adaptive_avgpool", {}, tensors[:1], False
        if fn in (F.adaptive_max_pool2d_with_indices, F.max_pool2d_with_indices):  # return_indices=True
            raise refuse(node, "return_indices=True is not supported yet (snlite's pools return no indices)")
        if fn is F.adaptive_max_pool2d:
            return "adaptive_maxpool", _bind(node, (("output_size", None), ("return_indices", False))), \
                tensors[:1], False
        if fn is torch.squeeze:
            return "squeeze", _bind(node, (("dim", None),)), tensors[:1], False
        if fn in (F.max_pool2d, F.avg_pool2d):
            kind = "maxpool" if fn is F.max_pool2d else "avgpool"
            return kind, _bind(node, POOL_ARGS[kind]), tensors[:1], False
        if fn in (F.dropout, F.dropout2d):
            hp = _bind(node, (("p", 0.5), ("training", True), ("inplace", False)))
            return (fn.__name__ if hp["training"] else "identity"), hp, tensors[:1], hp["inplace"]
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
        if fn in ("view", "reshape"):
            return "reshape", {}, tensors[:1], False
        if fn == "squeeze":
            return "squeeze", _bind(node, (("dim", None),)), tensors[:1], False
        if fn == "log_softmax":
            return "log_softmax", _bind(node, (("dim", None),)), tensors[:1], False
        if fn == "expand":
            return "expand", {}, tensors[:1], False
        if fn == "transpose":
            return "permute", {"dims": _transposed(node, *node.args[1:3])}, tensors[:1], False
        if fn == "permute":
            dims = node.args[1:] if len(node.args) > 2 else (node.args[1:] or [kw.get("dims")])[0]
            return "permute", {"dims": tuple(dims)}, tensors[:1], False
    raise refuse(node, "no snlite layer computes it")


SHAPE_ARITHMETIC = (operator.getitem, operator.mul, operator.floordiv, operator.add, operator.sub,
                    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge)


def is_shape(node, shapes) -> bool:
    """Whether ``node`` computes a size, not a tensor: ``x.size(0)``, ``x.shape``, and indexing and
    arithmetic on sizes (``shapes``: the nodes known to be sizes). They are no layer: a reshape that
    uses them is judged by the shape PyTorch gave it."""
    if node.op == "call_method" and node.target in ("size", "dim"):
        return True
    if node.op == "call_function" and node.target is getattr and node.args[1:] == ("shape",):
        return True
    if node.op == "call_function" and (node.target in SHAPE_ARITHMETIC or _is_assert(node.target)):
        nodes = [a for a in node.args if hasattr(a, "op")]
        return bool(nodes) and all(a in shapes for a in nodes)
    return False


def _torchvision(fn, module) -> str:
    """The name of ``fn`` if it is a function of ``torchvision.models.<module>``, else ''."""
    return fn.__name__ if getattr(fn, "__module__", "") == f"torchvision.models.{module}" else ""


def _transposed(node, a, b) -> tuple:
    """``x.transpose(a, b)`` as the permute it is: the dims of x's rank with a and b swapped."""
    dims = list(range(len(node.meta["tensor_meta"].shape)))
    dims[a], dims[b] = dims[b], dims[a]
    return tuple(dims)


def _is_assert(fn) -> bool:
    """torch._assert: a check on sizes (ViT's image size), no layer."""
    return getattr(fn, "__name__", "") == "_assert" and getattr(fn, "__module__", "").startswith("torch")


def _attention(node, m) -> dict:
    """A MultiheadAttention call's hyper-parameters: the module's, and the call's own (masks, weights)."""
    call = _bind(node, (("key", None), ("value", None), ("key_padding_mask", None), ("need_weights", True),
                        ("attn_mask", None), ("average_attn_weights", True), ("is_causal", False)), first=1)
    return dict(num_heads=m.num_heads, bias=m.in_proj_bias is not None, batch_first=m.batch_first,
                dropout=m.dropout, add_bias_kv=m.bias_k is not None, add_zero_attn=m.add_zero_attn,
                same_embed_dim=m._qkv_same_embed_dim,
                self_attention=call["key"] is node.args[0] is call["value"], attn_mask=call["attn_mask"],
                key_padding_mask=call["key_padding_mask"], is_causal=call["is_causal"])


def is_chunk(node) -> bool:
    """Whether ``node`` is a ``chunk`` call (whose parts the getitem nodes after it take)."""
    import torch

    op = getattr(node, "op", None)
    return (op == "call_method" and node.target == "chunk") or \
        (op == "call_function" and node.target is torch.chunk)


def _gelu_tanh(kind, hp):
    """GELU's tanh approximation (``approximate="tanh"``) is a layer kind of its own, ``gelu_tanh``."""
    if kind == "gelu" and hp.get("approximate") == "tanh":
        return "gelu_tanh", {}
    return kind, hp


def not_yet(kind, hp) -> str | None:
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
        return f"padding={hp['padding']!r} with kernel {hp['kernel_size']} pads one side more than the " \
            "other (an even kernel), which snlite's conv does not yet: give the padding in pixels"
    return None
