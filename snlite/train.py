"""The training API: the same calls on the host, the simulator and a real GPU.

    model = snlite.Model(graph, device="auto", seed=0)
    loss, grads = model.forward_backward(x, labels)    # no update
    loss = model.step(x, labels, lr=0.01, momentum=0.9)
    logits = model.predict(x)                          # inference: BN running stats, no dropout

Layer math follows PyTorch, and ``model.params`` uses PyTorch's state_dict names, so weights
can be exchanged. The dropout mask depends only on (seed, iteration, layer, element); BatchNorm's
running statistics are updated exactly once per training step.

Never silent: arguments are checked where they come in (:mod:`snlite.arguments`: a batch of the
graph's shape and of numbers, one integer label in [0, classes) per sample, a finite positive
learning rate), and the loss of every training step is checked (the one number read back anyway). A
NaN or infinite loss raises :class:`~snlite.anomaly.NonFiniteError`, naming the iteration and the
first place a non-finite value appeared (a host re-run of the forward pass, :mod:`snlite.anomaly`);
the step then changes nothing: no weight update, the BatchNorm statistics restored, ``iteration``
not advanced.
NaN and Inf flow through the layers as in PyTorch, so ``predict`` shows them in its logits.
"""
from __future__ import annotations

import math

import numpy as np

from snlite import anomaly, arguments
from snlite.anomaly import NonFiniteError
from snlite.checker import check
from snlite.config import MemoryConfig, config_of
from snlite.device import HostDevice, get_device
from snlite.executor import Executor
from snlite.checks import boolean, check_number
from snlite.graph import Graph, graph_of
from snlite.budget import smallest_budget
from snlite.errors import BudgetError, HostBudgetError
from snlite.pipeline import place
from snlite.program import format_size
from snlite.scheduler import Scheduler
from snlite.trace import trace_program
from snlite.workspace import measure_conv_costs


