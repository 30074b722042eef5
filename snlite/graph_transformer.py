"""The builder methods of a vision transformer's layers (ViT's and Swin's), which :class:`snlite.graph.Graph`
inherits: multi-head self-attention and its core, Swin's window attention and patch merging, the class
token, the position embedding and the token read out. Tokens are (N, D, T, 1): a map's pixels, or T
tokens of D features (:mod:`snlite.layers_attention` holds the layers, :mod:`snlite.torch_walk` builds
them from torchvision's models).
"""
from __future__ import annotations

from snlite.checks import int_pair, integer, is_int, who


class TransformerBuilders:
    """Methods of :class:`snlite.graph.Graph`, each returning the :class:`~snlite.graph.Node` of its
    output (built with the graph's ``_add``, ``_numbered`` and ``pointwise_linear``)."""

    def multihead_attention(self, x, heads, bias=True, name=None):
        """PyTorch's ``MultiheadAttention(D, heads, batch_first=True)`` of the tokens x with themselves
        (self-attention; no mask, no dropout), x holding T tokens of D features as (N, D, T, 1) (an (N,
        D, H, W) map is H*W tokens). Three layers: ``<name>.in_proj`` (q, k and v, a pointwise linear to
        3D whose parameters are PyTorch's ``<name>.in_proj_weight`` and ``<name>.in_proj_bias``),
        ``<name>.attention`` (:class:`snlite.layers_attention.Attention`) and ``<name>.out_proj``."""
        what = who("multihead_attention", name)
        if getattr(x, "graph", None) is not self or len(x.shape) != 4:
            raise ValueError(f"{what}: expected tokens as an (N, D, T, 1) node, got {x!r}")
        d, heads = x.shape[1], integer(heads, f"{what}: heads")
        if d % heads:
            raise ValueError(f"{what}: heads={heads} must divide the {d} features of each token")
        name = self._numbered("mha") if name is None else name
        names = {"weight": f"{name}.in_proj_weight", "bias": f"{name}.in_proj_bias"}
        qkv = self._add("conv2d", [x], f"{name}.in_proj", out_channels=3 * d, kernel=(1, 1), stride=(1, 1),
                        padding=(0, 0), bias=bool(bias), linear_weight=True, names=names)
        return self.pointwise_linear(self.attention(qkv, heads, name=f"{name}.attention"), d, bias,
                                     name=f"{name}.out_proj")

    def attention(self, qkv, heads, name=None):
        """Softmax attention of q, k and v (the 3D channels of ``qkv``, in that order) over its tokens,
        in ``heads`` heads: (N, D, T, 1) out. :meth:`multihead_attention` puts it between two projections."""
        return self._add("attention", [qkv], name, heads=integer(heads, f"{who('attention', name)}: heads"))

    def swin_attention(self, x, heads, window, shift=0, bias=True, name=None):
        """Swin's attention block (torchvision's ``ShiftedWindowAttention``) on an (N, C, H, W) map: three
        layers, ``<name>.qkv`` (a pointwise linear to 3C), ``<name>`` (:meth:`window_attention`, holding
        the relative position bias table) and ``<name>.proj``, named as torchvision's modules are."""
        what = who("swin_attention", name)
        if getattr(x, "graph", None) is not self or len(x.shape) != 4:
            raise ValueError(f"{what}: expected an (N, C, H, W) node, got {x!r}")
        c = x.shape[1]
        name = self._numbered("swin_attn") if name is None else name
        qkv = self.pointwise_linear(x, 3 * c, bias, name=f"{name}.qkv")
        return self.pointwise_linear(self.window_attention(qkv, heads, window, shift, name=name), c, bias,
                                     name=f"{name}.proj")

    def window_attention(self, qkv, heads, window, shift=0, name=None):
        """Each pixel's q (of ``qkv``'s 3C channels: q, k, v) attending to the pixels of its ``window``,
        in ``heads`` heads, with a learned relative position bias; ``shift`` rolls the windows (Swin's
        every second block). (N, C, H, W) out."""
        what = who("window_attention", name)
        return self._add("window_attention", [qkv], name, heads=integer(heads, f"{what}: heads"),
                         window=int_pair(window, f"{what}: window"),
                         shift=int_pair(shift, f"{what}: shift", 0))

    def patch_merge(self, x, name=None):
        """Swin's patch merging: each 2x2 block of pixels one pixel of 4C channels, (N, 4C, H/2, W/2)."""
        return self._add("patch_merge", [x], name)

    def class_token(self, x, param="class_token", name=None):
        """ViT's class token, a learned (1, 1, D) parameter, put before the T tokens of x: (N, D, T + 1,
        1). The parameter is the model's own, named ``param`` (torchvision's ``class_token``)."""
        if not isinstance(param, str) or not param or "@" in param:
            raise ValueError(f"{who('class_token', name)}: param must name the parameter (a non-empty string "
                             f"without '@', e.g. 'class_token'), got {param!r}")
        return self._add("class_token", [x], name, names={"class_token": param})

    def position_embedding(self, x, param=None, name=None):
        """ViT's learned position embedding, a (1, T, D) parameter added to the T tokens of x, named
        ``param`` (default ``<name>.pos_embedding``, torchvision's ``encoder.pos_embedding``)."""
        if param is not None and (not isinstance(param, str) or not param or "@" in param):
            raise ValueError(f"{who('position_embedding', name)}: param must name the parameter (a non-empty "
                             f"string without '@'), got {param!r}")
        names = {"names": {"pos_embedding": param}} if param else {}
        return self._add("position_embedding", [x], name, **names)

    def token_select(self, x, index=0, name=None):
        """Token ``index`` of x's T tokens, (N, D): PyTorch's ``x[:, index]`` (ViT's class token, 0)."""
        what = who("token_select", name)
        if not is_int(index):
            raise ValueError(f"{what}: index must be an integer, got {index!r}")
        return self._add("token_select", [x], name, index=int(index))
