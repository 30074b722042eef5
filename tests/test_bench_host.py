"""The host benchmark (python -m snlite.bench host): its PyTorch twins are the same networks, and
its table says what it measured. Figures are printed by the benchmark, never asserted here.
The first twin test takes about 2 s where PyTorch is installed: importing torch."""
import numpy as np
import pytest

from snlite import bench_host
from snlite.models import cifar_resnet, lenet
from snlite.train import Model


def test_the_table_without_pytorch_times_snlite_alone():
    rows = bench_host.host(("lenet",), repeats=1, steps=1, threads=[1], torch_too=False)
    assert [(r["net"], r["threads"], sorted(r["img_s"])) for r in rows] == \
        [("lenet", 1, ["baseline", "measured", "superneurons"])]
    lines = bench_host.table(rows).splitlines()
    assert f"({', '.join(rows[0]['kept']) or 'none'}) |" in lines[2]  # the layers measured too slow to re-run
    assert "PyTorch" not in lines[0] and lines[2].startswith("| lenet (64) | 1 | ")
    assert len(lines[0].split("|")) == len(lines[1].split("|")) == len(lines[2].split("|"))


@pytest.mark.parametrize("name,graph", [("lenet", lenet(batch=3)), ("resnet8", cifar_resnet(8, batch=3))])
def test_the_pytorch_twin_is_the_same_network(name, graph):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed: the benchmark's twins need it")
    rng = np.random.default_rng(0)
    x = rng.standard_normal(graph.input_shape).astype(np.float32)
    labels = rng.integers(0, graph.num_classes, graph.input_shape[0]).astype(np.int32)
    model = Model(graph, device="host", seed=0)
    twin = bench_host._Torch(torch, name, model.params, x, labels)
    for _ in range(2):  # the first losses, then the losses after one identical SGD step
        kw = {"lr": bench_host.LR, "momentum": bench_host.MOMENTUM}
        assert twin.step() == pytest.approx(model.step(x, labels, **kw), rel=1e-4)


def test_the_breakdown_accounts_for_the_step_and_times_the_blas_products():
    import kernels.host as fast

    b = bench_host.breakdown("lenet", steps=1)
    kinds = b["by_kind"]
    conv = kinds[("conv2d", "forward")] + kinds[("conv2d", "backward")]
    assert {("maxpool", "forward"), ("linear", "update"), ("copy", "to device")} <= set(kinds)
    assert 0 < b["blas_ms"] < conv  # the products of kernels.host are the convolutions'
    assert sum(kinds.values()) <= b["step_ms"]  # the spans lie inside the step
    assert fast.matmul is np.matmul  # the timing wrapper is gone again
    table = bench_host.breakdown_table(b).splitlines()
    assert table[0].startswith("lenet (batch 64), 1 thread(s): one baseline step") \
        and "BLAS products" in table[0]
    assert len(table) == 2 + len(kinds)
