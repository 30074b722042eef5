"""The PyTorch side of ``python -m snlite.bench torch``: what it counts is what PyTorch holds.

Skipped where PyTorch is not installed (the ``torch`` extra installs it)."""
import numpy as np
import pytest

from snlite import bench_torch

torch = pytest.importorskip("torch", reason="PyTorch is not installed: pip install -e \".[torch]\"")
nn = torch.nn


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5))


def batch(n=2):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, n)


def storage_bytes(tensors) -> int:
    return sum({bench_torch.storage_key(t): t.untyped_storage().nbytes() for t in tensors}.values())


def test_a_step_ends_holding_exactly_the_weights_gradients_momentum_and_batch():
    net = small_net()
    x, labels = batch()
    r = bench_torch.torch_step_peak(net, x, labels)
    params, buffers = list(net.parameters()), list(net.buffers())
    weights = storage_bytes(params + buffers)
    grads = storage_bytes([p.grad for p in params])
    assert r["end_bytes"] == weights + 2 * grads + x.nbytes + labels.size * 8  # momentum: one per weight
    assert r["by_kind"]["weights"] == weights and r["by_kind"]["optimizer state"] == grads
    assert 0 < r["by_kind"]["weight gradients"] <= grads
    assert sum(r["by_kind"].values()) == r["peak_bytes"] > r["end_bytes"]  # activations come and go


def test_the_peak_is_the_same_every_step_and_grows_with_the_batch():
    x, labels = batch(2)
    a = bench_torch.torch_step_peak(small_net(), x, labels)
    b = bench_torch.torch_step_peak(small_net(), x, labels)
    x4, labels4 = batch(4)
    c = bench_torch.torch_step_peak(small_net(), x4, labels4)
    assert a == b
    rest = "activations, gradients, batch, workspace"
    assert c["by_kind"][rest] > a["by_kind"][rest] and c["by_kind"]["weights"] == a["by_kind"]["weights"]


def test_the_table_shows_both_peaks_their_ratio_and_where_they_differ():
    kinds = dict.fromkeys(bench_torch.KINDS, 0)
    mib = 2 ** 20
    row = {"model": "net", "batch": 2,
           "pytorch": {"peak_bytes": 100 * mib, "by_kind": dict(kinds, weights=40 * mib, **{
               "activations, gradients, batch, workspace": 60 * mib})},
           "snlite": {"peak_bytes": 110 * mib, "by_kind": dict(kinds, weights=40 * mib, **{
               "weight gradients": 4 * mib, "activations, gradients, batch, workspace": 66 * mib})}}
    line = bench_torch.table([row]).splitlines()[-1]
    assert line == "| net (2) | 100.0 MiB | 110.0 MiB | 1.100 | weight gradients +4.0, activations +6.0 MiB |"


def test_live_bytes_counts_each_storage_once_and_lets_go_of_what_dies():
    mode = bench_torch.live_bytes_mode(dict)
    x = torch.ones(1024)  # 4 KiB
    mode.track(x)
    mode.track(x[:10])  # a view: the same storage, counted once
    with mode:
        y = torch.relu(torch.relu(torch.relu(x)))  # each intermediate dies once the next op has read it
        y.add_(1)  # in place: nothing new
    mode.sweep()
    assert mode.peak == 3 * 4096  # x, the input of the op running, its output
    assert mode.now == 2 * 4096 and mode.by_kind[bench_torch.KINDS[3]] == 3 * 4096


class _Abs(nn.Module):
    def forward(self, x):
        return torch.flatten(torch.abs(x), 1)


def test_coverage_builds_each_classifier_with_what_it_takes_and_says_why_one_is_refused(monkeypatch):
    """Each model is built with the arguments of BUILD its constructor takes (an unknown one dropped),
    imported, and either counted as imported or shown with the reason snlite refused it."""
    import types

    built = {}

    def get_model(name, **kwargs):
        if "aux_logits" in kwargs:  # as a constructor that does not take it
            raise TypeError(f"__init__() got an unexpected keyword argument {'aux_logits'!r}")
        built[name] = kwargs
        return small_net() if name == "small" else nn.Sequential(nn.Conv2d(3, 4, 3), _Abs(), nn.Linear(64, 5))

    models = types.SimpleNamespace(list_models=lambda module: ["small", "odd"], get_model=get_model)
    monkeypatch.setattr(bench_torch, "import_torchvision", lambda: types.SimpleNamespace(models=models))
    monkeypatch.setattr(bench_torch, "INPUT", {"small": (3, 6, 6), "odd": (3, 6, 6)})
    shown = []
    out = bench_torch.coverage(show=shown.append)
    assert built == dict.fromkeys(("small", "odd"), {"stochastic_depth_prob": 0.0, "init_weights": True})
    assert out["small"] is None and "no snlite layer computes it" in out["odd"]
    assert shown[0].split() == ["small", "imports"] and shown[1].startswith("odd                  refused: ")
    assert shown[-1] == "1 of torchvision's 2 classifiers import"