class Model:
    """A graph, its parameters and optimizer state on a device, trained under ``config`` (a
    :class:`MemoryConfig`; None is the baseline).

    At construction the scheduler plans, the placement pass turns the plan into programs
    (``model.programs``: "grads", the forward and backward of a training step; "update", its SGD
    step; "infer", the forward in inference mode), the race checker proves them race-free, and the
    executor takes one arena and one pinned slab sized for them; every call then replays programs.
    ``model.trace`` is the trace of the last training iteration; ``model.plan`` what the scheduler
    decided (or ``plan``, one built elsewhere, such as :func:`snlite.measure.checkpoint_plan`).
    ``costs``: a conv timing table (:func:`snlite.workspace.measure_conv_costs`); on a real GPU,
    without one, it is measured first. ``anomaly``: after every training step, not only after a
    non-finite loss, re-run the forward pass on the host and check every layer's output and every
    weight's gradient (slow; :mod:`snlite.anomaly`)."""

    def __init__(self, graph: Graph, config: MemoryConfig | None = None, device="auto", seed: int = 0,
                 anomaly: bool = False, plan=None, costs=None):
        self.graph = graph_of(graph)
        self.config = config_of(config)
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.device = get_device(device)
        self.seed = int(seed)
        self.anomaly = boolean(anomaly, "Model's anomaly")
        self.iteration = 0  # training iterations run so far (dropout masks depend on it)
        tensors = graph.tensors()
        self.learnable = [t.name for t in tensors.values() if t.kind == "weight"]
        self.state_names = [t.name for t in tensors.values() if t.kind in ("weight", "buffer")]
        self.buffer_names = [t.name for t in tensors.values() if t.kind == "buffer"]
        self.costs = costs  # how conv algorithms are ranked (None: snlite.workspace.CostModel)
        real_gpu = getattr(self.device, "simulated", True) is False
        if costs is None and real_gpu and self.config.workspace != "none":
            # rank conv algorithms by measuring them (in a scratch arena, given back after)
            self.costs = measure_conv_costs(graph, self.device, self.config.budget_bytes)
        # SGD inside backward, each weight gradient freed at its update; not with anomaly, which checks
        # every gradient before anything is updated
        config = self.config.replace(update_in_backward=False) if self.anomaly else self.config
        self.plan = plan or Scheduler(graph, config).plan()  # or one built elsewhere (sqrt(N) checkpoints)
        self.in_backward = any(p.op.phase == "update" for p in self.plan.ops)
        self.step_mode = "train" if self.in_backward else "grads"  # the program a training step runs
        # fails here if a budget is too small
        self.programs, self._resolved = _programs(graph, config, self.plan, self.costs, self.in_backward)
        self.executor = self._executor()
        self._trace = None  # a training step's, read off its program on first use
        rng = np.random.default_rng(self.seed)
        init = {}
        for name, layer in graph.layers.items():
            for local, value in layer.init_params(rng).items():
                init[layer.state_name(local)] = value
        for n in self.learnable:
            init[f"{n}.momentum"] = np.zeros(tensors[n].shape, np.float32)
        self._write(init)

    def __repr__(self) -> str:
        return (f"Model({self.graph.name!r}, {self.config.describe()!r}, device={self.device.name!r}, "
                f"{self.iteration} iterations trained)")

    def _executor(self, keep: dict | None = None) -> Executor:
        """An executor sized for every program built so far, with their persistent tensors installed
        (and ``keep``'s values written into them: the state of the executor it replaces)."""
        ex = Executor(self.graph, self.device, max(p.arena_bytes for p in self.programs.values()),
                      max(p.slab_bytes for p in self.programs.values()))
        for program in self.programs.values():
            ex.install(program)
        if hasattr(self, "executor"):  # the one it replaces: its switches carry over
            ex.profile, ex.audit = self.executor.profile, self.executor.audit
        self.executor = ex
        if keep:
            self._write(keep)
        return ex

    def _program(self, mode: str):
        """The program of ``mode``, placed the first time it is asked for ("grads" where steps
        update inside backward: only ``forward_backward`` needs every weight gradient at once). The
        arena and the slab grow if it needs more than the programs before it."""
        if mode not in self.programs:
            try:
                program = place(self.graph, self._resolved, mode, costs=self.costs)
            except BudgetError as e:
                raise BudgetError("forward_backward returns every weight's gradient at once, which does not "
                                  f"fit: {e} (step() needs no such thing: it updates each layer inside "
                                  "backward and frees its gradient there)") from None
            check(program, graph=self.graph)
            keep = {n: self._read(n) for n in self.executor._installed} if self.device.has_data else {}
            self.programs[mode] = program
            if program.arena_bytes > self.arena_bytes or program.slab_bytes > self.slab_bytes:
                self._executor(keep)
            else:
                self.executor.install(program)
        return self.programs[mode]

    @property
    def arena_bytes(self) -> int:
        """The device arena the model holds (the largest any of its programs needs)."""
        return self.executor.arena.nbytes if self.executor.arena is not None else 0

    @property
    def slab_bytes(self) -> int:
        """The pinned host slab the model holds."""
        return self.executor.slab.nbytes if self.executor.slab is not None else 0

    @property
    def step_launch_bytes(self) -> list[int]:
        """After a ``step``, the device bytes in use at each of its launches: its program's, then,
        where the updates run after backward, the update program's (what :func:`snlite.pipeline.simulate`
        plans, launch by launch, under count "all")."""
        ran = self.executor.launch_bytes
        return ran.get(self.step_mode, []) + ([] if self.in_backward else ran.get("update", []))

    @property
    def trace(self):
        """The trace of a training step, read off its program: the "train" program where the updates run
        inside backward; else the step runs "grads" and then "update", whose launches, in that order, are
        the records of the one program that does both (placed once, here, with the same plan and
        config): its op records are the grads program's, then come the updates (op -1)."""
        if self._trace is None:
            program = self.programs["train"] if self.in_backward else \
                place(self.graph, self._resolved, "train", plan=self.plan, costs=self.costs)
            self._trace = trace_program(program, self.config.count)
        return self._trace

    # parameters -----------------------------------------------------------------
    @property
    def params(self) -> dict[str, np.ndarray]:
        """Weights and buffers by PyTorch state_dict name; a copy."""
        return {n: self._read(n) for n in self.state_names}

    def set_params(self, params: dict) -> None:
        """Replace weights and buffers; names, shapes, types and values are checked before anything
        is written, and a refusal names the tensor: each must be a float32 array (an int32, float64 or
        bool one is refused, not cast), finite, and a BatchNorm ``running_var`` >= 0. A PyTorch
        ``state_dict`` is taken as it is: its batch counters (``bn1.num_batches_tracked``), which
        snlite's batch normalization never reads (it updates with a fixed momentum), are skipped, and so
        is Swin's ``relative_position_index``, once checked to be the one snlite computes."""
        if not isinstance(params, dict):
            raise ValueError(f"params must be a dict of arrays by name, got {type(params).__name__}")
        counters = {f"{n}.num_batches_tracked" for n, l in self.graph.layers.items() if l.kind == "batchnorm"}
        indices = {f"{n}.relative_position_index": l.relative_position_index()
                   for n, l in self.graph.layers.items() if l.kind == "window_attention"}
        for n, index in indices.items():  # Swin's: snlite computes it from the window, as torchvision does
            if n in params and not np.array_equal(np.asarray(params[n]).reshape(-1), index):
                raise ValueError(f"parameter {n} is not the relative position index of the layer's window "
                                 "(torchvision's), which snlite computes and cannot replace; nothing was set")
        params = {n: v for n, v in params.items() if n not in counters and n not in indices}
        tensors = self.graph.tensors()
        missing = sorted(set(self.state_names) - set(params))
        unexpected = sorted(set(params) - set(self.state_names))
        wrong = [f"{n}: expected {tensors[n].shape}, got {tuple(np.shape(v))}"
                 for n, v in params.items() if n in tensors and tuple(np.shape(v)) != tensors[n].shape]
        if missing or unexpected or wrong:
            parts = [f"missing {missing}"] if missing else []
            parts += [f"unexpected {unexpected}"] if unexpected else []
            raise ValueError("parameters do not match the graph: " + "; ".join(parts + wrong))
        values = {}
        for n, v in params.items():
            a = np.asarray(v)
            if a.dtype.kind not in "biuf":
                raise ValueError(f"parameter {n} must hold numbers, got dtype {a.dtype}")
            problem = arguments.param_problem(self.graph, n, a)
            if problem:
                raise ValueError(f"parameter {problem}; nothing was set")
            values[n] = a
        self._write(values)

    # training -------------------------------------------------------------------
    def forward_backward(self, x, labels) -> tuple[float, dict[str, np.ndarray]]:
        """One training forward and backward; returns the loss and every weight's gradient.
        A non-finite loss raises NonFiniteError (see the module docstring)."""
        self._needs_data("forward_backward")
        loss, _ = self._train_iteration(x, labels, "grads")
        return loss, {n: self._read(f"{n}.grad") for n in self.learnable}

    def step(self, x, labels, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0,
             return_logits: bool = False):
        """forward_backward, then SGD (torch.optim.SGD's rule) on every weight. Returns the loss, or
        ``(loss, logits)`` with ``return_logits`` (the logits copied out as the forward made them).
        ``lr`` is a finite number > 0, ``momentum`` in [0, 1), ``weight_decay`` finite and >= 0, each
        also in float32, the precision of the update (1e39 is inf there, 1e-50 is 0, 0.99999999 is 1)."""
        return_logits = boolean(return_logits, "step's return_logits")
        self._needs_data("step")
        lr = check_number(lr, "step: lr", 0.0, open_low=True, float32=True)
        momentum = check_number(momentum, "step: momentum", 0.0, 1.0, open_high=True, float32=True)
        weight_decay = check_number(weight_decay, "step: weight_decay", 0.0, float32=True)
        sgd = dict(lr=lr, momentum=momentum, weight_decay=weight_decay)
        if self.in_backward:  # the updates run inside backward; a non-finite loss skips them on the device
            loss, logits = self._train_iteration(x, labels, "train", sgd)
        else:
            # checked: a bad step raises before the update
            loss, logits = self._train_iteration(x, labels, "grads")
            self._run("update", {}, sgd=sgd)
        return (loss, logits) if return_logits else loss

    def predict(self, x) -> np.ndarray:
        """Logits in inference mode, for any number of samples (run in batches of the graph's N).
        A NaN or an infinity in ``x`` or in the weights shows in the logits, as in PyTorch."""
        self._needs_data("predict")
        x = arguments.samples(self.graph, x, "predict", empty_ok=True)  # no samples: no logits, as in PyTorch
        n, shape = self.graph.input_shape[0], self.graph.input_shape[1:]
        out = []
        for start in range(0, len(x), n):
            results = self._run("infer", {"data": arguments.padded(x[start:start + n], n, shape)})
            out.append(self._logits_of(results)[:len(x[start:start + n])])
        return np.concatenate(out) if out else np.zeros((0, self.graph.num_classes), np.float32)

    def evaluate(self, x, labels) -> float:
        """Accuracy of ``predict`` on (x, labels): one integer label in [0, classes) per sample.
        Logits that are not finite raise NonFiniteError (an argmax over NaN means nothing)."""
        self._needs_data("evaluate")
        x = arguments.samples(self.graph, x, "evaluate")
        labels = arguments.class_labels(labels, len(x), self.graph.num_classes, "evaluate")
        logits = self.predict(x)
        bad = ~np.isfinite(logits).all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            n, shape = self.graph.input_shape[0], self.graph.input_shape[1:]
            start = i - i % n
            batch = arguments.padded(x[start:start + n], n, shape)
            where = anomaly.first_nonfinite(self.graph, self.params, batch, train=False,
                                            iteration=self.iteration, seed=self.seed)
            where = where or "no layer of a host re-run (the device and the references disagree)"
            raise NonFiniteError(f"evaluate: the logits of {int(bad.sum()):,d} of {len(x):,d} samples are "
                                 f"not finite (the first: sample {i}); the first non-finite values appear in "
                                 f"{where}")
        return float(np.mean(logits.argmax(axis=1) == labels))

    # internals ------------------------------------------------------------------
    def _needs_data(self, who: str) -> None:
        """A ValueError if the device computes nothing (the meta device: shapes and bytes only)."""
        if not self.device.has_data:
            raise ValueError(f"{who}: the {self.device.name} device holds no data (shapes and bytes only), "
                             "so it computes nothing; train and predict on device='host' (NumPy) or 'cuda', "
                             "and use the meta device for memory only (model.trace, model.programs)")

    @property
    def logits(self) -> str:
        """The name of the logits tensor (the loss layer's input)."""
        return self.graph.output_tensor(self.graph.inputs[self.graph.loss_layer][0])

    def _logits_of(self, results: dict) -> np.ndarray | None:
        """The logits as (N, classes) (a flatten moves no data: SqueezeNet's are read as (N, C, 1, 1))."""
        logits = results.get(self.logits)
        return None if logits is None else logits.reshape(len(logits), self.graph.num_classes)

    @property
    def profile(self) -> bool:
        """Time every kernel step and copy of the next iterations, per stream: on a CUDA device with
        its events, on the host by the wall clock (there the streams run one after another)."""
        return self.executor.profile

    @profile.setter
    def profile(self, on: bool) -> None:
        self.executor.profile = bool(on)

    @property
    def audit(self) -> bool:
        """Check, around every launch of the next iterations, that its kernels touch only the tensors
        the launch names, which is all the race checker sees (:mod:`snlite.audit`; the host device
        only). Slow: the device memory is poisoned and compared around each launch."""
        return self.executor.audit

    @audit.setter
    def audit(self, on: bool) -> None:
        if on and type(self.device) is not HostDevice:
            raise ValueError(f"the access audit runs on the host device, which runs each launch as it is "
                             f"issued and holds its memory in NumPy arrays; this model runs on "
                             f"{self.device.name!r} ({type(self.device).__name__}): "
                             "use Model(..., device='host')")
        if on and self.config.allocator == "raw":
            raise ValueError("the access audit watches the arena, and the raw allocator has none (each "
                             "tensor its own buffer): audit under allocator='pool', whose launches name "
                             "the same tensors")
        self.executor.audit = bool(on)

    @property
    def stream_events(self) -> list[dict]:
        """The last profiled training step: one dict per kernel step or copy (stream, label, start_ms,
        end_ms), its forward and backward, then its SGD update (timed from where they ended)."""
        runs = self.executor.stream_events
        if self.in_backward:
            return list(runs.get("train", []))
        events = list(runs.get("grads", []))
        shift = max((e["end_ms"] for e in events), default=0.0)
        return events + [dict(e, start_ms=e["start_ms"] + shift, end_ms=e["end_ms"] + shift)
                         for e in runs.get("update", [])]

    def _run(self, mode: str, inputs: dict, sgd=None) -> dict:
        program = self._program(mode)
        with np.errstate(all="ignore"):  # a NaN is reported by the checks, not by NumPy's warnings
            return self.executor.run(program, inputs, iteration=self.iteration, seed=self.seed, sgd=sgd)

    def _train_iteration(self, x, labels, mode: str, sgd=None) -> tuple[float, np.ndarray | None]:
        if labels is None:
            raise ValueError("training needs labels")
        x, labels = arguments.training_batch(self.graph, x, labels)
        before = {n: self._read(n) for n in self.buffer_names} if self.device.has_data else {}
        try:
            results = self._run(mode, {"data": x, "labels": labels}, sgd)
            loss, logits = results.get(f"{self.graph.loss_layer}.loss"), self._logits_of(results)
            loss = None if loss is None else float(loss[0])
            problem = None if loss is None else self._check_step(loss, x, labels)
        except BaseException:
            self._write(before)  # BatchNorm's running statistics as they were: a failed step changes nothing
            raise
        if problem:
            self._write(before)
            said = (f"training iteration {self.iteration}: {problem}. Nothing was updated (weights, "
                    "BatchNorm statistics and model.iteration are as before)")
            if self.audit:  # its poison is a NaN
                said += (". The access audit is on, and fills every byte a launch does not name with NaN "
                         "(snlite.audit): a NaN can be a launch that reads a tensor its program does not "
                         "name, in this step or an earlier one, rather than arithmetic")
            raise NonFiniteError(said)
        self.iteration += 1
        return (float("nan") if loss is None else loss), logits

    def _check_step(self, loss: float, x, labels) -> str | None:
        """None if the step is sound; else what went wrong. The loss is checked every step; the host
        re-run (and the gradients) only after a non-finite loss, or every step with ``anomaly``."""
        if math.isfinite(loss) and not self.anomaly:
            return None
        where = anomaly.first_nonfinite(self.graph, self.params, x, labels, train=True,
                                        iteration=self.iteration, seed=self.seed)
        if not math.isfinite(loss):
            return (f"the loss is {loss}; the first non-finite values appear in " + where if where else
                    f"the loss is {loss}, but a host re-run of the forward pass with the NumPy references is "
                    f"finite everywhere: the {self.device.name} device's kernels and their "
                    "references disagree")
        if where:
            return f"the loss is finite, but anomaly detection found non-finite values in {where}"
        for n in self.learnable:
            bad = anomaly.describe(self._read(f"{n}.grad"))
            if bad:
                return f"the loss is finite, but the gradient of {n} is not: it has {bad}"
        return None

    def _read(self, name):
        if name in self.executor.host_views:  # momentum waiting in the pinned slab
            self.device.synchronize()
            return self.device.host_read(self.executor.host_views[name])
        return self.device.read(self.executor.view(name))

    def _write(self, values: dict) -> None:
        for name, value in values.items():
            value = np.ascontiguousarray(value, dtype=np.float32)
            if name in self.executor.host_views:
                self.device.synchronize()
                self.device.host_write(self.executor.host_views[name], value)
            else:
                self.device.write(value, self.executor.view(name))


