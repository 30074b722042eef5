"""Sigmoid, SiLU, Hardsigmoid, Hardswish, Tanh, GELU (exact and tanh) and the channel scale
(kernels.sigmoid): each reference's backward is the gradient of its forward (central differences in
float64), the references compute what PyTorch computes at the ends of each piece, and the launchers
refuse a wrong shape by name. (Every kernel against its reference on the simulator:
tests/test_kernels.py.)"""
import importlib.util

import numpy as np
import pytest
from numba import cuda

from gradcheck import check_backward, rand64
from kernels import sigmoid as S

ACTIVATIONS = ("sigmoid", "silu", "hardsigmoid", "hardswish", "tanh", "gelu", "gelu_tanh")
KINKS = {"hardsigmoid": (-3.0, 3.0), "hardswish": (-3.0, 3.0)}


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_backward_ref_is_the_gradient_of_forward(act, rng):
    x = rand64(rng, 2, 3, 4, 5) * 3  # both sides of -3 and 3
    for k in KINKS.get(act, ()):
        x[np.abs(x - k) < 1e-3] = 0.5  # central differences away from the kinks
    assert (x < -3).any() and (x > 3).any()
    dy = rand64(rng, *x.shape)
    y = np.empty_like(x)
    forward_ref, backward_ref = getattr(S, f"{act}_forward_ref"), getattr(S, f"{act}_backward_ref")

    def forward():
        forward_ref(x, y)
        return y.copy()

    forward()
    dx = np.empty_like(x)
    backward_ref(y if act in S.FROM_OUTPUT else x, dy, dx)
    check_backward(act, forward, {"x": dx}, {"x": x}, dy)


def test_channel_scale_backward_ref_is_the_gradient_of_forward(rng):
    x, s, dy = rand64(rng, 2, 3, 4, 5), rand64(rng, 2, 3, 1, 1), rand64(rng, 2, 3, 4, 5)
    y = np.empty_like(x)

    def forward():
        S.channel_scale_forward_ref(x, s, y)
        return y.copy()

    dx, ds = np.empty_like(x), np.empty_like(s)
    S.channel_scale_backward_ref(x, s, dy, dx, ds)
    check_backward("channel_scale", forward, {"x": dx, "s": ds}, {"x": x, "s": s}, dy)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_references_compute_what_pytorch_computes(act):
    """At the ends of each piece (-3, 3, and just either side), at 0, and far out either side; the
    backward at a piece's end is PyTorch's choice of side."""
    import torch

    f = np.float32
    ends = [-3.0, 3.0] + [np.nextafter(f(a), f(b)) for a, b in ((-3, -4), (-3, 0), (3, 0), (3, 4))]
    x = np.array(ends + [0.0, -0.0, 1.5, -1.5, 20.0, -20.0, 80.0, -80.0], np.float32)
    dy = np.linspace(-2, 2, x.size).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    getattr(S, f"{act}_forward_ref")(x, y)
    getattr(S, f"{act}_backward_ref")(y if act in S.FROM_OUTPUT else x, dy, dx)
    t = torch.tensor(x, requires_grad=True)
    F = torch.nn.functional
    ty = F.gelu(t, approximate="tanh") if act == "gelu_tanh" else getattr(F, act)(t)
    ty.backward(torch.from_numpy(dy))
    # PyTorch's GELU takes a float32 erf, and 1 + erf(x / sqrt 2) cancels for negative x (at -3 it is
    # off by 5e-7, 1e-4 of the value); the reference's erf is float64's, rounded once
    atol = 1e-6 if act in ("gelu", "gelu_tanh") else 1e-7
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6, atol=atol, err_msg=f"{act} forward")
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-6, atol=atol, err_msg=f"{act} backward")


