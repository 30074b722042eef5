"""The host device against PyTorch on the CPU: ``python -m snlite.bench host``.

Trains LeNet (batch 64, 1x28x28) and a small CIFAR ResNet (ResNet-8, batch 32, 3x32x32) on the
host device, under the baseline, under ``superneurons()`` and under ``superneurons()`` with the
cheap layers measured too slow to re-run on the host kept (``snlite.costs``), and the same networks in
PyTorch on the CPU when it is installed (an optional import: PyTorch is no dependency of snlite), with the
same weights (``Model.params`` are PyTorch ``state_dict`` names) and the same batch; the first
step's losses are printed side by side as the check that both run the same network.

Timing: each repeat times ``steps`` SGD steps (lr 0.01, momentum 0.9) of every contender in turn,
so a load that comes and goes on a shared machine hits all of them alike; the figure is the median
over the repeats, in images per second. Threads: 1, then all cores; NumPy's BLAS is limited with
``threadpoolctl`` (when installed; else the environment's ``OPENBLAS_NUM_THREADS`` decides, and the
output says so), PyTorch with ``torch.set_num_threads``.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time

import numpy as np

import kernels.host as fast
from snlite.config import MemoryConfig
from snlite.costs import measure_layer_costs, span_of
from snlite.models import cifar_resnet, lenet
from snlite.recompute import expensive_layers
from snlite.train import Model

NETS = {"lenet": (lambda: lenet(batch=64)), "resnet8": (lambda: cifar_resnet(8, batch=32))}
LR, MOMENTUM = 0.01, 0.9


def blas_threads(n):
    """A context that limits NumPy's BLAS to ``n`` threads (a no-op without threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(n)


def _torch_net(name, torch):
    """The PyTorch twin of ``NETS[name]``, its parameters named as snlite names them."""
    nn, F = torch.nn, torch.nn.functional
    if name == "lenet":
        class LeNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.conv2 = nn.Conv2d(1, 20, 5), nn.Conv2d(20, 50, 5)
                self.ip1, self.ip2 = nn.Linear(800, 500), nn.Linear(500, 10)

            def forward(self, x):
                x = F.max_pool2d(self.conv2(F.max_pool2d(self.conv1(x), 2)), 2)
                return self.ip2(F.relu(self.ip1(x.flatten(1))))
        return LeNet()

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                             nn.BatchNorm2d(cout))
                               if stride != 1 or cin != cout else None)

        def forward(self, x):
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet8(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)
            self.layer1 = nn.Sequential(Block(16, 16, 1))
            self.layer2 = nn.Sequential(Block(16, 32, 2))
            self.layer3 = nn.Sequential(Block(32, 64, 2))
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = self.layer3(self.layer2(self.layer1(F.relu(self.bn1(self.conv1(x))))))
            return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))
    return ResNet8()


class _Torch:
    """A PyTorch twin with the snlite model's weights, trained by the same SGD."""

    def __init__(self, torch, name, params, x, labels):
        self.torch = torch
        self.net = _torch_net(name, torch)
        state = {k: torch.from_numpy(v.copy()) for k, v in params.items()}
        missing, unexpected = self.net.load_state_dict(state, strict=False)
        assert not unexpected and all(m.endswith("num_batches_tracked") for m in missing), \
            (missing, unexpected)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LR, momentum=MOMENTUM)
        self.x, self.labels = torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))

    def step(self, x=None, labels=None, lr=None, momentum=None):
        self.opt.zero_grad(set_to_none=True)
        loss = self.torch.nn.functional.cross_entropy(self.net(self.x), self.labels)
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def _threads(n, torch):
    """Limit both NumPy's BLAS and PyTorch to ``n`` threads."""
    stack = contextlib.ExitStack()
    stack.enter_context(blas_threads(n))
    if torch is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(n)
        stack.callback(torch.set_num_threads, before)
    return stack


def host(nets=tuple(NETS), repeats=5, steps=3, threads=None, torch_too=True) -> list[dict]:
    """One row per (net, thread count): median img/s of snlite's baseline and superneurons() on the
    host device and of PyTorch (None when not installed), and the first step's losses."""
    torch = None
    if torch_too:
        try:
            import torch
        except ImportError:
            torch = None
    threads = threads or sorted({1, os.cpu_count() or 1})
    rows = []
    for name in nets:
        g = NETS[name]()
        rng = np.random.default_rng(0)
        x = rng.standard_normal(g.input_shape).astype(np.float32)
        labels = rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32)
        for n in threads:
            with _threads(n, torch):
                keep = expensive_layers(g, measure_layer_costs(g, "host"))  # too slow to re-run here
                configs = {"baseline": MemoryConfig(), "superneurons": MemoryConfig.superneurons(),
                           "measured": MemoryConfig.superneurons(recompute_keep=keep)}
                runs = {k: Model(g, c, device="host", seed=0) for k, c in configs.items()}
                params = runs["baseline"].params
                if torch is not None:
                    runs["pytorch"] = _Torch(torch, name, params, x, labels)
                # the first step of each: the check that all run the same network, and the warm-up
                first = {k: m.step(x, labels, lr=LR, momentum=MOMENTUM) for k, m in runs.items()}
                times = {k: [] for k in runs}
                for _ in range(repeats):
                    for k, m in runs.items():  # interleaved: every contender once per repeat
                        t0 = time.perf_counter()
                        for _ in range(steps):
                            m.step(x, labels, lr=LR, momentum=MOMENTUM)
                        times[k].append(time.perf_counter() - t0)
            ips = {k: g.input_shape[0] * steps / statistics.median(v) for k, v in times.items()}
            rows.append({"net": name, "batch": g.input_shape[0], "threads": n, "img_s": ips,
                         "first_loss": first, "kept": keep})
    return rows


