"""The runtime: executes a :class:`~snlite.scheduler.Plan` on any device, op by op.

One code path for the meta, host and CUDA devices. For each op it

1. releases offloaded tensors (the compute stream waits for their copy to finish) and starts
   prefetches into freshly allocated blocks (on the host-to-device copy stream);
2. makes every tensor the op reads resident: waits for a prefetch, or (with the LRU cache) fetches
   a tensor the cache evicted, counting hits and misses; locks them;
3. allocates what the op writes from the pool (an in-place write takes over the buffer it
   overwrites); with the cache on, a failed allocation evicts unlocked tensors from the least
   recently used end until the request fits;
4. picks each conv step's algorithm and allocates its workspace;
5. runs the layer's kernels, records the trace, frees what the plan frees and starts offloads.

Streams (CUDA only; no-ops elsewhere): kernels run on ``compute``; device-to-host copies on
``copy_out``, host-to-device on ``copy_in``. A copy into a block waits for an event recorded on
the compute stream (so the block's previous readers have finished); the compute stream waits for
a copy's event only where a true dependency exists (a release, or a read of a prefetched tensor).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from snlite import workspace as ws
from snlite.cache import LRUCache
from snlite.config import MemoryConfig
from snlite.graph import TensorSpec
from snlite.layers import StepIO
from snlite.pool import HostPool, PoolFullError, RawAllocator, TensorPool
from snlite.recompute import base_name
from snlite.scheduler import PERSISTENT_KINDS, Scheduler
from snlite.tensor import State, Tensor
from snlite.trace import CATEGORIES, KIND_CATEGORY, PAPER_CATEGORIES, ConvChoice, StepRecord, Trace, counted


class BudgetError(MemoryError):
    """The plan does not fit the memory budget; says where, what was live, and what would fit."""


class PlanError(RuntimeError):
    """A plan asked an op to read a tensor that is not resident (a scheduler bug)."""


def dropout_seed(seed: int, iteration: int, layer_index: int) -> int:
    """A 32-bit seed that depends only on (model seed, iteration, layer): splitmix64 mixing."""
    z = (seed * 0x9E3779B97F4A7C15 + iteration * 0xBF58476D1CE4E5B9 + layer_index * 0x94D049BB133111EB) & (2**64 - 1)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & (2**64 - 1)
    return (z ^ (z >> 31)) & 0xFFFFFFFF


class Runtime:
    """A graph's tensors in one pool on ``device``, and the loop that runs the plan."""

    def __init__(self, graph, config: MemoryConfig | None, device, extra: dict[str, TensorSpec] | None = None,
                 costs=None, plan=None):
        self.graph, self.device = graph, device
        self.costs = costs or ws.CostModel()  # how conv algorithms are ranked (see snlite.workspace)
        self.config = config or MemoryConfig()
        self.scheduler = Scheduler(graph, self.config)
        self.plan = plan or self.scheduler.plan()  # a plan built elsewhere (e.g. sqrt(N) checkpoints) runs too
        self.specs = dict(graph.tensors())
        self.specs.update(extra or {})
        self.persistent = [n for n, t in self.specs.items() if t.kind in PERSISTENT_KINDS]
        self.persistent_set = set(self.persistent)
        self.dropped = set(self.plan.recompute.dropped)
        self.evictable = self._evictable()
        c = self.config
        raw = c.allocator == "raw"
        self.capacity = c.budget_bytes or self.upper_bound_bytes()
        self.pool = RawAllocator(self.capacity) if raw else TensorPool(self.capacity, fit=c.fit)
        self.arena = None if raw else device.alloc_arena(self.pool.capacity_bytes)
        self.buffers: dict[int, object] = {}  # raw allocator: handle -> its own device buffer
        moving = c.offload or c.cache
        self.host_capacity = self._host_bytes() if moving else 0
        self.host_pool = HostPool(self.host_capacity) if moving else None
        self.host_slab = device.alloc_pinned(self.host_capacity) if moving else None
        self.compute, self.copy_out, self.copy_in = device.stream(), device.stream(), device.stream()
        self.tensors: dict[str, Tensor] = {}
        self.conv_outputs = {graph.output_tensor(n) for n, l in graph.layers.items() if l.kind == "conv2d"}
        self.lru = LRUCache(self.conv_outputs if self.config.offload else ())  # resident evictable tensors
        self._bytes = dict.fromkeys(CATEGORIES, 0)  # device bytes held now, by trace category
        self._events: dict[str, object] = {}
        self._resident = 0  # tensors holding device memory now
        self._log: list[tuple[str, int]] = []  # (tensor, +1 allocated / -1 released), to rebuild the peak's live set
        self._peak_log = 0
        self._layer_index = {name: i for i, name in enumerate(graph.layers)}
        self.trace = self._trace = self.inference_trace = Trace(count=c.count)
        self.profile = False  # on a CUDA device: time every kernel and copy with events, per stream
        self.stream_events: list[dict] = []  # the last profiled iteration: stream, label, start_ms, end_ms
        self._spans: list = []
        for name in self.persistent:
            self._alloc(self._tensor(name), step="setup")

    # sizes ------------------------------------------------------------------------
    def reserved(self, nbytes: int) -> int:
        """Bytes the pool holds for a request of ``nbytes`` (rounded up to its blocks)."""
        return self.pool.reserved_bytes(max(nbytes, 1))

    def upper_bound_bytes(self) -> int:
        """Enough for every tensor and incarnation at once plus the largest workspace: what an
        unlimited budget means (it is also what the baseline needs, at most)."""
        block = TensorPool(1024).reserved_bytes
        names = set(self.specs) | {t for p in self.plan.ops for t in p.op.writes}
        wmax = max((c.workspace_bytes for layer in self.graph.layers.values() if layer.kind == "conv2d"
                    for op in ("forward", "backward_data", "backward_filter")
                    for c in ws.candidates(layer, op)), default=0)
        return sum(block(self.specs[base_name(n)].nbytes) for n in names) + block(wmax)

    def _host_bytes(self) -> int:
        """The pinned slab: room for every tensor (and recomputed incarnation) that may go to the
        host, all at once, so a move to the host can never fail for lack of host memory."""
        slot = HostPool(256).reserved_bytes
        names = set(self.specs) | {t for p in self.plan.ops for t in p.op.writes}
        return sum(slot(max(self.specs[base_name(n)].nbytes, 1)) for n in names
                   if base_name(n) in self.evictable) or slot(1)

    def _evictable(self) -> set[str]:
        """What may leave the device: activations, their gradients and the batch (the cache may
        evict any of them; eager offload moves only CONV outputs, see :mod:`snlite.offload`)."""
        return {n for n, t in self.specs.items() if t.kind in ("activation", "gradient", "input")}

    # tensors ------------------------------------------------------------------------
    def _tensor(self, name: str) -> Tensor:
        t = self.tensors.get(name)
        if t is None:
            spec = self.specs[base_name(name)]
            t = self.tensors[name] = Tensor(name=name, nbytes=spec.nbytes, kind=spec.kind)
        return t

    def _category(self, t: Tensor) -> str:
        return "in_flight" if t.state is State.OFFLOADING else KIND_CATEGORY[t.kind]

    def view(self, name: str, shape=None):
        t = self.tensors[name]
        spec = self.specs[base_name(name)]
        if self.arena is None:
            v = self.device.view(self.buffers[t.offset], 0, spec.shape, spec.dtype)
        else:
            v = self.device.view(self.arena, t.offset, spec.shape, spec.dtype)
        return v if shape is None or tuple(shape) == tuple(spec.shape) else v.reshape(tuple(shape))

    def _take_block(self, t: Tensor, step):
        """A block for ``t`` from the pool; with the cache on, a failed allocation evicts least
        recently used tensors until it fits. Raises BudgetError when nothing more can leave."""
        nbytes = max(t.nbytes, 1)
        while True:
            try:
                offset = self.pool.alloc(nbytes, t.name, step)
                break
            except PoolFullError as e:
                if not (self.config.cache and self._evict_one()):
                    raise BudgetError(self._budget_message(t, step, e)) from None
        if self.arena is None:  # the raw allocator: one device allocation per tensor
            self.buffers[offset] = self.device.alloc_arena(self.pool.reserved_bytes(nbytes))
        self._held(t, +1)
        return offset

    def _alloc(self, t: Tensor, step) -> None:
        t.allocate(self._take_block(t, step))
        self._bytes[self._category(t)] += self.reserved(t.nbytes)
        if base_name(t.name) in self.evictable:
            self.lru.add(t.name, base_name(t.name))

    def _held(self, t: Tensor, sign: int) -> None:
        self._resident += sign
        self._log.append((t.name, sign))

    @contextlib.contextmanager
    def _span(self, stream_name: str, stream, label: str):
        """With ``profile`` on a CUDA device, bracket the work enqueued inside with timing events."""
        if not (self.profile and self.device.name == "cuda"):
            yield
            return
        start, end = self.device.event(timing=True), self.device.event(timing=True)
        start.record(stream)
        yield
        end.record(stream)
        self._spans.append((stream_name, label, start, end))

    def _hand_over(self, new: Tensor, old: Tensor) -> None:
        """An in-place write: ``new`` takes over ``old``'s block (and its place in the accounting
        and the cache); ``old`` is dead, and so is any host copy it had."""
        category = self._category(old)
        new.take_buffer(old)
        nbytes = self.reserved(old.nbytes)
        self._bytes[category] -= nbytes
        self._bytes[self._category(new)] += nbytes
        self._log += [(old.name, -1), (new.name, +1)]
        host = old.release_host()
        if host is not None:
            self.host_pool.free(host)
        if self.lru.remove(old.name):
            self.lru.add(new.name, base_name(new.name))

    def _release_block(self, t: Tensor, offset, category: str) -> None:
        self.pool.free(offset)
        if self.arena is None:
            del self.buffers[offset]
        self._held(t, -1)
        self._bytes[category] -= self.reserved(t.nbytes)
        self.lru.remove(t.name)

    def _free(self, name: str) -> None:
        t = self.tensors.get(name)
        if t is None or t.state in (State.FREED, State.UNALLOCATED):
            return
        if t.state is State.OFFLOADING:
            self._finish_offload(t)
        category = self._category(t)
        was_resident = t.resident
        offset = t.drop() if (base_name(name) in self.dropped and "#" not in name and t.state is State.ON_DEVICE) \
            else t.free()
        if was_resident:
            self._release_block(t, offset, category)
        host = t.release_host()
        if host is not None:
            self.host_pool.free(host)

    # moving data --------------------------------------------------------------------
    def _host_view(self, t: Tensor):
        spec = self.specs[base_name(t.name)]
        return self.device.view(self.host_slab, t.host_offset, spec.shape, spec.dtype)

    def _start_offload(self, t: Tensor, step) -> None:
        if t.host_offset is None:
            t.host_offset = self.host_pool.alloc(t.nbytes, t.name, step)
        self._bytes[KIND_CATEGORY[t.kind]] -= self.reserved(t.nbytes)
        copy = t.start_offload(t.host_offset)  # False: a clean eviction, the host copy is still valid
        self._bytes["in_flight"] += self.reserved(t.nbytes)
        if copy:
            ready = self.device.event()
            ready.record(self.compute)
            ready.wait(self.copy_out)  # the copy starts once the producing kernels finished
            with self._span("copy_out", self.copy_out, f"{t.name} to host"):
                self.device.copy_to_host(self.view(t.name), self._host_view(t), stream=self.copy_out)
            done = self.device.event()
            done.record(self.copy_out)
            self._events[t.name] = done
            self._trace.d2h_bytes += t.nbytes
        self.lru.remove(t.name)
        self._trace.host_peak_bytes = max(self._trace.host_peak_bytes, self.host_pool.stats().in_use_bytes)

    def _finish_offload(self, t: Tensor) -> None:
        event = self._events.pop(t.name, None)
        if event is not None:
            event.wait(self.compute)  # the block may be reused only after the copy read it
        offset = t.finish_offload()
        self._release_block(t, offset, "in_flight")

    def _start_prefetch(self, t: Tensor, step) -> None:
        t.start_prefetch(self._take_block(t, step))
        self._bytes[KIND_CATEGORY[t.kind]] += self.reserved(t.nbytes)
        ready = self.device.event()
        ready.record(self.compute)
        ready.wait(self.copy_in)  # the block's previous readers have finished
        with self._span("copy_in", self.copy_in, f"{t.name} to device"):
            self.device.copy_to_device(self._host_view(t), self.view(t.name), stream=self.copy_in)
        done = self.device.event()
        done.record(self.copy_in)
        self._events[t.name] = done
        self._trace.h2d_bytes += t.nbytes

    def _make_readable(self, t: Tensor, step) -> None:
        if t.state is State.ON_HOST:
            if not self.config.cache:
                raise PlanError(f"op {step} reads {t.name}, which is on the host and nothing prefetched it")
            self._trace.cache_misses += 1
            self._start_prefetch(t, step)
        elif self.config.cache and t.name in self.lru:
            self._trace.cache_hits += 1
        if t.state is State.PREFETCHING:
            self._events.pop(t.name).wait(self.compute)
            t.finish_prefetch()
            if base_name(t.name) in self.evictable:
                self.lru.add(t.name, base_name(t.name))
        if not t.readable:
            raise PlanError(f"op {step} reads {t.name}, which is {t.state.name}: the plan is wrong")
        self.lru.touch(t.name)

    def _evict_one(self) -> bool:
        """Move the least recently used unlocked tensor to the host (CONV outputs first when
        ``offload`` is on, see :class:`~snlite.cache.LRUCache`); False if none is left."""
        for name in self.lru.eviction_order():
            t = self.tensors[name]
            if not t.locked and t.state is State.ON_DEVICE:
                self._start_offload(t, "evict")
                self._finish_offload(t)
                return True
        return False

    # one iteration ------------------------------------------------------------------
    def run(self, x=None, labels=None, *, train=True, iteration=0, seed=0, keep_logits=False):
        """Run the plan once (``train``) or its forward ops in inference mode; returns
        ``(loss, logits)`` (None where the device holds no data or nothing asked for them)."""
        g, dev = self.graph, self.device
        loss_layer = g.loss_layer
        logits_name = g.output_tensor(g.inputs[loss_layer][0])
        trace = Trace(count=self.config.count, arena_bytes=self.capacity,
                      recompute_count=self.plan.recompute.count if train else 0,
                      extra_flops=self.plan.recompute.extra_flops if train else 0)
        self._trace = trace
        if train:
            self.trace = trace  # the last training iteration's trace; inference keeps its own
        else:
            self.inference_trace = trace
        self.pool.reset_peak()
        self._log, self._peak_log = [], 0
        loss = logits = None
        for planned in self.plan.ops:
            op = planned.op
            if not train and (op.phase != "forward" or op.layer == loss_layer):
                continue
            for name in planned.release if train else ():
                self._finish_offload(self.tensors[name])
            for name in planned.prefetch if train else ():
                self._start_prefetch(self.tensors[name], op.step)
            names = dict(op.names)
            touched = [self._tensor(n) for n in {*op.reads, *op.writes}]
            for t in touched:
                t.locked = True
            for name in op.reads:
                self._make_readable(self.tensors[name], op.step)
            handed = {new for new, _ in op.inplace}  # written into another tensor's buffer, after compute
            for name in op.writes:
                t = self.tensors[name]
                if name not in handed:
                    if t.state is not State.ON_DEVICE:
                        self._alloc(t, op.step)
                    t.mark_written()
            if op.layer == "data" and op.phase == "forward" and dev.has_data and x is not None:
                self._load(x, labels)
            if keep_logits and op.layer == loss_layer and op.phase == "forward" and dev.has_data:
                logits = dev.read(self.view(logits_name, g.layers[g.inputs[loss_layer][0]].out_shape))
            self._compute(op, names, train, iteration, seed)
            for new, old in op.inplace:
                self._hand_over(self.tensors[new], self.tensors[old])
            if train and op.layer == loss_layer and op.phase == "forward" and dev.has_data:
                loss = float(dev.read(self.view(f"{loss_layer}.loss"))[0])
            for t in touched:
                t.locked = False
            for name in planned.offload if train else ():
                self._start_offload(self.tensors[name], op.step)
            for name in planned.frees:
                if not train and name == logits_name:
                    continue
                self._free(name)
        if not train and dev.has_data:
            logits = dev.read(self.view(logits_name, g.layers[g.inputs[loss_layer][0]].out_shape))
        dev.synchronize()
        trace.peak_tensors = self._peak_tensors()
        if self._spans:
            first = self._spans[0][2]
            self.stream_events = [dict(stream=s, label=label, start_ms=first.elapsed_ms(a), end_ms=first.elapsed_ms(b))
                                  for s, label, a, b in self._spans]
            self._spans = []
        self._end_iteration()
        return loss, logits

    def _load(self, x, labels) -> None:
        data = self.graph.layers["data"]
        x = np.asarray(x, dtype=np.float32)
        if x.shape != data.out_shape:
            raise ValueError(f"input batch has shape {x.shape}, the graph expects {data.out_shape}")
        self.device.write(np.ascontiguousarray(x), self.view("data"))
        if labels is not None:
            self.device.write(np.asarray(labels, dtype=np.int32), self.view("labels"))

    def _compute(self, op, names, train, iteration, seed) -> None:
        g = self.graph
        layer = g.layers[op.layer]
        phase = "forward" if op.phase == "recompute" else op.phase

        touched = {*op.reads, *op.writes}
        inplace = dict(op.inplace)  # new -> the tensor whose buffer it is written into

        def v(name, shape=None):  # only what the op declares it touches (and weights) has a view
            name = names.get(name, name)
            name = inplace.get(name, name)
            return self.view(name, shape) if name in touched or name in self.persistent_set else None

        if not self.device.has_data:  # the meta device: memory only; no views, no kernels
            workspace = self._workspace(op, layer, phase, StepIO(run=None))
            self._record(op, workspace)
            if workspace is not None:
                self._free_workspace(workspace)
            return
        if phase == "backward" and op.accumulate:  # a fork: sum the readers' gradients into the first
            first = g.output_grads(op.layer)[0]
            for t in op.accumulate:
                self.device.run("accumulate", v(first), v(t, self.specs[first].shape), stream=self.compute)
        shape_of = {i: g.layers[i].out_shape for i in g.inputs[op.layer]}
        io = StepIO(run=self._run, train=train, update_running=op.phase == "forward")
        io.x = [v(g.output_tensor(i), shape_of[i]) for i in g.inputs[op.layer]]
        io.y = v(g.output_tensor(op.layer), layer.out_shape)
        io.params = {p: v(f"{op.layer}.{p}") for p in layer.params()}
        io.buffers = {b: v(f"{op.layer}.{b}") for b in layer.buffers()}
        io.saved = {s: v(f"{op.layer}.{s}") for s in layer.saved()}
        io.labels = v("labels")
        io.seed = dropout_seed(seed, iteration, self._layer_index[op.layer])
        if phase == "backward":
            io.grads = {p: v(f"{op.layer}.{p}.grad") for p in layer.params()}
            dys = g.output_grads(op.layer)
            io.dy = v(dys[0], layer.out_shape) if dys else None
            io.dx = [v(t, shape_of[i]) for t, i in zip(g.input_grads(op.layer), g.inputs[op.layer])]
        workspace = self._workspace(op, layer, phase, io)
        self._record(op, workspace)
        with self._span("compute", self.compute, f"{op.layer} {op.phase}"):
            (layer.forward if phase == "forward" else layer.backward)(io)
        if workspace is not None:
            self._free_workspace(workspace)

    def _run(self, name, *args, **kwargs):
        self.device.run(name, *args, stream=self.compute, **kwargs)

    def _workspace(self, op, layer, phase, io):
        if layer.kind != "conv2d":
            return None
        kinds = ("forward",) if phase == "forward" else ("backward_filter", "backward_data")
        largest = self.pool.largest_free_block()
        choices = {k: ws.choose(layer, k, self.config.workspace, largest, self.costs) for k in kinds}
        io.algo = {k: c.algo for k, c in choices.items()}
        io.chunk = {k: c.chunk for k, c in choices.items()}
        for k, c in choices.items():
            self._trace.conv_choices.append(ConvChoice(op.step, op.layer, k, c.algo, c.chunk, c.workspace_bytes))
        nbytes = max(c.workspace_bytes for c in choices.values())
        if nbytes == 0:
            return None
        t = Tensor(name=f"{op.layer}.workspace", nbytes=nbytes, kind="workspace")
        self.tensors[t.name] = t
        self.specs[t.name] = TensorSpec(t.name, (nbytes // 4,), "float32", "workspace")
        self._alloc(t, op.step)
        if self.device.has_data:
            io.workspace = self.view(t.name)
        return t

    def _free_workspace(self, t: Tensor) -> None:
        self._release_block(t, t.free(), "workspace")
        del self.tensors[t.name]

    def _record(self, op, workspace) -> None:
        count = self.config.count
        device_bytes = dict(self._bytes)
        total = counted(device_bytes, count)
        cats = PAPER_CATEGORIES if count == "paper" else None
        touched = {*op.reads, *op.writes} - {new for new, _ in op.inplace}  # an in-place write shares its buffer
        working = sum(self.reserved(self.tensors[n].nbytes) for n in touched
                      if (cats is None or KIND_CATEGORY[self.tensors[n].kind] in cats)
                      and self.tensors[n].kind not in PERSISTENT_KINDS)
        if count == "all":
            working += sum(self._bytes[c] for c in ("weights", "weight_grads", "optimizer"))
            working += self.reserved(workspace.nbytes) if workspace is not None else 0
        host = self.host_pool.stats().in_use_bytes if self.host_pool is not None else 0
        rec = StepRecord(op.index, op.step, op.layer, op.phase, device_bytes, host, self._resident, total, working)
        tr = self._trace
        tr.steps.append(rec)
        tr.l_peak_bytes = max(tr.l_peak_bytes, working)
        tr.host_peak_bytes = max(tr.host_peak_bytes, host)
        if total > tr.peak_bytes:
            tr.peak_bytes, tr.peak_step, tr.peak_op = total, op.step, len(tr.steps) - 1
            self._peak_log = len(self._log)

    def _peak_tensors(self) -> tuple:
        """The tensors resident at the peak, largest first: the allocation log replayed up to it."""
        held: dict[str, int] = {}
        for name, sign in self._log[:self._peak_log]:
            held[name] = held.get(name, 0) + sign
        cats = PAPER_CATEGORIES if self.config.count == "paper" else None
        live = [(n, self.reserved(self.specs[base_name(n)].nbytes if base_name(n) in self.specs else 1))
                for n, k in held.items() if k > 0]
        live = [(n, b) for n, b in live if cats is None or KIND_CATEGORY[self._kind(n)] in cats]
        return tuple(sorted(live, key=lambda p: -p[1]))

    def _kind(self, name: str) -> str:
        spec = self.specs.get(base_name(name))
        return spec.kind if spec is not None else "workspace"

    def _end_iteration(self) -> None:
        for name in [n for n in self.tensors if n not in self.persistent_set]:
            self._free(name)
            del self.tensors[name]
        self._events.clear()
        self.lru.clear()

    @contextlib.contextmanager
    def scratch(self, name: str, shape):
        """A float32 view of ``shape`` taken from the pool for the duration of a ``with`` block
        (used to time conv algorithms with the runtime's own memory)."""
        t = Tensor(name=name, nbytes=4 * math.prod(shape), kind="workspace")
        self.specs[name] = TensorSpec(name, tuple(shape), "float32", "workspace")
        self.tensors[name] = t
        try:
            self._alloc(t, "scratch")
            yield self.view(name)
        finally:
            if t.resident:
                self._release_block(t, t.free(), "workspace")
            self.tensors.pop(name, None)
            self.specs.pop(name, None)

    def launch(self, op_name: str, *args, **kwargs) -> None:
        """Run a kernel on the compute stream."""
        self._run(op_name, *args, **kwargs)

    def _budget_message(self, t: Tensor, step, err: PoolFullError) -> str:
        live = sorted(((x.name, x.nbytes) for x in self.tensors.values() if x.resident), key=lambda p: -p[1])
        shown = ", ".join(f"{n} ({b:,d} B)" for n, b in live[:8]) + (f" and {len(live) - 8} more" if len(live) > 8 else "")
        if step == "setup":
            where = "while placing the weights and optimizer state"
        else:
            s = self.graph.steps()[step] if isinstance(step, int) else None
            where = f"at step {step} ({s.layer} {s.phase})" if s is not None else f"at {step}"
        return (f"{self.graph.name} does not fit a budget of {self.capacity:,d} bytes under "
                f"{self.config.describe()}: {where}, {t.name} needs {t.nbytes:,d} bytes but the largest free "
                f"block is {err.stats.largest_free_bytes:,d} bytes. Live there: {shown}.")


def optimizer_specs(graph) -> dict[str, TensorSpec]:
    """SGD's momentum buffers, one per weight: the optimizer state :class:`~snlite.train.Model` keeps."""
    return {f"{n}.momentum": TensorSpec(f"{n}.momentum", t.shape, "float32", "optimizer")
            for n, t in graph.tensors().items() if t.kind == "weight"}


def simulate(graph, config: MemoryConfig | None = None, optimizer: bool = True, costs=None) -> Trace:
    """Run one training iteration of ``graph`` under ``config`` on the meta device and return
    its trace: what a :class:`~snlite.train.Model` (SGD with momentum, unless ``optimizer`` is
    False) then allocates on the host or CUDA device, byte for byte. ``costs``: the conv
    algorithm timings a GPU measured (``Model.runtime.costs``), to plan that GPU's choices."""
    rt = Runtime(graph, config, _meta(), optimizer_specs(graph) if optimizer else None, costs)
    rt.run()
    return rt.trace


def smallest_budget(graph, config: MemoryConfig, lo: int = 0, hi: int | None = None, block: int = 1024,
                    extra=None, costs=None) -> int:
    """The smallest ``budget_bytes`` (a multiple of ``block``) under which ``config`` runs
    (binary search with the meta device; ``extra`` tensors as given to :class:`Runtime`)."""
    from dataclasses import replace

    hi = hi or Runtime(graph, replace(config, budget_bytes=None), _meta(), extra).capacity
    if not _fits(graph, replace(config, budget_bytes=hi), extra, costs):
        raise BudgetError(f"{graph.name} does not fit even {hi:,d} bytes under {config.describe()}")
    lo = max(lo // block, 0)
    hi = math.ceil(hi / block)
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if _fits(graph, replace(config, budget_bytes=mid * block), extra, costs):
            hi = mid
        else:
            lo = mid
    return hi * block


def _fits(graph, config, extra=None, costs=None) -> bool:
    try:
        Runtime(graph, config, _meta(), extra, costs).run()
        return True
    except BudgetError:
        return False


def _meta():
    from snlite.device import MetaDevice

    return MetaDevice()
