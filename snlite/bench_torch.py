"""snlite's prediction against PyTorch's reality: one training step's peak memory, per model.

    python -m snlite.bench torch [--batch 4] [--models resnet18 densenet121 ...]
    python -m snlite.bench coverage            # which of torchvision's classifiers from_torch imports

Each of torchvision's models that :func:`snlite.from_torch` must import trains one step of SGD with
momentum in PyTorch on the CPU (after a first step, so that its gradients and momentum exist, as in
any step of a training run), and every tensor storage alive is counted op by op (:class:`LiveBytes`,
a ``TorchDispatchMode``: each op's outputs are counted when made, and a storage stops counting when
PyTorch lets it go), which gives PyTorch's peak exactly, at the granularity of its operators. Beside
it: snlite's prediction for the configuration that behaves like PyTorch's autograd, ``MemoryConfig(
liveness=True)`` (each tensor freed after its last use; no offload, no recomputation, no conv
workspace), from the graph :func:`snlite.from_torch` imports, on the meta device, and both split by
kind (weights, their gradients, momentum, the rest), so the difference shows where it comes from.

PyTorch is not a dependency of snlite: this needs the ``torch`` extra.
"""
from __future__ import annotations

import numpy as np

from snlite.config import MemoryConfig
from snlite.pipeline import simulate
from snlite.torch_import import TorchImportError, from_torch, import_torchvision

MODELS = ("alexnet", "vgg11", "vgg16", "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
          "wide_resnet50_2", "densenet121", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny",
          "vit_b_16", "swin_t")
# how compare() and coverage() build each classifier, where its constructor takes the argument: without
# stochastic depth (no snlite layer skips branches at random), without auxiliary classifiers (more
# outputs), and GoogLeNet's and Inception-V3's weights initialized as they are today (else a warning)
BUILD = {"stochastic_depth_prob": 0.0, "aux_logits": False, "init_weights": True}
INPUT = {"inception_v3": (3, 299, 299)}  # the others: 3x224x224
LIKE_AUTOGRAD = MemoryConfig(liveness=True)
KINDS = ("weights", "weight gradients", "optimizer state", "activations, gradients, batch, workspace")


def live_bytes_mode(kinds_now):
    """A ``LiveBytes`` dispatch mode (made here: it subclasses a torch class, and snlite never needs
    torch): every tensor storage alive, counted op by op, ``now`` and ``peak`` bytes, and at the peak
    the bytes by kind, ``kinds_now()`` naming the kind of each storage not among "the rest" then."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[int, tuple[object, int]] = {}  # storage -> (a weak reference, bytes)
            self.now = self.peak = 0
            self.by_kind = dict.fromkeys(KINDS, 0)

        def track(self, t) -> None:
            s = t.untyped_storage()
            ref = StorageWeakRef(s)
            if ref.cdata not in self.live and s.nbytes():
                self.live[ref.cdata] = (ref, s.nbytes())
                self.now += s.nbytes()

        def sweep(self) -> None:
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                self.now -= self.live.pop(key)[1]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.sweep()  # what the last op's caller let go of
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t)
            if self.now > self.peak:
                self.peak, kind = self.now, kinds_now()
                self.by_kind = dict.fromkeys(KINDS, 0)
                for key, (_, nbytes) in self.live.items():
                    self.by_kind[kind.get(key, KINDS[3])] += nbytes
            return out

    return LiveBytes()


def storage_key(t) -> int:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage()).cdata


def torch_step_peak(module, x, labels, lr: float = 0.01, momentum: float = 0.9) -> dict:
    """PyTorch's peak over one SGD step of ``module`` (in training mode) on ``x``, ``labels`` (NumPy),
    its second: ``{"peak_bytes": ..., "by_kind": {kind: bytes at the peak}, "end_bytes": bytes alive
    after it}``."""
    import torch

    x, labels = torch.from_numpy(x), torch.from_numpy(labels.astype("int64"))
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum)
    module.train()

    def step():
        opt.zero_grad()  # the gradients let go (set to None), as a training loop does
        torch.nn.functional.cross_entropy(module(x), labels).backward()
        opt.step()

    def kinds_now() -> dict[int, str]:
        held = [(KINDS[0], [*module.parameters(), *module.buffers()]),
                (KINDS[1], [p.grad for p in module.parameters() if p.grad is not None]),
                (KINDS[2], _momentum(opt))]
        return {storage_key(t): kind for kind, tensors in held for t in tensors}

    step()
    mode = live_bytes_mode(kinds_now)
    for t in [*module.parameters(), *module.buffers(), *(p.grad for p in module.parameters()),
              *_momentum(opt), x, labels]:
        mode.track(t)
    with mode:
        step()
    mode.sweep()
    return {"peak_bytes": mode.peak, "by_kind": mode.by_kind, "end_bytes": mode.now}


def _momentum(opt) -> list:
    """The optimizer's state tensors (SGD's momentum buffers)."""
    return [v for s in opt.state.values() for v in s.values() if hasattr(v, "untyped_storage")]


def predicted(graph) -> dict:
    """snlite's peak for ``graph`` under :data:`LIKE_AUTOGRAD`, on the meta device, by kind."""
    tr = simulate(graph, LIKE_AUTOGRAD.replace(count="all"))
    return {"peak_bytes": tr.peak_bytes, "by_kind": {k: v[0] for k, v in zip(KINDS, tr.by_kind().values())}}


