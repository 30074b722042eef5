"""A vision transformer's layers (torchvision's VisionTransformer): self-attention, and the three
token layers around it (the class token, the position embedding, reading one token out); and the
Swin Transformer's two (window attention, patch merging).

snlite keeps a sequence of T tokens of D features, PyTorch's (N, T, D), as an (N, D, T, 1) map, the
layout of a channels-last tensor it never permutes: a token is a pixel, a feature a channel. So a
Linear on each token is a pointwise linear (a 1x1 convolution), a LayerNorm on each token normalizes
a pixel's channels, and the patch embedding's (N, D, H, W) output already holds T = H*W tokens in
PyTorch's order (row by row); every layer here reads an (N, C, H, W) input as H*W tokens.

Multi-head self-attention is three layers (:meth:`snlite.graph.Graph.multihead_attention`): the
in-projection (q, k and v of every token, 3D channels), :class:`Attention` (softmax(q k^T / sqrt(d))
v, head by head), and the out-projection. Attention is a checkpoint: its cost grows with T^2. It
saves one number per row of scores for its backward, the log of the row's softmax denominator (as
PyTorch's fused attention does), and recomputes the scores there: the T x T matrix of each head is
never stored, so its memory is the activations' (N, D, T) and not (N, heads, T, T).
"""
from __future__ import annotations

import math

import numpy as np

from snlite.layers_base import Layer


def _tokens(layer) -> tuple[int, int, int]:
    """(N, D, T) of the layer's (N, C, H, W) input read as T = H*W tokens of D = C features."""
    x = layer.in_shapes[0]
    if len(x) != 4:
        raise ValueError(f"{layer.kind} {layer.name!r}: expected tokens as an (N, D, T, 1) input (or an (N, "
                         f"D, H, W) map, H*W tokens), got {x}")
    return x[0], x[1], x[2] * x[3]


