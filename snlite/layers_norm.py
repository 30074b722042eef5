"""The normalizations and the layer scale: BatchNorm2d (per channel, over the batch), LayerNorm (per
pixel, over the channels: ConvNeXt's), LRN (across neighbouring channels), and LayerScale (ConvNeXt's
learned per-channel multiplier at the end of each block). None is a checkpoint: each is cheap to
compute again from its input, so Cost-Aware Recomputation drops their outputs (docs/paper.md
section 4), as the paper does with BN and LRN.
"""
from __future__ import annotations

import math

import numpy as np

from snlite.layers_base import Layer


def _as_4d(layer, *views):
    """``views`` as the kernels take them, (N, C, H, W): an (N, C) layer's reshaped to (N, C, 1, 1),
    no copy (a normalization of an MLP's features is the same computation on 1x1 maps)."""
    if len(layer.out_shape) == 4:
        return views
    return tuple(v.reshape(layer.out_shape + (1, 1)) for v in views)


def _check_rank(layer, what):
    x = layer.in_shapes[0]
    if len(x) not in (2, 4):
        raise ValueError(f"{layer.kind} {layer.name!r}: expected an (N, C, H, W) input, or (N, features) "
                         f"({what}), got {x}")
    return x


class BatchNorm2d(Layer):
    """PyTorch's BatchNorm2d on (N, C, H, W), and its BatchNorm1d on (N, features): per channel (or
    feature), over the batch and the pixels."""

    kind = "batchnorm"
    fwd_writes = ("y", "save_mean", "save_invstd")
    bwd_reads = ("x", "dy", "save_mean", "save_invstd")

    def infer_shape(self):
        x = _check_rank(self, "PyTorch's BatchNorm1d")
        if math.prod(x) // x[1] < 2:
            values, torch_name = ("N*H*W", "BatchNorm2d") if len(x) == 4 else ("N", "BatchNorm1d")
            raise ValueError(f"batchnorm {self.name!r}: training needs more than 1 value per channel "
                             f"({values}), got input {x}, as PyTorch's {torch_name} does: a batch of at "
                             "least 2")
        return x

    def params(self):
        return {"weight": (self.out_shape[1],), "bias": (self.out_shape[1],)}

    def buffers(self):
        return {"running_mean": (self.out_shape[1],), "running_var": (self.out_shape[1],)}

    def saved(self):
        c = (self.out_shape[1],)
        return {"save_mean": (c, "float32"), "save_invstd": (c, "float32")}

    def flops(self):
        return 8 * math.prod(self.out_shape)

    def init_params(self, rng):
        c = self.out_shape[1]
        return {"weight": np.ones(c, np.float32), "bias": np.zeros(c, np.float32),
                "running_mean": np.zeros(c, np.float32), "running_var": np.ones(c, np.float32)}

    def forward(self, io):
        p, b = io.params, io.buffers
        x, y = _as_4d(self, io.x[0], io.y)
        if io.train:
            io.run("batchnorm_forward_train", x, p["weight"], p["bias"], y, b["running_mean"],
                   b["running_var"], io.saved["save_mean"], io.saved["save_invstd"],
                   momentum=self.attrs["momentum"], eps=self.attrs["eps"], update_running=io.update_running)
        else:
            io.run("batchnorm_forward_infer", x, p["weight"], p["bias"], b["running_mean"],
                   b["running_var"], y, eps=self.attrs["eps"])

    def backward(self, io):
        x, dy, dx = _as_4d(self, io.x[0], io.dy, io.dx[0])
        io.run("batchnorm_backward", x, dy, io.params["weight"], io.saved["save_mean"],
               io.saved["save_invstd"], dx, io.grads["weight"], io.grads["bias"])