def compare(name: str, batch: int = 4, input_shape=(3, 224, 224), seed: int = 0) -> dict:
    """One torchvision model: PyTorch's measured peak and snlite's prediction, by kind."""
    import torch

    torch.manual_seed(seed)
    module = _build(import_torchvision().models, name)  # no stochastic depth, as from_torch needs
    g = from_torch(module, input_shape, batch=batch, name=name)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *input_shape)).astype(np.float32)
    labels = rng.integers(0, g.num_classes, batch)
    return {"model": name, "batch": batch, "pytorch": torch_step_peak(module, x, labels),
            "snlite": predicted(g)}


def table(rows: list[dict]) -> str:
    """Markdown: per model, the two peaks, their ratio, and the difference by kind (snlite - PyTorch)."""
    mib = 2 ** 20
    out = ["| model (batch) | PyTorch peak | snlite predicts | snlite / PyTorch | difference by kind "
           "(snlite - PyTorch at each one's peak) |", "|---|---:|---:|---:|---|"]
    for r in rows:
        t, s = r["pytorch"], r["snlite"]
        diff = ", ".join(f"{k.split(',')[0]} {(s['by_kind'][k] - t['by_kind'][k]) / mib:+,.1f}"
                         for k in KINDS if abs(s["by_kind"][k] - t["by_kind"][k]) >= mib // 10)
        out.append(f"| {r['model']} ({r['batch']}) | {t['peak_bytes'] / mib:,.1f} MiB | "
                   f"{s['peak_bytes'] / mib:,.1f} MiB | {s['peak_bytes'] / t['peak_bytes']:.3f} | "
                   f"{diff or 'none'} MiB |")
    return "\n".join(out)


def coverage(show=print) -> dict:
    """Which of torchvision's classifiers :func:`snlite.from_torch` imports: each one built (with
    :data:`BUILD`'s arguments its constructor takes), imported at batch 1 and its parameter count checked
    against PyTorch's, one row shown per model. Returns ``{name: None if imported, else why not}``."""
    import torch

    models, out = import_torchvision().models, {}
    for name in models.list_models(module=models):
        torch.manual_seed(0)
        module = _build(models, name)
        try:
            g = from_torch(module, INPUT.get(name, (3, 224, 224)), batch=1, name=name)
            count = sum(p.numel() for p in module.parameters())
            out[name] = None if g.param_count() == count else \
                f"{g.param_count():,d} parameters where PyTorch has {count:,d}"
        except TorchImportError as e:
            out[name] = str(e).split(". snlite imports")[0]
        show(f"{name:20} {'imports' if out[name] is None else 'refused: ' + out[name][:200]}")
        del module
    done = sum(v is None for v in out.values())
    show(f"{done} of torchvision's {len(out)} classifiers import")
    return out


def _build(models, name):
    """torchvision's ``name`` with :data:`BUILD`'s arguments its constructor takes; where a builder fixes
    the stochastic depth itself (Swin's), its modules' probability is set to 0 after."""
    kwargs = dict(BUILD)
    while True:
        try:
            module = models.get_model(name, **kwargs)
            break
        except TypeError as e:  # an argument this constructor does not take, or one its builder sets
            unknown = [k for k in kwargs if repr(k) in str(e)]
            if not unknown:
                raise
            del kwargs[unknown[0]]
    for m in module.modules():
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return module