class Attention(Layer):
    """Softmax attention of each of ``heads`` heads over the T tokens (PyTorch's MultiheadAttention
    between its in_proj and its out_proj): the input holds q, k and v (3D channels, in that order,
    each split into heads of D / heads channels), the output the D channels of the heads' results."""

    kind = "attention"
    checkpoint = True
    fwd_writes = ("y", "lse")
    bwd_reads = ("x", "y", "dy", "lse")

    def infer_shape(self):
        n, c3, t = _tokens(self)
        heads = self.attrs["heads"]
        if c3 % 3 or (c3 // 3) % heads:
            raise ValueError(f"attention {self.name!r}: the input holds q, k and v, 3 * D channels with D "
                             f"divisible by heads={heads}; got {c3} channels")
        return (n, c3 // 3) + tuple(self.in_shapes[0][2:])

    def saved(self):
        n, _, t = _tokens(self)
        return {"lse": ((n, self.attrs["heads"], t), "float32")}

    def flops(self):
        n, c3, t = _tokens(self)
        return 4 * n * t * t * (c3 // 3)  # q k^T and p v, a multiply-add each

    def forward(self, io):
        io.run("attention_forward", io.x[0], io.y, io.saved["lse"], heads=self.attrs["heads"])

    def backward(self, io):
        io.run("attention_backward", io.x[0], io.y, io.dy, io.saved["lse"], io.dx[0],
               heads=self.attrs["heads"])


class ClassToken(Layer):
    """ViT's class token: a learned vector of D features put before the T tokens, (N, D, T + 1, 1) out;
    its parameter (1, 1, D) is PyTorch's ``class_token`` (attribute ``names`` gives its name)."""

    kind = "class_token"
    bwd_reads = ("dy",)

    def infer_shape(self):
        n, d, t = _tokens(self)
        return (n, d, t + 1, 1)

    def params(self):
        return {"class_token": (1, 1, self.out_shape[1])}

    def flops(self):
        return 0

    def init_params(self, rng):
        return {"class_token": np.zeros((1, 1, self.out_shape[1]), np.float32)}  # torchvision's zeros

    def forward(self, io):
        io.run("class_token_forward", io.x[0], io.params["class_token"], io.y)

    def backward(self, io):
        io.run("class_token_backward", io.dy, io.dx[0], io.grads["class_token"])


class PositionEmbedding(Layer):
    """ViT's learned position embedding: a parameter (1, T, D) added to the tokens; its backward
    passes dy on as dx (in dy's buffer) and sums it over the batch for the parameter's gradient."""

    kind = "position_embedding"
    bwd_inplace = True

    def infer_shape(self):
        _tokens(self)
        return self.in_shapes[0]

    def params(self):
        n, d, t = _tokens(self)
        return {"pos_embedding": (1, t, d)}

    def init_params(self, rng):  # torchvision's: normal, std 0.02
        shape = self.params()["pos_embedding"]
        return {"pos_embedding": (rng.standard_normal(shape) * 0.02).astype(np.float32)}

    def forward(self, io):
        io.run("position_embedding_forward", io.x[0], io.params["pos_embedding"], io.y)

    def backward(self, io):
        io.run("position_embedding_backward", io.dy, io.grads["pos_embedding"])
        # io.dx[0] is io.dy's buffer: the gradient passes through


class TokenSelect(Layer):
    """One token's D features, (N, D) out: PyTorch's ``x[:, index]`` of (N, T, D) (ViT reads the class
    token, ``index`` 0, into its head)."""

    kind = "token_select"
    bwd_reads = ("dy",)

    def infer_shape(self):
        n, d, t = _tokens(self)
        index = self.attrs["index"]
        if not -t <= index < t:
            raise ValueError(f"token_select {self.name!r}: index {index} is outside the {t} tokens")
        return (n, d)

    def flops(self):
        return 0

    def forward(self, io):
        io.run("token_select_forward", io.x[0], io.y, index=self.attrs["index"])

    def backward(self, io):
        io.run("token_select_backward", io.dy, io.dx[0], index=self.attrs["index"])


class WindowAttention(Layer):
    """Swin's window attention, between its qkv and proj Linears (torchvision's
    ``shifted_window_attention``): each pixel of an (N, 3C, H, W) map of q, k and v attends to the
    pixels of its ``window`` (wh, ww), in ``heads`` heads, with a learned bias for each relative position
    (PyTorch's ``relative_position_bias_table``, ((2 wh - 1)(2 ww - 1), heads)); with ``shift`` (sh, sw)
    the windows are those of the map rolled by (-sh, -sw), and pixels from different regions of the roll
    are kept apart by -100 added to their scores (torchvision's; a side the window covers is not
    shifted). Saves each row's log-sum-exp, as :class:`Attention`."""

    kind = "window_attention"
    checkpoint = True
    fwd_writes = ("y", "lse")
    bwd_reads = ("x", "y", "dy", "lse")

    def infer_shape(self):
        x = self.in_shapes[0]
        heads, (wh, ww), (sh, sw) = self.attrs["heads"], self.attrs["window"], self.attrs["shift"]
        if len(x) != 4 or x[1] % 3 or (x[1] // 3) % heads:
            raise ValueError(f"window_attention {self.name!r}: expected q, k and v as an (N, 3C, H, W) map "
                             f"with C divisible by heads={heads}, got {x}")
        if x[2] % wh or x[3] % ww:
            raise ValueError(f"window_attention {self.name!r}: windows of {wh}x{ww} do not tile the "
                             f"{x[2]}x{x[3]} map (torchvision pads it; snlite does not yet)")
        if not (0 <= sh < wh and 0 <= sw < ww) or (sh and wh == x[2]) or (sw and ww == x[3]):
            raise ValueError(f"window_attention {self.name!r}: shift {(sh, sw)} must be smaller than the "
                             f"window {(wh, ww)}, and 0 where the window covers the {x[2]}x{x[3]} map")
        return (x[0], x[1] // 3) + tuple(x[2:])

    def params(self):
        (wh, ww), heads = self.attrs["window"], self.attrs["heads"]
        return {"relative_position_bias_table": ((2 * wh - 1) * (2 * ww - 1), heads)}

    def saved(self):
        n, _, h, w = self.out_shape
        return {"lse": ((n, self.attrs["heads"], h, w), "float32")}

    def flops(self):
        wh, ww = self.attrs["window"]
        return 4 * math.prod(self.out_shape) * wh * ww  # q k^T and p v over each window

    def init_params(self, rng):  # torchvision's: a normal of std 0.02, truncated at 2 std
        shape = self.params()["relative_position_bias_table"]
        return {"relative_position_bias_table": (np.clip(rng.standard_normal(shape), -2, 2) * 0.02)
                .astype(np.float32)}

    def relative_position_index(self) -> np.ndarray:
        """torchvision's buffer: for each pair (i, j) of a window's pixels, row-major, the table row of
        their offset, (a_i - a_j + wh - 1) * (2 ww - 1) + (b_i - b_j + ww - 1); (wh ww)^2 values."""
        wh, ww = self.attrs["window"]
        a, b = np.divmod(np.arange(wh * ww), ww)
        index = (a[:, None] - a[None, :] + wh - 1) * (2 * ww - 1) + (b[:, None] - b[None, :] + ww - 1)
        return index.reshape(-1)

    def _kw(self):
        return {k: self.attrs[k] for k in ("heads", "window", "shift")}

    def forward(self, io):
        io.run("window_attention_forward", io.x[0], io.params["relative_position_bias_table"], io.y,
               io.saved["lse"], **self._kw())

    def backward(self, io):
        io.run("window_attention_backward", io.x[0], io.params["relative_position_bias_table"], io.y, io.dy,
               io.saved["lse"], io.dx[0], io.grads["relative_position_bias_table"], **self._kw())


class PatchMerge(Layer):
    """Swin's patch merging before its Linear: each 2x2 block of pixels of (N, C, H, W) becomes one pixel
    of 4C channels, (N, 4C, H/2, W/2), in torchvision's order (x[0::2, 0::2], x[1::2, 0::2], x[0::2,
    1::2], x[1::2, 1::2])."""

    kind = "patch_merge"
    bwd_reads = ("dy",)

    def infer_shape(self):
        x = self.in_shapes[0]
        if len(x) != 4 or x[2] % 2 or x[3] % 2:
            raise ValueError(f"patch_merge {self.name!r}: expected an (N, C, H, W) map with even H and W, "
                             f"got {x} (torchvision pads an odd side; snlite does not yet)")
        return (x[0], 4 * x[1], x[2] // 2, x[3] // 2)

    def flops(self):
        return 0

    def forward(self, io):
        io.run("patch_merge_forward", io.x[0], io.y)

    def backward(self, io):
        io.run("patch_merge_backward", io.dy, io.dx[0])