class LRN(Layer):
    """Cross-channel local response normalisation, as PyTorch's LocalResponseNorm."""

    kind = "lrn"
    bwd_reads = ("x", "y", "dy")
    bwd_inplace = True

    def infer_shape(self):
        x = self.in_shapes[0]
        if len(x) < 3:
            raise ValueError(f"lrn {self.name!r}: expected an (N, C, H, W) input (PyTorch's "
                             f"LocalResponseNorm needs 3 dimensions or more), got shape {x}")
        return x

    def flops(self):
        return 2 * self.attrs["size"] * math.prod(self.out_shape)

    def _kw(self):
        return {k: self.attrs[k] for k in ("size", "alpha", "beta", "k")}

    def forward(self, io):
        io.run("lrn_forward", io.x[0], io.y, **self._kw())

    def backward(self, io):
        io.run("lrn_backward", io.x[0], io.y, io.dy, io.dx[0], **self._kw())


class LayerNorm(Layer):
    """PyTorch's LayerNorm over the channels of an (N, C, H, W) map: at each pixel the C numbers are
    normalized (mean 0, biased variance 1, ``eps`` added to the variance), then scaled and shifted per
    channel (``weight``, ``bias`` of shape (C,)). ConvNeXt computes it as ``x.permute(0, 2, 3, 1)``,
    ``LayerNorm(C)`` and a permute back; snlite keeps the NCHW layout and normalizes across channels
    instead of moving the data twice. The forward saves each pixel's mean and 1 / std for the backward.
    On (N, features) it is PyTorch's LayerNorm(features) of an MLP: each sample normalized."""

    kind = "layernorm"
    fwd_writes = ("y", "save_mean", "save_rstd")
    bwd_reads = ("x", "dy", "save_mean", "save_rstd")

    def infer_shape(self):
        return _check_rank(self, "each pixel, or each sample, normalized over the channels")

    def params(self):
        return {"weight": (self.out_shape[1],), "bias": (self.out_shape[1],)}

    def saved(self):
        n, _, h, w = self.out_shape if len(self.out_shape) == 4 else self.out_shape + (1, 1)
        return {"save_mean": ((n, h, w), "float32"), "save_rstd": ((n, h, w), "float32")}

    def flops(self):
        return 8 * math.prod(self.out_shape)

    def init_params(self, rng):
        c = self.out_shape[1]
        return {"weight": np.ones(c, np.float32), "bias": np.zeros(c, np.float32)}

    def forward(self, io):
        x, y = _as_4d(self, io.x[0], io.y)
        io.run("layer_norm_forward", x, io.params["weight"], io.params["bias"], y,
               io.saved["save_mean"], io.saved["save_rstd"], eps=self.attrs["eps"])

    def backward(self, io):
        x, dy, dx = _as_4d(self, io.x[0], io.dy, io.dx[0])
        io.run("layer_norm_backward", x, dy, io.params["weight"], io.saved["save_mean"],
               io.saved["save_rstd"], dx, io.grads["weight"], io.grads["bias"])


class LayerScale(Layer):
    """ConvNeXt's layer scale: x (N, C, H, W) times a learned per-channel parameter of shape (C, 1, 1),
    named ``param`` (attribute; torchvision's ConvNeXt calls it ``layer_scale``), starting at ``init``
    (ConvNeXt's 1e-6: each residual block starts near the identity). Its backward reads x and dy:
    the parameter's gradient is dy * x summed over (n, h, w)."""

    kind = "layer_scale"
    bwd_reads = ("x", "dy")

    def infer_shape(self):
        x = self.in_shapes[0]
        if len(x) != 4:
            raise ValueError(f"layer_scale {self.name!r}: expected an (N, C, H, W) input, got {x}")
        return x

    def params(self):
        return {self.attrs["param"]: (self.out_shape[1], 1, 1)}

    def flops(self):
        return math.prod(self.out_shape)

    def init_params(self, rng):
        return {self.attrs["param"]: np.full((self.out_shape[1], 1, 1), self.attrs["init"], np.float32)}

    def forward(self, io):
        io.run("layer_scale_forward", io.x[0], io.params[self.attrs["param"]], io.y)

    def backward(self, io):
        p = self.attrs["param"]
        io.run("layer_scale_backward", io.x[0], io.params[p], io.dy, io.dx[0], io.grads[p])
