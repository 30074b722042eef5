"""Small PyTorch modules the importer's tests share (``tests/test_from_torch*.py``): a network whose
forward each test chooses, a module holding one parameter its owner's forward reads, and the check that
an import is refused with the words a user needs. Imported only once a test file has skipped without
torch."""
import pytest
import torch
from torch import nn

from snlite.torch_import import TorchImportError, from_torch


class Net(nn.Module):
    """A small network whose forward is chosen per test."""

    def __init__(self, forward, **modules):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        for k, m in modules.items():
            self.add_module(k, m)
        self.fc = nn.Linear(4 * 8 * 8, 5)
        self._fwd = forward

    def forward(self, x):
        return self.fc(torch.flatten(self._fwd(self, self.body(x)), 1))


def refused(net, *words):
    with pytest.raises(TorchImportError) as e:
        from_torch(net, (3, 8, 8), batch=2)
    for w in words:
        assert w in str(e.value), str(e.value)
    return str(e.value)


class Scale(nn.Module):
    """A parameter its owner's forward reads itself, as ConvNeXt's layer scale and ViT's class token
    and position embedding are read."""

    def __init__(self, *shape):
        super().__init__()
        self.gamma = nn.Parameter(torch.full(shape, 0.5))