def test_saturated_sigmoid_is_0_or_1_without_a_warning():
    x = np.array([-1000.0, -90.0, 90.0, 1000.0], np.float32)
    y = np.empty_like(x)
    with np.errstate(over="raise", divide="raise", invalid="raise"):  # what NumPy warns of by default
        S.sigmoid_forward_ref(x, y)
    assert y.tolist() == [0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("name", ["sigmoid", "silu"])
def test_saturated_kernels_match_their_references_on_the_simulator(name):
    """exp(-x) of a very negative x is inf on a GPU (expf) and y saturates; the simulator's math.exp
    raised OverflowError there (kernels._common.exp32 gives inf, as the GPU does)."""
    x = np.array([-1000.0, -104.0, -89.0, 0.0, 89.0, 1000.0], np.float32)
    dy = np.ones_like(x)
    want, got = np.empty_like(x), cuda.device_array_like(x)
    with np.errstate(over="ignore"):
        getattr(S, f"{name}_forward_ref")(x, want)
    getattr(S, f"{name}_forward")(cuda.to_device(x), got)
    assert np.array_equal(got.copy_to_host(), want)
    if name == "silu":
        want_dx, dx = np.empty_like(x), cuda.device_array_like(x)
        with np.errstate(over="ignore", invalid="ignore"):
            S.silu_backward_ref(x, dy, want_dx)
        S.silu_backward(cuda.to_device(x), cuda.to_device(dy), dx)
        assert np.array_equal(dx.copy_to_host(), want_dx, equal_nan=True)


def test_channel_scale_launchers_name_what_is_wrong():
    x = cuda.to_device(np.zeros((2, 3, 4, 4), np.float32))
    with pytest.raises(ValueError, match=r"channel_scale_forward s: expected shape \(2, 3, 1, 1\), "
                                         r"got \(2, 3\)"):
        S.channel_scale_forward(x, cuda.to_device(np.zeros((2, 3), np.float32)), x)
    with pytest.raises(ValueError, match=r"channel_scale_forward: expected an \(N, C, H, W\) x, "
                                         r"got shape \(6, 16\)"):
        S.channel_scale_forward(cuda.to_device(np.zeros((6, 16), np.float32)), x, x)
    with pytest.raises(ValueError, match=r"hardswish_backward dx: expected shape \(2, 3, 4, 4\)"):
        S.hardswish_backward(x, x, cuda.to_device(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match=r"sigmoid_backward dy: expected shape \(2, 3, 4, 4\)"):
        S.sigmoid_backward(x, cuda.to_device(np.zeros((2, 3), np.float32)), x)


def test_the_layers_are_cheap_and_the_channel_scale_is_kept():
    """The activations (these and LeakyReLU; GELU's tanh approximation, not in the gated net, in
    tests/test_gelu_tanh.py) are cheap layers (dropped in forward, recomputed in backward, as ReLU);
    the channel scale, a join of two inputs, is a checkpoint as a residual add is; a gate of the
    wrong shape is refused when the graph is built."""
    from nets import gated_net
    from snlite.config import MemoryConfig
    from snlite.graph import Graph
    from snlite.scheduler import Scheduler

    g = gated_net()
    dropped = set(Scheduler(g, MemoryConfig(liveness=True, recompute="memory")).plan().recompute.dropped)
    for kind in [k for k in ACTIVATIONS if k != "gelu_tanh"] + ["leaky_relu"]:
        layers = [n for n, layer in g.layers.items() if layer.kind == kind]
        assert layers and set(layers) <= dropped, kind
    assert not {n for n, layer in g.layers.items() if layer.kind in ("channel_scale", "conv2d")} & dropped
    h = Graph(input_shape=(2, 3, 4, 4), num_classes=2)
    x = h.input()
    with pytest.raises(ValueError, match=r"channel_scale 'bad': expected an \(N, C, H, W\) input and an "
                                         r"\(N, C, 1, 1\) gate, got \(2, 3, 4, 4\) and \(2, 3, 2, 2\)"):
        h.channel_scale(x, h.avgpool(x, 2), name="bad")

