"""What the import walk (:mod:`snlite.torch_walk`) follows without a layer of its own: nodes of the
traced module that move no data.

A parameter the forward reads itself (:class:`Param`) becomes part of the layer that reads it
(LayerNorm2d's weight and bias, ConvNeXt's layer scale, ViT's class token and position embedding). A
permute to channels-last (:class:`ChannelsLast`) moves no data: snlite keeps (N, C, H, W), and what
reads the permuted tensor (a LayerNorm, a Linear, an activation) works over the channels until the
permute back. ViT's reshape of its patches (N, D, H, W) to (N, D, T) (:class:`Tokens`) and permute to
(N, T, D) move nothing either: snlite's token layers read H*W tokens (:mod:`snlite.layers_attention`).
And what a MultiheadAttention call returns (:class:`Attended`) is a pair only the walk's getitem opens.
"""
from __future__ import annotations

from snlite.torch_nodes import refuse


class Param:
    """A parameter the forward reads itself (an fx ``get_attr`` node): ``target`` is its state_dict name.
    Only LayerNorm's weight and bias (F.layer_norm), a layer scale (``param * x``), ViT's class token
    (``torch.cat([p.expand(n, -1, -1), x], 1)``) and its position embedding (``x + p``) may read one."""

    def __init__(self, target: str):
        self.target = target
        self.owner, _, self.attr = target.rpartition(".")


class ChannelsLast:
    """PyTorch's ``node.permute(0, 2, 3, 1)``: the same numbers as the snlite node ``node`` (N, C, H, W),
    which stays in that layout; what reads it works over the channels (CHANNELS_LAST). With ``tokens``,
    PyTorch's (N, T, D) of ViT's encoder: the node's H*W pixels are the T tokens, its C channels D."""

    def __init__(self, node, tokens=False):
        n, c, *pixels = node.shape
        pixels = [pixels[0] * pixels[1]] if tokens else pixels
        self.node, self.tokens, self.shape = node, tokens, (n, *pixels, c)


class Tokens:
    """PyTorch's ``x.reshape(n, D, H * W)`` of an (N, D, H, W) snlite node (ViT's patches): the same
    numbers, which only a permute(0, 2, 1) to (N, T, D) may read."""

    def __init__(self, node):
        n, c, h, w = node.shape
        self.node, self.shape = node, (n, c, h * w)


class Attended:
    """What a MultiheadAttention call returns: (output, weights); snlite forms no weights."""

    def __init__(self, out):
        self.parts = (out, None)


def permuted(node, dims, x):
    """No layer: ConvNeXt's permute(0, 2, 3, 1) marks the tensor channels-last, permute(0, 3, 1, 2)
    brings it back; ViT's permute(0, 2, 1) makes its patches (N, D, T) tokens (N, T, D). The numbers
    never move."""
    dims = tuple(d % len(dims) for d in dims)
    if dims == (0, 2, 3, 1) and not isinstance(x, (ChannelsLast, Tokens)) and len(x.shape) == 4:
        return ChannelsLast(x)
    if dims == (0, 3, 1, 2) and isinstance(x, ChannelsLast) and not x.tokens:
        return x.node
    if dims == (0, 2, 1) and isinstance(x, Tokens):
        return ChannelsLast(x.node, tokens=True)
    if dims == (0, 2, 1) and isinstance(x, ChannelsLast) and x.tokens:
        return Tokens(x.node)
    raise refuse(node, f"a permute to {dims}: snlite keeps tensors (N, C, H, W) and follows only "
                       "permute(0, 2, 3, 1) to channels-last and permute(0, 3, 1, 2) back (ConvNeXt's), "
                       "and permute(0, 2, 1) of patches reshaped to (N, D, T) (ViT's)")


class RelativeBias:
    """Swin's ``_get_relative_position_bias(table, index, window)``: the table (a :class:`Param`) spread
    over each window's pairs of pixels; the window attention layer holds the table and reads it so."""

    def __init__(self, table: Param, window):
        self.table, self.window = table, tuple(window)
