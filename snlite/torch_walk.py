"""The walk that imports a traced module, for :func:`snlite.torch_import.from_torch`: one snlite layer
per fx node, in order (:class:`Importer`), each named after its module (PyTorch's state_dict names)
and its shape checked against PyTorch's. :mod:`snlite.torch_nodes` says what each node is, and
:mod:`snlite.torch_views` what the walk follows without a layer (a parameter read, a permute, ViT's
tokens).
"""
from __future__ import annotations

import operator
import warnings

from snlite.checks import users_level
from snlite.graph import RESERVED_CHARS, Graph
from snlite.layers_activation import ACTIVATIONS
from snlite.torch_nodes import describe, is_shape, not_yet, refuse, where
from snlite.torch_views import Attended, ChannelsLast, Param, RelativeBias, Tokens, permuted

ACTIVATION = {cls.kind: cls.builder_args for cls in ACTIVATIONS}  # kind -> its builder's arguments after x
# what reads a channels-last tensor (after permute(0, 2, 3, 1)), computed on snlite's (N, C, H, W)
CHANNELS_LAST = ("permute", "layernorm", "linear", *ACTIVATION, "identity", "dropout", "add", "patch_merge",
                 "token_select")


LEGAL = str.maketrans(RESERVED_CHARS, "_" * len(RESERVED_CHARS))  # what a layer name may not hold


def _renamed(base: str, name: str) -> None:
    warnings.warn(f"from_torch: the module {base!r} is the layer {name!r} (a name snlite keeps for its own "
                  f"use); its state_dict entries are {name}.*", stacklevel=users_level())