def table(rows) -> str:
    """Markdown: img/s per contender and the ratios the issue's goals are stated in."""
    torch_here = any("pytorch" in r["img_s"] for r in rows)
    head = ("| net (batch) | threads | snlite baseline | snlite superneurons() | sn / baseline "
            "| sn, measured costs / baseline (layers kept) |")
    head += " PyTorch | snlite / PyTorch | first loss (snlite, PyTorch) |" if torch_here else ""
    out = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        ips, loss = r["img_s"], r["first_loss"]
        cells = [f"{r['net']} ({r['batch']})", str(r["threads"]), f"{ips['baseline']:,.0f}",
                 f"{ips['superneurons']:,.0f}", f"{ips['superneurons'] / ips['baseline']:.2f}",
                 f"{ips['measured'] / ips['baseline']:.2f} ({', '.join(r['kept']) or 'none'})"]
        if torch_here:
            cells += [f"{ips['pytorch']:,.0f}", f"{ips['baseline'] / ips['pytorch']:.2f}",
                      f"{loss['baseline']:.5f}, {loss['pytorch']:.5f}"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def describe_threads() -> str:
    try:
        import threadpoolctl  # noqa: F401
        how = "NumPy's BLAS limited with threadpoolctl"
    except ImportError:
        threads = os.environ.get("OPENBLAS_NUM_THREADS")
        how = f"threadpoolctl not installed: NumPy's BLAS uses OPENBLAS_NUM_THREADS={threads}"
    return f"{how}; PyTorch with torch.set_num_threads; {os.cpu_count()} CPU cores"


def breakdown(name: str = "resnet8", steps: int = 5, threads: int = 1) -> dict:
    """Where one host training step of ``NETS[name]`` goes, under the baseline: milliseconds per step
    by layer kind and phase (the executor's wall-clock profile, the fastest of ``steps`` steps), and
    how much of it is BLAS matrix products (every product of :mod:`kernels.host`, timed as it runs).
    The rest of a convolution is copying: columns, padding, transposes, col2im."""
    g = NETS[name]()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(g.input_shape).astype(np.float32)
    labels = rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32)
    blas = [0.0]
    real = fast.matmul

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = real(*a, **k)
        blas[0] += time.perf_counter() - t0
        return out

    with blas_threads(threads):
        model = Model(g, MemoryConfig(), device="host", seed=0)
        model.step(x, labels, lr=LR, momentum=MOMENTUM)  # warm-up
        model.profile = True
        best = None
        fast.matmul = timed
        try:
            for _ in range(steps):
                blas[0] = 0.0
                t0 = time.perf_counter()
                model.step(x, labels, lr=LR, momentum=MOMENTUM)
                total = time.perf_counter() - t0
                if best is None or total < best[0]:
                    best = (total, model.stream_events, blas[0])
        finally:
            fast.matmul = real
            model.profile = False
    total, events, blas_s = best
    by: dict = {}
    for e in events:
        layer, phase = span_of(e["label"])
        kind = g.layers[layer].kind if layer in g.layers else layer  # "copy"
        by[(kind, phase)] = by.get((kind, phase), 0.0) + e["end_ms"] - e["start_ms"]
    return {"net": name, "batch": g.input_shape[0], "threads": threads, "step_ms": 1e3 * total,
            "blas_ms": 1e3 * blas_s, "by_kind": dict(sorted(by.items(), key=lambda kv: -kv[1]))}


def breakdown_table(b: dict) -> str:
    """The breakdown as text: the step, then each (layer kind, phase) with its share."""
    conv = sum(ms for (kind, _), ms in b["by_kind"].items() if kind == "conv2d")
    lines = [f"{b['net']} (batch {b['batch']}), {b['threads']} thread(s): one baseline step "
             f"{b['step_ms']:.1f} ms; convolutions {conv:.1f} ms, of which BLAS products {b['blas_ms']:.1f} "
             "ms (the rest is copying: columns, padding, transposes)",
             f"{'layer kind':14} {'phase':9} {'ms/step':>8} {'share':>6}"]
    for (kind, phase), ms in b["by_kind"].items():
        lines.append(f"{kind:14} {phase:9} {ms:8.2f} {100 * ms / b['step_ms']:5.1f}%")
    return "\n".join(lines)
