"""The activations: cheap layers, each dropped after the forward pass and recomputed in backward
(docs/paper.md section 4), each backward writing dx into dy's buffer. ReLU's backward reads x, y and
dy (cuDNN's convention); Sigmoid's and Tanh's read y and dy; every other one reads x and dy, and runs
its kernels the one way :class:`SiLU` does.
"""
from __future__ import annotations

from kernels.elu import SELU_ALPHA, SELU_SCALE
from snlite.layers_base import Layer


class ReLU(Layer):
    kind = "relu"
    bwd_reads = ("x", "y", "dy")
    bwd_inplace = True

    def forward(self, io):
        io.run("relu_forward", io.x[0], io.y)

    def backward(self, io):
        io.run("relu_backward", io.x[0], io.y, io.dy, io.dx[0])


class ReLU6(ReLU):
    """PyTorch's ReLU6, min(max(x, 0), 6): cheap, recomputed like ReLU, its gradient written into
    dy's buffer as ReLU's is."""

    kind = "relu6"

    def forward(self, io):
        io.run("relu6_forward", io.x[0], io.y)

    def backward(self, io):
        io.run("relu6_backward", io.x[0], io.y, io.dy, io.dx[0])


class Sigmoid(Layer):
    """PyTorch's Sigmoid, 1 / (1 + exp(-x)): squeeze-and-excitation's gate. Cheap, recomputed like
    ReLU; its backward reads the output, not the input (dx = dy (1 - y) y), into dy's buffer. Tanh is
    the same kind of layer, with its own kernels."""

    kind = "sigmoid"
    bwd_reads = ("y", "dy")
    bwd_inplace = True

    def forward(self, io):
        io.run(f"{self.kind}_forward", io.x[0], io.y)

    def backward(self, io):
        io.run(f"{self.kind}_backward", io.y, io.dy, io.dx[0])


class Tanh(Sigmoid):
    """PyTorch's Tanh (dx = dy (1 - y y))."""

    kind = "tanh"


class SiLU(Layer):
    """PyTorch's SiLU, x * sigmoid(x) (EfficientNet's activation). Cheap, recomputed like ReLU; its
    backward reads the input and dy, and writes dx into dy's buffer. Every activation below is the
    same kind of layer: its kernels are ``<op>_forward(x, y, **hyper)`` and ``<op>_backward(x, dy,
    dx, **hyper)``, ``op`` its kind unless it says otherwise (SELU and CELU run ELU's kernels)."""

    kind = "silu"
    op = None
    bwd_reads = ("x", "dy")
    bwd_inplace = True

    def hyper(self) -> dict:
        """The kernels' hyper-parameters."""
        return {}

    def forward(self, io):
        io.run(f"{self.op or self.kind}_forward", io.x[0], io.y, **self.hyper())

    def backward(self, io):
        io.run(f"{self.op or self.kind}_backward", io.x[0], io.dy, io.dx[0], **self.hyper())


class LeakyReLU(SiLU):
    """PyTorch's LeakyReLU: x where x > 0, else ``negative_slope`` times x."""

    kind = "leaky_relu"
    builder_args = ("negative_slope",)

    def hyper(self) -> dict:
        return {"negative_slope": self.attrs["negative_slope"]}


class Hardsigmoid(SiLU):
    """PyTorch's Hardsigmoid, min(max(x + 3, 0), 6) / 6: MobileNet-V3's gate."""

    kind = "hardsigmoid"


class Hardswish(SiLU):
    """PyTorch's Hardswish, x * hardsigmoid(x): MobileNet-V3's activation."""

    kind = "hardswish"


class GELU(SiLU):
    """PyTorch's GELU (exact: x times the normal distribution's cdf at x)."""

    kind = "gelu"


class GELUTanh(SiLU):
    """PyTorch's GELU with ``approximate="tanh"``: x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""

    kind = "gelu_tanh"


class ELU(SiLU):
    """PyTorch's ELU: x where x > 0, else alpha (exp(x) - 1). SELU and CELU are the same kernels with
    other constants (``kernels.elu``: scale, alpha, and the input's scale)."""

    kind = "elu"
    builder_args = ("alpha",)
    op = "elu"

    def hyper(self) -> dict:
        return {"alpha": self.attrs["alpha"], "scale": 1.0, "input_scale": 1.0}


class SELU(ELU):
    """PyTorch's SELU: a scaled ELU whose constants keep activations normalized."""

    kind = "selu"
    builder_args = ()  # ELU's alpha is fixed here

    def hyper(self) -> dict:
        return {"alpha": SELU_ALPHA, "scale": SELU_SCALE, "input_scale": 1.0}


class CELU(ELU):
    """PyTorch's CELU: x where x > 0, else alpha (exp(x / alpha) - 1)."""

    kind = "celu"
    builder_args = ("alpha",)

    def hyper(self) -> dict:
        return {"alpha": self.attrs["alpha"], "scale": 1.0, "input_scale": 1.0 / self.attrs["alpha"]}


class Softplus(SiLU):
    """PyTorch's Softplus: log(1 + exp(beta x)) / beta, and x itself where beta x > threshold."""

    kind = "softplus"
    builder_args = ("beta", "threshold")

    def hyper(self) -> dict:
        return {"beta": self.attrs["beta"], "threshold": self.attrs["threshold"]}


class Mish(SiLU):
    """PyTorch's Mish: x tanh(softplus(x))."""

    kind = "mish"


# every activation: one input, elementwise (so it computes on a channels-last tensor as on any), cheap
# (recomputed), built by g.<kind>(x, *builder_args, name=...); LAYER_TYPES and from_torch's walk take them
# from here
ACTIVATIONS = (ReLU, ReLU6, LeakyReLU, Sigmoid, Tanh, SiLU, Hardsigmoid, Hardswish, GELU, GELUTanh, ELU, SELU,
               CELU, Softplus, Mish)
