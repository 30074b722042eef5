"""A vision transformer's layers (torchvision's VisionTransformer): self-attention, and the three
token layers around it (the class token, the position embedding, reading one token out).

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
