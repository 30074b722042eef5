"""Dynamic convolution workspace (docs/paper.md section 6).

Convolution algorithms trade workspace for speed. After liveness, offload and recomputation have
decided what is resident, each conv step (forward, backward-data, backward-filter separately)
picks, per the ``workspace`` setting:

- ``none``: the ``direct`` algorithm, no workspace;
- ``fastest``: the fastest algorithm, whatever it needs;
- ``dynamic``: the fastest algorithm whose workspace fits in the largest free block right now.

The candidates are ``direct`` and ``im2col`` over chunks of k images (k = N, N/2, ..., 1;
workspace proportional to k): im2col keeps the chunk's column buffers, and backward-filter's
direct algorithm splits a chunk's images over the GPU and keeps their partial sums (chunk 1:
no workspace). On the host and meta devices their speed comes from :class:`CostModel`, which
costs the launches the kernels themselves make (``kernels.conv.launches``: grids, FLOPs, bytes)
on a model GPU (``kernels.launches.launch_ms``): a bigger chunk means fewer launches and more
blocks per launch, so more of the GPU busy. On a real GPU every candidate is timed once with
the runtime's own memory (:func:`measure_conv_costs`) and ranked by :class:`MeasuredCosts`;
handing the same table to ``simulate`` plans the same choices on a laptop. The ranking, not the
absolute times, is what the choice uses.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from kernels import conv as conv_kernels
from kernels import launches as launch_model
from snlite.pool import TensorPool

MODES = ("none", "fastest", "dynamic")
CONV_OPS = ("forward", "backward_data", "backward_filter")


@dataclass(frozen=True)
class Choice:
    algo: str
    chunk: int
    workspace_bytes: int
    est_ms: float


@dataclass(frozen=True)
class CostModel:
    """Estimated milliseconds of a convolution on a model GPU, from the launches its kernels make
    (``kernels.conv.launches``): each launch's FLOPs and bytes at the GPU's peak rates, over the
    share of the GPU its blocks fill (``kernels.launches.launch_ms``), plus ``launch_us`` per
    launch (Numba's launch cost on the host). ``gpu`` is a name of ``kernels.launches.GPUS``."""

    gpu: str = "H200"
    launch_us: float = 10.0

    def estimate(self, layer, op: str, algo: str, chunk: int) -> float:
        return _estimate(self, conv_key(layer), op, algo, chunk)

    def launches(self, layer, op: str, algo: str, chunk: int) -> list:
        """The launches behind the estimate (kernels.conv.launches for this layer)."""
        x_shape, w_shape, stride, padding, groups = conv_key(layer)
        return conv_kernels.launches(op, algo, x_shape, w_shape, stride, padding, chunk, groups=groups)


@functools.lru_cache(maxsize=4096)
def _estimate(model: CostModel, key: tuple, op: str, algo: str, chunk: int) -> float:
    gpu = launch_model.GPUS[model.gpu]
    x_shape, w_shape, stride, padding, groups = key
    counts = conv_kernels.launch_counts(op, algo, x_shape, w_shape, stride, padding, chunk, groups=groups)
    return sum(times * (launch_model.launch_ms(gpu, l, launch_model.resources(l.kernel, gpu.arch))
                        + model.launch_us * 1e-3) for l, times in counts)


def conv_key(layer) -> tuple:
    """What a convolution's speed depends on: its input and weight shapes, stride, padding and groups."""
    return (layer.in_shapes[0], layer.w_shape, layer.attrs["stride"], layer.attrs["padding"], layer.groups)


@dataclass(frozen=True)
class MeasuredCosts:
    """Milliseconds measured on a real GPU, by (conv_key, op, algo, chunk); anything not measured
    falls back to the model. The same table given to the meta device reproduces the GPU's choices."""

    table: dict
    fallback: CostModel = CostModel()

    def estimate(self, layer, op: str, algo: str, chunk: int) -> float:
        ms = self.table.get((conv_key(layer), op, algo, chunk))
        return ms if ms is not None else self.fallback.estimate(layer, op, algo, chunk)


DIRECT = ("direct", 1)  # the algorithm without workspace: what mode "none" runs


def options(batch: int, groups: int, op: str) -> list[tuple[str, int]]:
    """Every (algorithm, chunk) a conv step over ``batch`` images can run, :data:`DIRECT` first:
    im2col over chunks of k images (k = batch, batch/2, ..., 1; groups=1 only: a grouped
    convolution's candidates are the direct ones), and for backward-filter the direct algorithm
    split over chunks of k > 1 images (it keeps the chunk's partial sums)."""
    chunks, k = [], batch
    while k >= 1:
        chunks.append(k)
        k //= 2
    out = [DIRECT] + [("im2col", c) for c in chunks if groups == 1]
    if op == "backward_filter":
        out += [("direct", c) for c in chunks if c > 1]
    return out


def candidates(layer, op: str, model: CostModel = CostModel()) -> list[Choice]:
    """Every (algorithm, chunk) of :func:`options` for this conv step, with its workspace and its
    estimated time, fastest first (ties: less workspace first).

    Assignment 6 (dynamic convolution workspace), with :func:`choose`. Requirements (``pytest -m a6``
    checks them):

    - one :class:`Choice` per option of ``options(batch, layer.groups, op)`` (``batch``: the first
      dimension of ``layer.in_shapes[0]``), none left out, none twice; its ``workspace_bytes`` is
      ``layer.workspace_bytes(op, algo, chunk)`` and its ``est_ms`` is
      ``model.estimate(layer, op, algo, chunk)``, asked once per option (a cost model may be a
      table measured on a GPU, or a model that records each launch: never ask twice);
    - fastest first; where two take the same time, the one with less workspace first; where they
      tie on both, in the order of ``options`` (the ranking is the same on every run).
    """
    # BEGIN ASSIGNMENT 6: dynamic convolution workspace
    out = [Choice(algo, c, layer.workspace_bytes(op, algo, c), model.estimate(layer, op, algo, c))
           for algo, c in options(layer.in_shapes[0][0], layer.groups, op)]
    return sorted(out, key=lambda c: (c.est_ms, c.workspace_bytes))  # a stable sort: ties keep options' order
    # END ASSIGNMENT 6


def choose(layer, op: str, mode: str, largest_free_bytes: int | None, model: CostModel = CostModel(),
           ranked: list[Choice] | None = None) -> Choice:
    """The algorithm for one conv step under ``mode``; ``largest_free_bytes`` is the pool's
    largest free block now (None: unlimited). ``ranked``: ``candidates(layer, op, model)``, if the
    caller already has them (the placement pass asks thousands of times).

    Assignment 6 (dynamic convolution workspace; docs/paper.md section 6). Requirements:

    - ``"none"``: :data:`DIRECT`, which needs no workspace, whatever the others cost; nothing is
      ranked (its ``est_ms`` is ``model.estimate(layer, op, *DIRECT)``);
    - ``"fastest"``, or no limit (``largest_free_bytes`` None): the first of the ranking;
    - ``"dynamic"``: the fastest candidate whose workspace fits in the largest free block
      (``workspace_bytes <= largest_free_bytes``: a block exactly that size fits); :data:`DIRECT`
      needs none, so one always fits;
    - with ``ranked`` given, that ranking, as it is: nothing is ranked or estimated again;
    - any other mode: ValueError naming the modes.
    """
    # BEGIN ASSIGNMENT 6: dynamic convolution workspace
    if mode not in MODES:
        raise ValueError(f"unknown workspace mode {mode!r}; choose one of {MODES}")
    if mode == "none":
        return Choice(*DIRECT, 0, model.estimate(layer, op, *DIRECT))
    ranked = candidates(layer, op, model) if ranked is None else ranked
    if mode == "fastest" or largest_free_bytes is None:
        return ranked[0]
    for c in ranked:  # fastest first; direct needs no workspace, so one always fits
        if c.workspace_bytes <= largest_free_bytes:
            return c
    # END ASSIGNMENT 6


@functools.lru_cache(maxsize=4096)
def _largest_workspace(key: tuple, op: str) -> int:
    """The most workspace any of :func:`options` needs for a conv of ``key`` (:func:`conv_key`): no
    time estimated (what the arena's upper bound asks, whatever the mode)."""
    x_shape, w_shape, stride, padding, groups = key
    return max(conv_kernels.workspace_bytes(op, algo, x_shape, w_shape, stride, padding, c, groups=groups)
               for algo, c in options(x_shape[0], groups, op))


_SHARED: dict = {}  # cost model -> {(conv key, op): candidates}: every placement of a search asks again


class Ranked:
    """``candidates`` once per conv shape and op (deep nets repeat a few shapes thousands of times,
    and a search places the same net again and again: a cost model that can be a key shares them)."""

    def __init__(self, model: CostModel):
        self.model = model
        try:
            self.memo = _SHARED.setdefault(model, {})
        except TypeError:  # measured costs hold a dict: this placement's own memo
            self.memo = {}
        if len(self.memo) > 100_000:
            self.memo.clear()  # a bound on what a long session keeps

    def __call__(self, layer, op: str) -> list[Choice]:
        key = (conv_key(layer), op)
        if key not in self.memo:
            self.memo[key] = candidates(layer, op, self.model)
        return self.memo[key]

    @staticmethod
    def largest_workspace(graph) -> int:
        """The most workspace any conv step of ``graph`` could ask for (an unlimited arena holds it)."""
        return max((_largest_workspace(conv_key(layer), op) for layer in graph.layers.values()
                    if layer.kind == "conv2d" for op in CONV_OPS), default=0)

    def step(self, layer, phase: str, mode: str, largest_free_bytes: int) -> tuple[tuple, int]:
        """One conv step's choices: ``((op, algo, chunk, workspace bytes), ...)`` for each conv op the
        step runs (a recomputation re-runs forward), and the workspace the step needs (their largest)."""
        ops = ("forward",) if phase in ("forward", "recompute") else ("backward_filter", "backward_data")
        if mode == "none":  # direct, no workspace: nothing to rank
            return tuple((op, *DIRECT, 0) for op in ops), 0
        choices = [(op, choose(layer, op, mode, largest_free_bytes, self.model, self(layer, op)))
                   for op in ops]
        return tuple((op, c.algo, c.chunk, c.workspace_bytes) for op, c in choices), \
            max(c.workspace_bytes for _, c in choices)


def measure_conv_costs(graph, device, budget_bytes: int | None = None, reps: int = 3,
                       model: CostModel = CostModel()) -> MeasuredCosts:
    """Time every conv algorithm candidate of ``graph`` on ``device``, in a scratch arena taken
    through a :class:`~snlite.pool.TensorPool` for the purpose and given back before training
    starts. Meaningful on a real GPU; on the simulator the same code runs and the times are the
    simulation's wall-clock cost. A candidate whose workspace, beside the conv's input, weight and
    output, exceeds ``budget_bytes`` is skipped: it could never be chosen."""
    layers = list({conv_key(l): l for l in graph.layers.values() if l.kind == "conv2d"}.values())
    if not layers:
        return MeasuredCosts({})
    block = TensorPool(1024).reserved_bytes
    shapes = {l.name: (l.in_shapes[0], l.w_shape, l.out_shape) for l in layers}
    fixed = {n: sum(block(4 * math.prod(s)) for s in ss) for n, ss in shapes.items()}
    runs = [(l, op, c) for l in layers for op in CONV_OPS for c in candidates(l, op, model)
            if budget_bytes is None or fixed[l.name] + block(c.workspace_bytes) <= budget_bytes]
    pool = TensorPool(max(fixed[l.name] + block(c.workspace_bytes) for l, _, c in runs))
    arena = device.alloc_arena(pool.capacity_bytes)
    stream = device.stream("compute")
    table = {}
    for layer in layers:
        views = []
        for name, shape in zip("xwy", shapes[layer.name]):
            views.append(device.view(arena, pool.alloc(4 * math.prod(shape), f"measure.{name}"), shape))
        x, w, y = views
        calls = {"forward": ("conv2d_forward", (x, w, y)),
                 "backward_data": ("conv2d_backward_data", (y, w, x)),
                 "backward_filter": ("conv2d_backward_filter", (x, y, w))}
        for l, op, c in runs:
            if l is layer:
                kernel, arrays = calls[op]
                table[(conv_key(layer), op, c.algo, c.chunk)] = _time(device, stream, arena, pool, layer,
                                                                      kernel, arrays, c, reps)
        for offset in list(pool.allocations()):
            pool.free(offset)
    return MeasuredCosts(table)


def _time(device, stream, arena, pool, layer, kernel, arrays, choice, reps) -> float:
    offset = pool.alloc(choice.workspace_bytes, "measure.workspace") if choice.workspace_bytes else None
    wk = device.view(arena, offset, (choice.workspace_bytes // 4,)) if offset is not None else None
    kw = dict(stride=layer.attrs["stride"], padding=layer.attrs["padding"], groups=layer.groups,
              algo=choice.algo, chunk=choice.chunk, workspace=wk)
    device.run(kernel, *arrays, stream=stream, **kw)  # warm up: compiles the kernels
    start, end = device.event(timing=True), device.event(timing=True)
    start.record(stream)
    for _ in range(reps):
        device.run(kernel, *arrays, stream=stream, **kw)
    end.record(stream)
    end.synchronize()
    if offset is not None:
        pool.free(offset)
    return start.elapsed_ms(end) / reps
