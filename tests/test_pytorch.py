"""Weights exchange with PyTorch: the same parameters give the same loss, gradients and SGD step.

PyTorch is not a dependency of snlite; this test runs where it is installed and is skipped,
with the reason shown, elsewhere."""
import numpy as np
import pytest

from snlite.config import MemoryConfig
from snlite.graph import Graph
from snlite.train import Model

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the exchange test needs it")
nn = torch.nn


def build(n=4):
    g = Graph(input_shape=(n, 3, 12, 12), num_classes=5, name="exchange")
    x = g.input()
    c1 = g.conv2d(x, 6, 3, stride=1, padding=1, name="conv1")
    a = g.relu(g.batchnorm(c1, name="bn1"), name="relu1")
    b = g.conv2d(a, 6, (1, 3), padding=(0, 1), name="conv2")
    y = g.lrn(g.add(b, c1, name="add"), size=3, name="lrn")
    y = g.avgpool(g.maxpool(y, 3, stride=2, padding=1, name="pool1"), 2, name="pool2")
    y = g.concat([y, g.conv2d(y, 2, 1, bias=False, name="conv3")], name="cat")
    g.softmax_loss(g.linear(g.flatten(y), 5, name="fc"))
    return g


class Torch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(6)
        self.conv2 = nn.Conv2d(6, 6, (1, 3), padding=(0, 1))
        self.lrn = nn.LocalResponseNorm(3)
        self.conv3 = nn.Conv2d(6, 2, 1, bias=False)
        self.fc = nn.Linear(8 * 3 * 3, 5)

    def forward(self, x):
        c1 = self.conv1(x)
        a = torch.relu(self.bn1(c1))
        y = self.lrn(self.conv2(a) + c1)
        y = nn.functional.avg_pool2d(nn.functional.max_pool2d(y, 3, 2, 1), 2)
        y = torch.cat([y, self.conv3(y)], dim=1)
        return self.fc(y.flatten(1))


@pytest.mark.parametrize("config", [MemoryConfig(), MemoryConfig.superneurons(cache=False)],
                         ids=["baseline", "sn"])
def test_same_loss_gradients_and_step_as_pytorch(config):
    g = build()
    model = Model(g, config, device="host", seed=0)
    net = Torch()
    state = {k: torch.from_numpy(v.copy()) for k, v in model.params.items()}
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"bn1.num_batches_tracked"}
    rng = np.random.default_rng(0)
    x = rng.standard_normal(g.input_shape).astype(np.float32)
    labels = rng.integers(0, 5, g.input_shape[0])
    loss, grads = model.forward_backward(x, labels)
    t_loss = nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(labels))
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-5)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(model.params["bn1.running_mean"], net.bn1.running_mean.numpy(),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.params["bn1.running_var"], net.bn1.running_var.numpy(),
                               rtol=1e-5, atol=1e-7)
    # one SGD step with momentum and weight decay, from the same state
    model.set_params({k: v.detach().numpy().copy()
                      for k, v in {**dict(net.named_parameters()), "bn1.running_mean": net.bn1.running_mean,
                                   "bn1.running_var": net.bn1.running_var}.items()})
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    opt.zero_grad()
    nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(labels)).backward()
    opt.step()
    model.step(x, labels, lr=0.1, momentum=0.9, weight_decay=1e-3)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(model.params[name], p.detach().numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
