"""GELU's tanh approximation as a layer (kind ``gelu_tanh``; its kernels and their references are checked
with the other activations in tests/test_sigmoid.py and tests/test_kernels.py): a cheap layer, dropped
and recomputed (bit-identical under every preset and as planned: tests/test_executor.py; its whole-network
gradients against central differences: tests/test_train.py); host against the simulator; and PyTorch's
``GELU(approximate="tanh")`` imported, module and function, to PyTorch's logits and gradients."""
import importlib.util

import numpy as np
import pytest

from nets import data_for, gelu_tanh_net
from snlite.config import MemoryConfig
from snlite.device import CudaDevice, HostDevice
from snlite.scheduler import Scheduler
from snlite.train import Model

SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)


def _train(g, config, device="host", steps=2):
    x, labels = data_for(g)
    model = Model(g, config, device=device, seed=4)
    return [model.step(x, labels, **SGD) for _ in range(steps)], model.params, model


def test_the_layer_is_cheap_and_its_backward_reads_x_into_dys_buffer():
    g = gelu_tanh_net()
    acts = [n for n, layer in g.layers.items() if layer.kind == "gelu_tanh"]
    assert len(acts) == 3
    layer = g.layers[acts[0]]
    assert not layer.checkpoint and layer.bwd_reads == ("x", "dy") and layer.bwd_inplace
    dropped = set(Scheduler(g, MemoryConfig(liveness=True, recompute="memory")).plan().recompute.dropped)
    assert set(acts) <= dropped


def test_host_and_simulator_agree():
    g = gelu_tanh_net(n=1)
    x, labels = data_for(g)
    results = []
    for dev in (HostDevice(), CudaDevice()):
        model = Model(g, MemoryConfig.superneurons(), device=dev, seed=5)
        before = model.params
        results.append((model.step(x, labels, lr=0.1, momentum=0.9), before, model.params))
    (l0, b0, p0), (l1, b1, p1) = results
    assert l0 == pytest.approx(l1, rel=1e-5)
    for name in p0:
        np.testing.assert_array_equal(b0[name], b1[name])
        np.testing.assert_allclose((b1[name] - p1[name]) / 0.1, (b0[name] - p0[name]) / 0.1, rtol=1e-3,
                                   atol=1e-5, err_msg=name)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_from_torch_imports_the_tanh_approximation_as_pytorch_computes_it():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from snlite.torch_import import from_torch

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.act1 = nn.Conv2d(2, 4, 3, padding=1), nn.GELU(approximate="tanh")
            self.conv2, self.exact = nn.Conv2d(4, 4, 3, padding=1), nn.GELU()
            self.fc = nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            y = self.act1(self.conv1(x))
            y = self.exact(F.gelu(self.conv2(y), approximate="tanh") + y)
            return self.fc(y.flatten(1))

    torch.manual_seed(0)
    module = Net()
    g = from_torch(module, (2, 4, 4), batch=2)
    kinds = [layer.kind for layer in g.layers.values()]
    assert kinds.count("gelu_tanh") == 2 and kinds.count("gelu") == 1
    x, labels = data_for(g)
    model = Model(g, device="host")
    model.set_params(module.state_dict())
    loss, grads = model.forward_backward(x, labels)
    tl = F.cross_entropy(module(torch.from_numpy(x)), torch.from_numpy(labels).long())
    tl.backward()
    assert loss == pytest.approx(tl.item(), rel=1e-5)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