class Importer:
    """Walks the traced graph in order and adds one snlite layer per node."""

    def __init__(self, g: Graph, gm):
        self.g, self.gm = g, gm
        self.built, self.used, self.called, self.shapes, self.params_used = {}, set(), set(), set(), set()
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}

    def run(self) -> dict:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                if self.built:
                    raise refuse(node, "the model takes a second input; snlite graphs have one")
                self.built[node] = self.g.input()
            elif node.op == "get_attr":  # a layer that reads it names itself after it
                self.built[node] = Param(node.target)
            elif is_shape(node, self.shapes):  # x.size(0) and the like: no layer
                self.shapes.add(node)
            elif node.op != "output":
                self.visit(node)
        return self.built

    def name(self, node, kind) -> str:
        return self.fresh(node.target if node.op == "call_module" else
                          ".".join(p for p in (where(node), kind) if p))

    def fresh(self, base: str) -> str:
        """``base`` as a layer name snlite takes (:meth:`legal`) that no layer has yet: a suffix ``_k``
        where it is taken (a module called twice: ``relu``, ``relu_1``)."""
        legal = self.legal(base, warn=False)
        name, k = legal, 0
        while name in self.used:
            k += 1
            name = f"{legal}_{k}"
        self.used.add(name)
        if legal != base:
            _renamed(base, name)
        return name

    @staticmethod
    def legal(base: str, warn: bool = True) -> str:
        """``base`` as a layer name snlite takes: each '@', '#' and ':' (which snlite's own names use, and
        PyTorch allows in a module's) made '_', and ``data`` and ``labels`` (the graph's own) ``_1``."""
        legal = base.translate(LEGAL)
        legal = f"{legal}_1" if legal in ("data", "labels") else legal
        if warn and legal != base:
            _renamed(base, legal)
        return legal

    def visit(self, node) -> None:
        if node.target is operator.getitem and isinstance(self.built.get(node.args[0]), Attended):
            if node.args[1] != 0 and node.users:
                raise refuse(node, "it reads the attention weights, which snlite never forms: call the "
                                   "attention with need_weights=False and read only its output, [0]")
            self.built[node] = self.built[node.args[0]].parts[node.args[1]]
            return
        kind, hp, inputs, in_place = describe(node, self.gm)
        reason = not_yet(kind, hp) or self._shared(node)
        if reason:
            raise refuse(node, reason)
        if any(a in self.shapes for a in inputs):
            raise refuse(node, "it computes with the size of a tensor, which snlite follows only into a "
                               "reshape to (N, features) (x.view(x.size(0), -1))")
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
        if kind == "multihead_attention":
            self.built[node] = self.attention(node, hp, self.built[inputs[0]])
            return
        if kind == "relative_position_bias":  # Swin's table over each window: its attention layer reads it
            table = self.built[inputs[0]]
            if not isinstance(table, Param) or table.attr != "relative_position_bias_table":
                raise refuse(node, "a relative position bias of something other than a module's own "
                                   "relative_position_bias_table (torchvision's Swin)")
            self.built[node] = RelativeBias(table, hp["window"])
            return
        if kind == "expand":  # a parameter repeated over the batch (ViT's class token): no copy
            if not isinstance(self.built[inputs[0]], Param):
                raise refuse(node, "an expand of a tensor; snlite follows expand only of a parameter over "
                                   "the batch, into a torch.cat with the tokens (ViT's class token)")
            self.built[node] = self.built[inputs[0]]
            return
        want = tuple(node.meta["tensor_meta"].shape)[1:]
        if kind == "squeeze" and hp["dim"] is None:  # traced at batch 1, where squeeze() drops the batch too
            want = tuple(node.meta["tensor_meta"].shape)
        xs = [self.built[a] for a in inputs]
        if any(isinstance(x, Tokens) for x in xs) and kind != "permute":
            raise refuse(node, f"a {kind} of patches reshaped to (N, D, T); snlite follows them only into "
                               "the permute(0, 2, 1) to tokens (N, T, D), as ViT does")
        last = [isinstance(x, ChannelsLast) for x in xs]
        if any(isinstance(x, Param) for x in xs):
            node_out = self.with_param(node, kind, hp, xs)
        elif kind == "permute":
            node_out = permuted(node, hp["dims"], xs[0])
        elif any(last):
            node_out = self.on_channels_last(node, kind, hp, xs, want)
        else:
            node_out = self.build(node, kind, hp, xs, want)
        if tuple(node_out.shape[1:]) != want:
            raise refuse(node, f"snlite's {kind} computes a shape {node_out.shape[1:]}, PyTorch's {want}")
        self.built[node] = node_out

    def on_channels_last(self, node, kind, hp, xs, want):
        """What reads a tensor permuted to channels-last (N, H, W, C), or tokens (N, T, D): computed on
        snlite's (N, C, H, W) over the channels (CHANNELS_LAST); a mean of tokens is an average pool."""
        tokens = next(x for x in xs if isinstance(x, ChannelsLast)).tokens
        if kind == "mean" and tokens:
            return self.token_mean(node, hp, xs[0])
        if kind == "window_attention" and not tokens:
            return ChannelsLast(self.window_attention(node, hp, xs[0].node))
        if (kind not in CHANNELS_LAST or not all(isinstance(x, ChannelsLast) for x in xs)) and tokens:
            raise refuse(node, f"a {kind} of tokens (N, T, D); snlite computes only LayerNorm, Linear, "
                               "MultiheadAttention, activations, dropout, +, x[:, i] and x.mean(dim=1) on "
                               "tokens, as ViT's encoder and head do")
        if kind not in CHANNELS_LAST or not all(isinstance(x, ChannelsLast) for x in xs):
            raise refuse(node, f"a {kind} of a tensor permuted to (N, H, W, C); snlite keeps (N, C, H, W) "
                               f"and computes only {', '.join(CHANNELS_LAST[1:-1])} over the channels "
                               "before the permute(0, 3, 1, 2) back, as ConvNeXt's blocks do")
        if kind == "token_select" and not tokens:
            raise refuse(node, "x[:, i] of a tensor permuted to (N, H, W, C); snlite reads one token of "
                               "tokens (N, T, D) only (ViT's class token)")
        nchw = (want[-1],) + want[:-1] if len(want) == 3 else want
        out = self.build(node, kind, hp, [x.node for x in xs], nchw, channels_last=True)
        return out if kind == "token_select" else ChannelsLast(out, tokens)

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

    def build(self, node, kind, hp, xs, want, channels_last=False):
        g, x = self.g, xs[0]
        if kind == "identity" or (kind in ("concat", "flatten", "adaptive_avgpool", "adaptive_maxpool")
                                  and len(xs) == 1
                                  and tuple(x.shape[1:]) == want):
            return x  # a one-tensor cat, a flatten of what is flat, an adaptive pool to the same size
        if kind == "reshape":  # a flatten, or nothing
            return self.reshape(node, x, want)
        if kind == "squeeze":
            return self.squeeze(node, hp, x)
        if kind == "log_softmax":  # nothing: softmax_loss applies it
            return self.log_softmax(node, hp, x)
        if kind == "layernorm":  # named for its module, or for the module owning its weight
            return self.layernorm(node, hp, x, channels_last)
        name = self.name(node, kind)
        if kind == "conv2d":
            return g.conv2d(x, hp["out_channels"], hp["kernel_size"], hp["stride"], hp["padding"], hp["bias"],
                            groups=hp["groups"], name=name)
        if kind == "linear" and channels_last:  # a Linear on each pixel's channels
            return g.pointwise_linear(x, hp["out_features"], hp["bias"], name=name)
        if kind == "linear":
            if len(x.shape) != 2:
                raise refuse(node, f"a Linear on a {len(x.shape)}-d input: snlite's acts on (N, features)")
            return g.linear(x, hp["out_features"], hp["bias"], name=name)
        if kind == "batchnorm":
            return g.batchnorm(x, hp["eps"], hp["momentum"], name=name)
        if kind in ACTIVATION:  # g.relu(x), g.elu(x, alpha), g.softplus(x, beta, threshold)...
            return getattr(g, kind)(x, *(hp[h] for h in ACTIVATION[kind]), name=name)
        if kind == "mul":
            return self.channel_scale(node, xs, name)
        if kind == "narrow":
            source, parts = x
            start, size = parts[hp["part"]]
            return g.narrow(source, start, size, name=name)
        if kind == "patch_merge" and channels_last:  # Swin's, on (N, H, W, C)
            return g.patch_merge(x, name=name)
        if kind == "token_select":
            if not channels_last:
                raise refuse(node, f"x[:, {hp['index']}] of a tensor {tuple(x.shape)}; snlite reads one "
                                   "token "
                                   "of tokens (N, T, D) only (ViT's class token, x[:, 0])")
            return g.token_select(x, hp["index"], name=name)
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
        if kind in ("dropout", "dropout2d"):
            return getattr(g, kind)(x, hp["p"], name=name)
        if kind in ("maxpool", "avgpool"):
            k = hp["kernel_size"]
            pool = g.maxpool if kind == "maxpool" else g.avgpool
            extra = {} if kind == "maxpool" else {"count_include_pad": hp["count_include_pad"]}
            stride = k if hp["stride"] in (None, ()) else hp["stride"]  # F.max_pool2d's stride=[] is kernel
            return pool(x, k, stride, hp["padding"], ceil_mode=bool(hp["ceil_mode"]), name=name, **extra)
        if kind in ("adaptive_avgpool", "adaptive_maxpool"):
            (h, w), (oh, ow) = x.shape[2:], want[1:]
            what = "average" if kind == "adaptive_avgpool" else "max"
            if h % oh or w % ow:
                raise refuse(node, f"adaptive {what} pooling from {h}x{w} to {oh}x{ow} has windows of "
                                   "different sizes, which no snlite layer computes yet; choose an input "
                                   f"size whose features divide into {oh}x{ow} (224x224 for torchvision's "
                                   "VGG and AlexNet)")
            return (g.avgpool if kind == "adaptive_avgpool" else g.maxpool)(x, (h // oh, w // ow), name=name)
        if kind == "concat":
            if hp["dim"] not in (1, -3) or any(len(a.shape) != 4 for a in xs):
                raise refuse(node, f"a cat along dim {hp['dim']}: snlite's concat joins (N, C, H, W) tensors "
                                   "along channels (dim 1)")
            return g.concat(xs, name=name)
        if kind == "flatten":
            if hp["start_dim"] in (2, -2) and hp["end_dim"] == -1 and len(x.shape) == 4:
                return Tokens(x)  # patches (N, D, H, W) to (N, D, T), as a ViT of one's own makes them
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

    def layernorm(self, node, hp, x, channels_last):
        """A LayerNorm over the channels of a channels-last tensor, or over the features of an (N,
        features) one, named as its module (or, for F.layer_norm, as the module owning its weight:
        LayerNorm2d's), its eps carried over."""
        if not (channels_last or len(x.shape) == 2) or tuple(hp["normalized_shape"]) != (x.shape[1],):
            shape = (x.shape[0],) + tuple(x.shape[2:]) + (x.shape[1],) if channels_last else x.shape
            raise refuse(node, f"a layer norm over {tuple(hp['normalized_shape'])} of a tensor {shape}; "
                               "snlite normalizes over the channels only, of an (N, C, H, W) tensor permuted "
                               "to (N, H, W, C) (ConvNeXt's LayerNorm and LayerNorm2d), or over the features "
                               "of an (N, features) one")
        if hp.get("params") is None:  # the module nn.LayerNorm
            return self.g.layernorm(x, hp["eps"], name=self.name(node, "layernorm"))
        params = [self.built.get(p) for p in hp["params"]]  # F.layer_norm's weight and bias: Param or not
        owners = {p.owner for p in params if isinstance(p, Param)}
        own = len(owners) == 1 and [p.attr for p in params] == ["weight", "bias"] and params[0].owner
        if not own or params[0].owner in self.used:
            raise refuse(node, "F.layer_norm with a weight and bias that are not one module's own weight and "
                               "bias, read once; snlite's layernorm owns its parameters")
        owner = owners.pop()
        name = self.legal(owner)
        self.used.update((owner, name))  # (its parameters read once)
        return self.g.layernorm(x, hp["eps"], name=name)

    def channel_scale(self, node, xs, name):
        """x * gate or gate * x, the gate (N, C, 1, 1) and x (N, C, H, W): squeeze-and-excitation's scale;
        or x times a parameter (C, 1, 1): ConvNeXt's layer scale, a layer named for the parameter's owner."""
        shapes = [tuple(a.shape) for a in xs]
        if len(xs) != 2:
            raise refuse(node, "a product with a number: no snlite layer scales by a constant")
        for x, gate in (xs, xs[::-1]):
            if len(x.shape) == 4 and tuple(gate.shape) == tuple(x.shape[:2]) + (1, 1):
                return self.g.channel_scale(x, gate, name=name)
        raise refuse(node, f"a product of tensors of shapes {shapes}; snlite multiplies only a feature map "
                           "(N, C, H, W) by a per-channel gate (N, C, 1, 1), as squeeze-and-excitation does")

    def with_param(self, node, kind, hp, xs):
        """A layer holding the parameter the forward reads itself: ``p * x`` (ConvNeXt's layer scale),
        ``torch.cat([p.expand(n, -1, -1), x], 1)`` (ViT's class token) or ``x + p`` (its position
        embedding)."""
        if kind == "mul":
            return self.layer_scale(node, xs)
        p = next(a for a in xs if isinstance(a, Param))
        x = next((a for a in xs if a is not p), None)
        value = dict(self.gm.named_parameters()).get(p.target)
        token = kind in ("concat", "add") and len(xs) == 2 and isinstance(x, ChannelsLast) and x.tokens
        if not token or value is None or p.target in self.params_used:
            raise refuse(node, f"it reads the parameter {p.target} itself, outside a submodule's call; "
                               "snlite reads such a "
                               "parameter only once, as F.layer_norm's weight and bias, as a per-channel "
                               "layer scale (C, 1, 1) * x, or on tokens (N, T, D) as ViT's class token "
                               "(torch.cat([token.expand(n, -1, -1), x], dim=1)) and position embedding "
                               "(x + p)")
        n, t, d = x.shape
        self.params_used.add(p.target)
        if kind == "concat":
            if hp["dim"] not in (1, -2) or xs[0] is not p or tuple(value.shape) != (1, 1, d):
                raise refuse(node, f"a cat of {p.target} {tuple(value.shape)} and tokens {x.shape} along dim "
                                   f"{hp['dim']}; snlite puts a (1, 1, D) token first, along dim 1 (ViT's)")
            out = self.g.class_token(x.node, param=p.target, name=self.name(node, "cat"))
        else:
            if tuple(value.shape) != (1, t, d):
                raise refuse(node, f"a sum of tokens {x.shape} and {p.target} {tuple(value.shape)}; snlite "
                                   f"adds a position embedding of shape (1, {t}, {d}) (ViT's)")
            name = self.legal(p.owner) if p.owner and p.owner not in self.used else \
                self.name(node, "pos_embedding")
            self.used.add(name)
            out = self.g.position_embedding(x.node, param=p.target, name=name)
        return ChannelsLast(out, tokens=True)

    def attention(self, node, hp, x):
        """PyTorch's MultiheadAttention of tokens (N, T, D) with themselves: snlite's three layers
        (:meth:`snlite.graph.Graph.multihead_attention`), named for the module."""
        if not (isinstance(x, ChannelsLast) and x.tokens):
            shape = getattr(x, "shape", None)
            raise refuse(node, f"a MultiheadAttention of a tensor {shape}; snlite attends over tokens "
                               "(N, T, D) "
                               "made from patches (ViT's conv_proj, reshape and permute(0, 2, 1))")
        self.used.update(f"{node.target}.{part}" for part in ("in_proj", "attention", "out_proj"))
        out = self.g.multihead_attention(x.node, hp["num_heads"], hp["bias"], name=self.legal(node.target))
        return Attended(ChannelsLast(out, tokens=True))

    def window_attention(self, node, hp, x):
        """torchvision's ``shifted_window_attention`` of an (N, C, H, W) node: snlite's three layers
        (:meth:`snlite.graph.Graph.swin_attention`), named for the module holding the bias table, whose
        qkv and proj Linears must be its own; torchvision's shift, 0 where the window covers the map."""
        bias = self.built.get(hp["relative_position_bias"])
        names = {k: getattr(self.built.get(hp[k]), "target", None) for k in
                 ("qkv_weight", "qkv_bias", "proj_weight", "proj_bias")}
        owner = bias.table.owner if isinstance(bias, RelativeBias) else None
        want = {"qkv_weight": f"{owner}.qkv.weight", "qkv_bias": f"{owner}.qkv.bias",
                "proj_weight": f"{owner}.proj.weight", "proj_bias": f"{owner}.proj.bias"}
        if owner is None or hp["logit_scale"] is not None or names != want or owner in self.used:
            raise refuse(node, "a shifted window attention that is not Swin V1's, with its own module's qkv "
                               "and proj Linears (biases included) and relative_position_bias_table; snlite "
                               "imports torchvision's SwinTransformer (not V2's cosine attention)")
        (h, w), window = x.shape[2:], tuple(hp["window_size"])
        shift = [0 if window[i] >= (h, w)[i] else s for i, s in enumerate(hp["shift_size"])]
        if h % window[0] or w % window[1] or window != bias.window:
            raise refuse(node, f"a window attention over a {h}x{w} map in windows of {window}; snlite needs "
                               "windows that tile the map (torchvision pads it): choose an input size whose "
                               "maps the windows tile (224x224 for torchvision's Swin)")
        self.used.update((owner, f"{owner}.qkv", f"{owner}.proj"))
        return self.g.swin_attention(x, hp["num_heads"], window, tuple(shift), name=self.legal(owner))

    def token_mean(self, node, hp, x):
        """``x.mean(dim=1)`` of tokens (N, T, D): their average, (N, D), an average pool over the T
        tokens and a flatten (a ViT of one's own, pooled without a class token)."""
        dims = hp["dim"] if isinstance(hp["dim"], (tuple, list)) else (hp["dim"],)
        if [d % 3 for d in dims if isinstance(d, int)] != [1] or len(dims) != 1 or hp["keepdim"]:
            raise refuse(node, f"a mean of tokens (N, T, D) over dims {hp['dim']} (keepdim={hp['keepdim']}); "
                               "snlite averages tokens over T only, to (N, D): x.mean(dim=1)")
        name = self.name(node, "mean")
        t = x.node.shape[2]
        return self.g.flatten(self.g.avgpool(x.node, (t, 1), name=name), name=f"{name}.flatten")

    def layer_scale(self, node, xs):
        """``p * x``, p a parameter (C, 1, 1) and x (N, C, H, W): a layer_scale layer named for p's owner."""
        if len(xs) != 2 or all(isinstance(a, Param) for a in xs):
            raise refuse(node, "a product of parameters, or of a parameter and a number: snlite multiplies "
                               "a feature map by a parameter (C, 1, 1) only (ConvNeXt's layer scale)")
        p, x = xs if isinstance(xs[0], Param) else xs[::-1]
        value = self.gm.get_parameter(p.target) if p.target in dict(self.gm.named_parameters()) else None
        if value is None or len(x.shape) != 4 or tuple(value.shape) != (x.shape[1], 1, 1):
            what = "a buffer" if value is None else f"a parameter of shape {tuple(value.shape)}"
            raise refuse(node, f"a product of {p.target} ({what}) and a tensor {tuple(x.shape)}; snlite "
                               "multiplies a feature map (N, C, H, W) by a parameter only per channel, "
                               "shaped (C, 1, 1) (ConvNeXt's layer scale)")
        if not p.owner:
            raise refuse(node, f"{p.target} is a parameter of the model itself; snlite names a parameter "
                               "<layer>.<name>, so hold it in a submodule (its layer is named for it)")
        if p.owner in self.used:
            raise refuse(node, f"it reads {p.target} a second time, or a layer already has the name "
                               f"{p.owner!r}; each snlite layer owns its parameters")
        self.used.add(p.owner)
        init = float(value.detach().reshape(-1)[0])
        return self.g.layer_scale(x, init=init, param=p.attr, name=self.legal(p.owner))

    def reshape(self, node, x, want):
        """``x.view(x.size(0), -1)``, ``x.reshape(n, -1)``, ``x.view(-1, C * H * W)``: a flatten (PyTorch
        traced them at batch 1, so the shape it gave says which: (batch, all the rest))."""
        features = 1
        for s in x.shape[1:]:
            features *= s
        if len(x.shape) == 4 and want == (x.shape[1], x.shape[2] * x.shape[3]):
            return Tokens(x)  # ViT's patches, (N, D, H, W) to (N, D, T)
        if want == (features,):
            return x if len(x.shape) == 2 else self.g.flatten(x, name=self.name(node, "flatten"))
        raise refuse(node, f"a reshape of {tuple(x.shape[1:])} to {want} per sample; snlite reshapes only to "
                           f"(N, features), a flatten: x.view(x.size(0), -1) or torch.flatten(x, 1)")

    def log_softmax(self, node, hp, x):
        """The model's last op, over the classes: no layer, since the softmax_loss snlite ends with
        applies it (log_softmax(log_softmax(z)) = log_softmax(z): the loss and gradients are the same)."""
        last = list(node.users) and all(u.op == "output" for u in node.users)
        if not last or len(x.shape) != 2 or hp["dim"] not in (1, -1):
            raise refuse(node, f"a log_softmax over dim {hp['dim']} that is not the model's last op on its "
                               "logits (N, classes); snlite takes it only there, where its softmax_loss "
                               "applies it")
        return x

    def squeeze(self, node, hp, x):
        """``x.squeeze()`` or ``x.squeeze((2, 3))`` of a pooled (N, C, 1, 1): a flatten. (PyTorch traced
        it at batch 1, where squeeze() drops the batch too; at batch N it keeps it.)"""
        dims = hp["dim"]
        if dims is not None:
            dims = {d % 4 for d in (dims if isinstance(dims, (tuple, list)) else (dims,))}
        if len(x.shape) == 4 and tuple(x.shape[2:]) == (1, 1) and (dims is None or dims == {2, 3}):
            return self.g.flatten(x, name=self.name(node, "flatten"))
        raise refuse(node, f"a squeeze of {tuple(x.shape)} over dims {hp['dim']}; snlite takes only the "
                           "squeeze of a pooled (N, C, 1, 1) to (N, C): x.squeeze(), x.squeeze((2, 3)) or "
                           "x.flatten(1)")