def _programs(graph, config, plan, costs, in_backward: bool) -> tuple[dict, MemoryConfig]:
    """The model's programs, placed under ``config`` and race-checked, and the configuration the
    later ones are placed under (``optimizer_state`` "auto" resolved by the first); a budget too
    small fails here, before anything runs, with the smallest budget that would work. Updating in
    backward: "train" (the step, updates inside) and "infer"; else "grads", "update" and "infer"."""
    modes = ("train", "infer") if in_backward else ("grads", "update", "infer")
    try:
        programs = {modes[0]: place(graph, config, modes[0], plan=plan, costs=costs)}
        resolved = config.replace(optimizer_state=programs[modes[0]].stats["optimizer_state"])
        for mode in modes[1:]:
            programs[mode] = place(graph, resolved, mode, plan=None if in_backward else plan, costs=costs)
    except BudgetError as e:
        host = isinstance(e, HostBudgetError)
        need = smallest_budget(graph, config if host else config.replace(host_budget_bytes=None), costs=costs,
                               host=host)
        said = str(e) if str(e).endswith(".") else f"{e}."  # (a message may end without a full stop)
        raise type(e)(f"{said} The smallest {'host ' if host else ''}budget that works under this "
                      f"configuration is {need:,d} bytes ({format_size(need)}).") from None
    for program in programs.values():
        check(program, graph=graph)  # proven race-free before anything runs (linear in the program's length)
    return programs, resolved
