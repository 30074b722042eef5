"""The training API: the same calls on the host, the simulator and a real GPU.

    model = snlite.Model(graph, device="auto", seed=0)
    loss, grads = model.forward_backward(x, labels)    # no update
    loss = model.step(x, labels, lr=0.01, momentum=0.9)
    logits = model.predict(x)                          # inference: BN running stats, no dropout

Layer math follows PyTorch, and ``model.params`` uses PyTorch's state_dict names, so weights
can be exchanged. The dropout mask depends only on (seed, iteration, layer, element); BatchNorm's
running statistics are updated exactly once per training step.
"""
from __future__ import annotations

import numpy as np

from snlite.config import MemoryConfig
from snlite.device import get_device
from snlite.graph import Graph
from snlite.runtime import BudgetError, Runtime, optimizer_specs, smallest_budget
from snlite.workspace import measure_conv_costs


class Model:
    """A graph, its parameters and optimizer state on a device, trained by the memory runtime
    under ``config`` (a :class:`MemoryConfig`; None is the baseline). ``model.trace`` is the
    last iteration's trace; ``model.runtime.plan`` what the scheduler decided."""

    def __init__(self, graph: Graph, config: MemoryConfig | None = None, device="auto", seed: int = 0):
        self.graph = graph
        self.config = config or MemoryConfig()
        if not isinstance(self.config, MemoryConfig):
            raise ValueError(f"config must be a MemoryConfig (or None), got {type(config).__name__}")
        self.device = get_device(device)
        self.seed = int(seed)
        self.iteration = 0  # training iterations run so far (dropout masks depend on it)
        tensors = graph.tensors()
        self.learnable = [t.name for t in tensors.values() if t.kind == "weight"]
        self.state_names = [t.name for t in tensors.values() if t.kind in ("weight", "buffer")]
        momentum = optimizer_specs(graph)
        if self.config.budget_bytes is not None and self.device.has_data:
            _check_budget(graph, self.config, momentum)  # fail before anything runs
        self.runtime = Runtime(graph, self.config, self.device, momentum)
        if getattr(self.device, "simulated", True) is False and self.config.workspace != "none":
            # a real GPU: rank conv algorithms by measurement, then re-check the budget with that ranking
            self.runtime.costs = measure_conv_costs(self.runtime)
            if self.config.budget_bytes is not None:
                _check_budget(graph, self.config, momentum, self.runtime.costs)
        rng = np.random.default_rng(self.seed)
        init = {}
        for name, layer in graph.layers.items():
            for local, value in layer.init_params(rng).items():
                init[f"{name}.{local}"] = value
        for n in self.learnable:
            init[f"{n}.momentum"] = np.zeros(tensors[n].shape, np.float32)
        self._write(init)

    @property
    def trace(self):
        """The trace of the last iteration run (training or inference)."""
        return self.runtime.trace

    # parameters -----------------------------------------------------------------
    @property
    def params(self) -> dict[str, np.ndarray]:
        """Weights and buffers by PyTorch state_dict name; a copy."""
        return {n: self._read(n) for n in self.state_names}

    def set_params(self, params: dict) -> None:
        """Replace weights and buffers; names and shapes are checked before anything is written."""
        tensors = self.graph.tensors()
        missing = sorted(set(self.state_names) - set(params))
        unexpected = sorted(set(params) - set(self.state_names))
        wrong = [f"{n}: expected {tensors[n].shape}, got {tuple(np.shape(v))}"
                 for n, v in params.items() if n in tensors and tuple(np.shape(v)) != tensors[n].shape]
        if missing or unexpected or wrong:
            parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {unexpected}"] if unexpected else [])
            raise ValueError("parameters do not match the graph: " + "; ".join(parts + wrong))
        self._write({n: np.asarray(v, np.float32) for n, v in params.items()})

    # training -------------------------------------------------------------------
    def forward_backward(self, x, labels) -> tuple[float, dict[str, np.ndarray]]:
        """One training forward and backward; returns the loss and every weight's gradient."""
        loss, _ = self._train_iteration(x, labels)
        return loss, {n: self._read(f"{n}.grad") for n in self.learnable}

    def step(self, x, labels, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
             return_logits: bool = False):
        """forward_backward, then SGD (torch.optim.SGD's rule) on every weight. Returns the loss, or
        ``(loss, logits)`` with ``return_logits`` (the logits copied out as the forward made them)."""
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ValueError(f"need lr > 0, 0 <= momentum < 1, weight_decay >= 0; got {lr}, {momentum}, {weight_decay}")
        loss, logits = self._train_iteration(x, labels, return_logits)
        rt = self.runtime
        for n in self.learnable:
            self.device.run("sgd_update", rt.view(n), rt.view(f"{n}.grad"), rt.view(f"{n}.momentum"),
                            lr=lr, momentum=momentum, weight_decay=weight_decay)
        return (loss, logits) if return_logits else loss

    def predict(self, x) -> np.ndarray:
        """Logits in inference mode, for any number of samples (run in batches of the graph's N)."""
        x = np.asarray(x, dtype=np.float32)
        n, shape = self.graph.input_shape[0], self.graph.input_shape[1:]
        if x.shape[1:] != shape:
            raise ValueError(f"predict: samples have shape {x.shape[1:]}, the graph expects {shape}")
        out = []
        for start in range(0, len(x), n):
            chunk = x[start:start + n]
            batch = np.zeros((n,) + shape, np.float32)
            batch[:len(chunk)] = chunk
            _, logits = self.runtime.run(batch, None, train=False, iteration=self.iteration, seed=self.seed)
            out.append(logits[:len(chunk)])
        return np.concatenate(out) if out else np.zeros((0, self.graph.num_classes), np.float32)

    def evaluate(self, x, labels) -> float:
        """Accuracy of ``predict`` on (x, labels)."""
        return float(np.mean(self.predict(x).argmax(axis=1) == np.asarray(labels)))

    # internals ------------------------------------------------------------------
    def _train_iteration(self, x, labels, return_logits=False) -> tuple[float, np.ndarray | None]:
        if labels is None:
            raise ValueError("training needs labels")
        _check_batch(self.graph, x, labels)
        loss, logits = self.runtime.run(x, labels, train=True, iteration=self.iteration, seed=self.seed,
                                        keep_logits=return_logits)
        self.iteration += 1
        return (float("nan") if loss is None else loss), logits

    def _read(self, name):
        return self.device.read(self.runtime.view(name))

    def _write(self, values: dict) -> None:
        for name, value in values.items():
            self.device.write(np.ascontiguousarray(value, dtype=np.float32), self.runtime.view(name))


def _check_batch(graph, x, labels) -> None:
    x_shape = np.shape(x)
    if tuple(x_shape) != graph.input_shape:
        raise ValueError(f"input batch has shape {tuple(x_shape)}, the graph expects {graph.input_shape}")
    labels = np.asarray(labels)
    k = graph.num_classes
    if labels.shape != (x_shape[0],) or labels.min() < 0 or labels.max() >= k:
        raise ValueError(f"labels must be {x_shape[0]} integers in [0, {k}); got shape {labels.shape}, "
                         f"range [{labels.min()}, {labels.max()}]")


def _check_budget(graph, config, extra, costs=None) -> None:
    """Plan on the meta device first: a budget too small fails here, before anything runs."""
    from snlite.device import MetaDevice

    try:
        Runtime(graph, config, MetaDevice(), extra, costs).run()
    except BudgetError as e:
        need = smallest_budget(graph, config, extra=extra, costs=costs)
        raise BudgetError(f"{e} The smallest budget that works under this configuration is {need:,d} bytes "
                          f"({need / 2**20:,.1f} MiB).") from None
