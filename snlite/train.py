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

from snlite.checker import check
from snlite.config import MemoryConfig
from snlite.device import get_device
from snlite.executor import Executor
from snlite.graph import Graph
from snlite.placement import BudgetError, place, smallest_budget
from snlite.program import format_size
from snlite.scheduler import Scheduler
from snlite.trace import trace_program
from snlite.workspace import measure_conv_costs


class Model:
    """A graph, its parameters and optimizer state on a device, trained under ``config`` (a
    :class:`MemoryConfig`; None is the baseline).

    At construction the scheduler plans, the placement pass turns the plan into three programs
    (``model.programs``: "train", "grads" and "infer"), and the executor takes one arena and one
    pinned slab sized for them; every step then replays a program. ``model.trace`` is the trace of
    the last training iteration; ``model.plan`` what the scheduler decided (or ``plan``, one built elsewhere,
    such as :func:`snlite.measure.checkpoint_plan`). ``costs``: a conv timing table
    (:func:`snlite.workspace.measure_conv_costs`); on a real GPU, without one, it is measured first."""

    def __init__(self, graph: Graph, config: MemoryConfig | None = None, device="auto", seed: int = 0, plan=None,
                 costs=None):
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
        self.costs = costs  # how conv algorithms are ranked (None: snlite.workspace.CostModel)
        if costs is None and getattr(self.device, "simulated", True) is False and self.config.workspace != "none":
            # a real GPU: rank conv algorithms by measuring them (in a scratch arena, given back after)
            self.costs = measure_conv_costs(graph, self.device, self.config.budget_bytes)
        self.plan = plan or Scheduler(graph, self.config).plan()  # a plan built elsewhere (sqrt(N) checkpoints) runs too
        self.programs = _programs(graph, self.config, self.plan, self.costs)  # fails here if a budget is too small
        self.executor = Executor(graph, self.device, max(p.arena_bytes for p in self.programs.values()),
                                 max(p.slab_bytes for p in self.programs.values()))
        self.executor.install(self.programs["train"])
        self._traces: dict[str, object] = {}
        self._last = "train"
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
        """The trace of the last training iteration (``step`` or ``forward_backward``): read off its program."""
        return self._trace(self._last)

    @property
    def inference_trace(self):
        """The trace of ``predict``'s program (forward only, logits read back)."""
        return self._trace("infer")

    def _trace(self, mode: str):
        if mode not in self._traces:
            self._traces[mode] = trace_program(self.programs[mode], self.config.count)
        return self._traces[mode]

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
        loss, _ = self._train_iteration(x, labels, "grads")
        return loss, {n: self._read(f"{n}.grad") for n in self.learnable}

    def step(self, x, labels, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
             return_logits: bool = False):
        """forward_backward, then SGD (torch.optim.SGD's rule) on every weight. Returns the loss, or
        ``(loss, logits)`` with ``return_logits`` (the logits copied out as the forward made them)."""
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ValueError(f"need lr > 0, 0 <= momentum < 1, weight_decay >= 0; got {lr}, {momentum}, {weight_decay}")
        sgd = dict(lr=lr, momentum=momentum, weight_decay=weight_decay)
        loss, logits = self._train_iteration(x, labels, "train", sgd)
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
            results = self.executor.run(self.programs["infer"], {"data": batch}, iteration=self.iteration,
                                        seed=self.seed)
            out.append(results[self.logits][:len(chunk)])
        return np.concatenate(out) if out else np.zeros((0, self.graph.num_classes), np.float32)

    def evaluate(self, x, labels) -> float:
        """Accuracy of ``predict`` on (x, labels)."""
        return float(np.mean(self.predict(x).argmax(axis=1) == np.asarray(labels)))

    # internals ------------------------------------------------------------------
    @property
    def logits(self) -> str:
        """The name of the logits tensor (the loss layer's input)."""
        return self.graph.output_tensor(self.graph.inputs[self.graph.loss_layer][0])

    @property
    def profile(self) -> bool:
        """On a CUDA device: time every kernel step and copy of the next iterations, per stream."""
        return self.executor.profile

    @profile.setter
    def profile(self, on: bool) -> None:
        self.executor.profile = bool(on)

    @property
    def stream_events(self) -> list[dict]:
        """The last profiled iteration: one dict per kernel step or copy (stream, label, start_ms, end_ms)."""
        return self.executor.stream_events

    def _train_iteration(self, x, labels, mode, sgd=None) -> tuple[float, np.ndarray | None]:
        if labels is None:
            raise ValueError("training needs labels")
        _check_batch(self.graph, x, labels)
        inputs = {"data": np.ascontiguousarray(x, dtype=np.float32), "labels": np.asarray(labels, dtype=np.int32)}
        results = self.executor.run(self.programs[mode], inputs, iteration=self.iteration, seed=self.seed, sgd=sgd)
        self._last = mode
        self.iteration += 1
        loss = results.get(f"{self.graph.loss_layer}.loss")
        return (float("nan") if loss is None else float(loss[0])), results.get(self.logits)

    def _read(self, name):
        return self.device.read(self.executor.view(name))

    def _write(self, values: dict) -> None:
        for name, value in values.items():
            self.device.write(np.ascontiguousarray(value, dtype=np.float32), self.executor.view(name))


def _check_batch(graph, x, labels) -> None:
    x_shape = np.shape(x)
    if tuple(x_shape) != graph.input_shape:
        raise ValueError(f"input batch has shape {tuple(x_shape)}, the graph expects {graph.input_shape}")
    labels = np.asarray(labels)
    k = graph.num_classes
    if labels.shape != (x_shape[0],) or labels.min() < 0 or labels.max() >= k:
        raise ValueError(f"labels must be {x_shape[0]} integers in [0, {k}); got shape {labels.shape}, "
                         f"range [{labels.min()}, {labels.max()}]")


def _programs(graph, config, plan, costs) -> dict:
    """The model's three programs, placed under ``config`` and race-checked; a budget too small fails
    here, before anything runs, with the smallest budget that would work."""
    try:
        train = place(graph, config, "train", plan=plan, costs=costs)
        infer = place(graph, config, "infer", plan=plan, costs=costs)
        for program in (train, infer):
            check(program)  # proven race-free before anything runs (linear in the program's length)
    except BudgetError as e:
        host = "host budget" in str(e)
        need = smallest_budget(graph, config if host else config.replace(host_budget_bytes=None), costs=costs,
                               host=host)
        raise BudgetError(f"{e} The smallest {'host ' if host else ''}budget that works under this configuration is "
                          f"{need:,d} bytes ({format_size(need)}).") from None
    return {"train": train, "grads": train.without_updates(), "infer": infer}
