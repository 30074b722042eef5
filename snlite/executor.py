"""The executor: replays a :class:`~snlite.program.Program` on a device, and does nothing else.

Every decision (where each tensor lives, which copy runs on which stream, which event it waits for,
which conv algorithm runs) was made by the placement pass; here each instruction becomes one device
call::

    Alloc   -> a view of the arena at the offset (raw: one device allocation, NaN-filled on its stream)
    Free    -> the view is dropped            HandOver -> the view gets its new name
    Copy    -> an asynchronous copy on its stream, between a device view and a pinned slab view
    Record / Wait / HostWait -> the CUDA event calls     HostWrite / HostRead -> the pinned slots
    Launch  -> the layer step's kernels on its stream (or one layer's SGD update)

The same loop runs on the meta device (views without data, kernels that only check their
arguments), the host device (NumPy), the adversarial host device (:mod:`snlite.adversary`) and CUDA.

The executor views every tensor by its spec's shape and copies whole views, so it checks, cheaply,
that the program's own numbers say the same (an Alloc holds its view, a Free frees that allocation, a
copy moves that view's bytes between that tensor's block and a slot made for it): what the checker
(:mod:`snlite.checker`, which validates those numbers) certified is what runs. A mismatch is a
:class:`~snlite.validate.ProgramError` naming the instruction.
"""
from __future__ import annotations

import contextlib

import numpy as np

from snlite.audit import Audit
from snlite.layers import StepIO
from snlite.layers_base import Undeclared, declared
from snlite.program import STREAMS, Alloc, Copy, Free, HandOver, HostRead, HostWait, HostWrite, Launch, \
    Record, Wait
from snlite.validate import ProgramError


class _Mismatch(Exception):
    """A number of the instruction being run disagrees with what the executor does (made one line,
    with the instruction's place, by the loop that ran it)."""


def dropout_seed(seed: int, iteration: int, layer_index: int) -> int:
    """A 32-bit seed that depends only on (model seed, iteration, layer): splitmix64 mixing."""
    z = ((seed * 0x9E3779B97F4A7C15 + iteration * 0xBF58476D1CE4E5B9 + layer_index * 0x94D049BB133111EB)
         & (2**64 - 1))
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & (2**64 - 1)
    return (z ^ (z >> 31)) & 0xFFFFFFFF


def _hide_undeclared(io: StepIO, layer, phase: str) -> None:
    """Put :class:`Undeclared` in place of each tensor the step's declarations do not name, so that
    a layer using one fails at once, naming it, under every configuration (not only where liveness
    or offload freed it)."""
    roles = declared(layer, phase)
    for role in ("x", "y", "dy", "dx", "labels"):
        value = getattr(io, role)
        if role not in roles and value is not None:
            setattr(io, role, [Undeclared(layer, phase, role)] * len(value) if isinstance(value, list)
                    else Undeclared(layer, phase, role))
    for s in io.saved:
        if s not in roles:
            io.saved[s] = Undeclared(layer, phase, s)
    if phase == "backward":
        if "bias" in io.params:
            io.params["bias"] = Undeclared(layer, phase, "the bias", "a backward reads the other parameters "
                                                                     "(the bias's gradient needs only dy)")
        for b in io.buffers:
            io.buffers[b] = Undeclared(layer, phase, f"the buffer {b!r}", "a backward reads no buffer: save "
                                                                          "what it needs in the forward")


class Executor:
    """A graph's memory on ``device``: one arena of ``arena_bytes``, one pinned slab of ``slab_bytes``
    and the program streams, taken once; :meth:`run` replays a program's body on them.

    ``launch_bytes[mode]`` is, after a run of a program of that mode, the device bytes allocated at
    each launch, the SGD updates after backward too (what the device really held there);
    ``stream_events[mode]``, with ``profile`` on a CUDA device, every kernel step and copy of that
    program's last run timed with events, per stream."""

    def __init__(self, graph, device, arena_bytes: int, slab_bytes: int):
        self.graph, self.device = graph, device
        self.arena = device.alloc_arena(arena_bytes) if arena_bytes else None
        self.slab = device.alloc_pinned(slab_bytes) if slab_bytes else None
        self.streams = {name: device.stream(name) for name in STREAMS}
        self.views: dict[str, object] = {}  # device tensor -> its view
        self.buffers: dict[int, object] = {}  # raw allocator: handle -> its own device buffer
        self.events: dict[str, object] = {}
        self.in_use_bytes = 0
        self.launch_bytes: dict[str, list[int]] = {}
        self.layer_index = {name: i for i, name in enumerate(graph.layers)}
        self.profile = False
        self.audit = False  # on: every launch is checked to touch only what it names (snlite.audit)
        self.stream_events: dict[str, list[dict]] = {}  # program mode -> its last profiled run
        self.host_views: dict[str, object] = {}  # persistent tensors that live in the pinned slab (momentum)
        # the device views of persistent tensors: a program whose body allocates and frees one of them
        # (weight gradients, where steps update in backward) leaves the installed view in place
        self._persistent: dict[str, object] = {}
        self._installed: dict[str, Alloc] = {}
        self._spans: list = []
        # (space, tensor) -> (offset or handle, nbytes) of its allocation
        self.placed: dict[tuple, tuple] = {}
        self._audit = Audit(self.arena, self.placed)

    def install(self, program) -> None:
        """Place the persistent tensors (weights, buffers, momentum, gradients) a program's setup
        names, once: programs sharing an executor agree on every tensor they both place (a "grads"
        program may add the weight gradients a "train" program that updates in backward has not)."""
        moved = [ins.tensor for ins in program.setup if self._installed.get(ins.tensor, ins) != ins]
        if moved:
            raise ValueError(f"this program places {moved[0]} elsewhere than the one installed: programs "
                             "that share an executor must come from the same graph and configuration")
        for i, ins in enumerate(program.setup):
            if ins.tensor not in self._installed:
                try:
                    self._alloc(ins, program, persistent=True)
                except _Mismatch as e:
                    raise ProgramError(f"setup #{i} ({ins}): {e}") from None
                self._installed[ins.tensor] = ins
                if ins.tensor in self.views:
                    self._persistent[ins.tensor] = self.views[ins.tensor]

    def view(self, name: str):
        """The view of a tensor placed now (the persistent ones between iterations); a tensor that
        lives in the pinned slab (momentum with ``optimizer_state="host"``) gives its slab view."""
        view = self.views.get(name)
        return view if view is not None else self.host_views[name]

    # ------------------------------------------------------------ one iteration
    def run(self, program, inputs: dict | None = None, *, iteration: int = 0, seed: int = 0,
            sgd: dict | None = None):
        """Replay ``program``'s body once. ``inputs``: the arrays its HostWrites stage (``data``,
        ``labels``; None where the device holds no data); ``sgd``: ``lr``, ``momentum``,
        ``weight_decay`` for its update launches. Returns what its HostReads read, by tensor."""
        self.install(program)
        self.program, self.inputs, self.sgd = program, inputs or {}, sgd
        self.iteration, self.seed = iteration, seed
        self.train = program.mode != "infer"
        self.results: dict[str, np.ndarray] = {}
        self.in_use_bytes = sum(i.nbytes for i in program.setup if i.space != "slab")  # what it placed
        self._launched = self.launch_bytes[program.mode] = []
        handlers = self._handlers
        i = ins = None
        try:
            for i, ins in enumerate(program.body):
                handlers[type(ins)](self, ins)
        except _Mismatch as e:
            raise ProgramError(f"{program.net}'s {program.mode} program, body #{i} ({ins}): {e}") from None
        self.events.clear()
        if self._spans:
            first = self._spans[0][2]
            self.stream_events[program.mode] = [
                dict(stream=s, label=label, start_ms=first.elapsed_ms(a), end_ms=first.elapsed_ms(b))
                for s, label, a, b in self._spans]
            self._spans = []
        return self.results

    # ------------------------------------------------------------ the instructions
    def _alloc(self, ins, program=None, persistent: bool = False) -> None:
        self.placed[ins.space, ins.tensor] = (ins.offset, ins.nbytes)
        if ins.space == "slab":
            if persistent:  # a tensor that lives in the slab between its uses
                shape, dtype = (program or self.program).spec(ins.tensor)[:2]
                view = self.host_views[ins.tensor] = self.device.view(self.slab, ins.offset, shape, dtype)
                _fits(view, ins)
            return
        shape, dtype = (program or self.program).spec(ins.tensor)[:2]
        shape = shape if shape is not None else (ins.nbytes // 4,)  # a conv workspace: its whole block
        if ins.space == "raw":
            buf = self.device.alloc_arena(ins.nbytes, stream=self.streams[ins.stream])
            self.buffers[ins.offset] = buf
            view = self.views[ins.tensor] = self.device.view(buf, 0, shape, dtype)
        else:
            view = self.views[ins.tensor] = self.device.view(self.arena, ins.offset, shape, dtype)
        _fits(view, ins)
        self.in_use_bytes += ins.nbytes

    def _free(self, ins) -> None:
        placed = self.placed.pop((ins.space, ins.tensor), None)
        if placed != (ins.offset, ins.nbytes):
            raise _Mismatch(f"frees {ins.offset:#x}, {ins.nbytes:,d} bytes, but {ins.tensor}'s {ins.space} "
                            "allocation is " + ("none" if placed is None else
                                                f"{placed[0]:#x}, {placed[1]:,d} bytes"))
        if ins.space == "slab":
            return
        del self.views[ins.tensor]
        if ins.tensor in self._persistent:  # another program's persistent tensor: its view stays
            self.views[ins.tensor] = self._persistent[ins.tensor]
            installed = self._installed[ins.tensor]
            self.placed[installed.space, ins.tensor] = (installed.offset, installed.nbytes)
        if ins.space == "raw":
            del self.buffers[ins.offset]
        self.in_use_bytes -= ins.nbytes

    def _hand_over(self, ins) -> None:
        self.views[ins.new] = self.views.pop(ins.old).reshape(tuple(self.program.spec(ins.new)[0]))
        for space in ("arena", "raw"):
            placed = self.placed.pop((space, ins.old), None)
            if placed is not None:
                self.placed[space, ins.new] = placed

    def _slab_view(self, ins, offset: int):
        """The pinned view of ``ins.tensor`` at ``offset``, which must start a slot made for it (named
        after it: NAME, or the staging slots NAME:in and NAME:out), and hold ``ins.nbytes``."""
        tensor, placed = ins.tensor, self.placed
        slots = (tensor, f"{tensor}:in", f"{tensor}:out")
        if all(placed.get(("slab", n), (None,))[0] != offset for n in slots):
            raise _Mismatch(f"slab offset {offset:#x} starts no pinned slot made for {tensor}")
        shape, dtype, _ = self.program.spec(tensor)
        view = self.device.view(self.slab, offset, shape, dtype)
        if view.nbytes != ins.nbytes:
            raise _Mismatch(f"moves {ins.nbytes:,d} bytes, but {tensor} has {view.nbytes:,d}")
        return view

    def _copy(self, ins) -> None:
        stream = self.streams[ins.stream]
        space, offset = (ins.src, ins.src_offset) if ins.to_host else (ins.dst, ins.dst_offset)
        placed = self.placed.get((space, ins.tensor))
        if placed is None or placed[0] != offset:
            raise _Mismatch(f"copies {space} {offset:#x}, but {ins.tensor}'s {space} allocation is "
                            + ("none" if placed is None else f"{placed[0]:#x}"))
        with self._span(ins.stream, stream, f"{ins.tensor} {'to host' if ins.to_host else 'to device'}"):
            if ins.to_host:
                self.device.copy_to_host(self.views[ins.tensor], self._slab_view(ins, ins.dst_offset), stream)
            else:
                self.device.copy_to_device(self._slab_view(ins, ins.src_offset),
                                           self.views[ins.tensor], stream)

    def _record(self, ins) -> None:
        event = self.events[ins.event] = self.device.event()
        event.record(self.streams[ins.stream])

    def _wait(self, ins) -> None:
        self.events[ins.event].wait(self.streams[ins.stream])

    def _host_wait(self, ins) -> None:
        self.events[ins.event].synchronize()

    def _host_write(self, ins) -> None:
        value = self.inputs.get(ins.tensor)
        if value is not None:
            self.device.host_write(self._slab_view(ins, ins.offset), value)

    def _host_read(self, ins) -> None:
        if self.device.has_data:
            self.results[ins.tensor] = self.device.host_read(self._slab_view(ins, ins.offset))

    def _launch(self, ins) -> None:
        if not self.audit:
            self._run_launch(ins)
            return
        problem = self._audit.launch(ins, lambda: self._run_launch(ins))
        if problem:
            raise _Mismatch(problem)

    def _run_launch(self, ins) -> None:
        self._launched.append(self.in_use_bytes)  # what the trace's StepRecord of this launch counts
        if ins.phase == "update":
            with self._span(ins.stream, self.streams[ins.stream], f"{ins.layer} update"):
                self._update(ins)
            return
        with self._span(ins.stream, self.streams[ins.stream], f"{ins.layer} {ins.phase}"):
            self._step(ins)

    def _step(self, ins) -> None:
        """The layer step's kernels, on views looked up by the names the launch gives."""
        g, views = self.graph, self.views
        layer = g.layers[ins.layer]
        phase = "forward" if ins.phase == "recompute" else ins.phase
        names, inplace = dict(ins.names), dict(ins.inplace)
        stream = self.streams[ins.stream]

        def v(name, shape=None):
            name = names.get(name, name)
            view = views.get(inplace.get(name, name))
            if view is None or shape is None or tuple(shape) == tuple(view.shape):
                return view
            return view.reshape(shape)

        def run(op_name, *args, **kwargs):
            self.device.run(op_name, *args, stream=stream, **kwargs)

        if phase == "backward" and ins.accumulate:  # a fork: sum the readers' gradients into the first
            first = g.output_grads(ins.layer)[0]
            for t in ins.accumulate:
                run("accumulate", v(first), v(t, self.program.spec(first)[0]))
        shape_of = {i: g.layers[i].out_shape for i in g.inputs[ins.layer]}
        io = StepIO(run=run, train=self.train, update_running=ins.phase == "forward")
        io.x = [v(g.output_tensor(i), shape_of[i]) for i in g.inputs[ins.layer]]
        io.y = v(g.output_tensor(ins.layer), layer.out_shape)
        io.params = {p: v(layer.state_name(p)) for p in layer.params()}
        io.buffers = {b: v(layer.state_name(b)) for b in layer.buffers()}
        io.saved = {s: v(f"{ins.layer}.{s}") for s in layer.saved()}
        io.labels = v("labels")
        io.seed = dropout_seed(self.seed, self.iteration, self.layer_index[ins.layer])
        io.algo = {op: algo for op, algo, _, _ in ins.convs}
        io.chunk = {op: chunk for op, _, chunk, _ in ins.convs}
        io.workspace = views[ins.workspace] if ins.workspace else None
        if phase == "backward":
            io.grads = {p: v(f"{layer.state_name(p)}.grad") for p in layer.params()}
            dys = g.output_grads(ins.layer)
            io.dy = v(dys[0], layer.out_shape) if dys else None
            io.dx = [v(t, shape_of[i]) for t, i in zip(g.input_grads(ins.layer), g.inputs[ins.layer])]
        _hide_undeclared(io, layer, phase)
        (layer.forward if phase == "forward" else layer.backward)(io)

    def _update(self, ins) -> None:
        """SGD with momentum (torch.optim.SGD's rule) on one layer's weights; skipped on the device if
        the launch reads the loss (an update inside backward) and the loss is not finite."""
        if self.sgd is None:
            raise ValueError(f"{self.program.net}'s program updates the weights: run it with "
                             "sgd=dict(lr=..., momentum=..., weight_decay=...)")
        stream = self.streams[ins.stream]
        loss = f"{self.graph.loss_layer}.loss"
        guard = self.views[loss] if loss in ins.reads else None
        layer = self.graph.layers[ins.layer]
        for p in layer.params():
            w = layer.state_name(p)
            self.device.run("sgd_update", self.views[w], self.views[f"{w}.grad"], self.views[f"{w}.momentum"],
                            stream=stream, guard=guard, **self.sgd)

    def _span(self, stream_name: str, stream, label: str):
        """With ``profile`` on, bracket the work enqueued inside with timing events (on the host,
        wall-clock: work runs as it is issued, one step after another)."""
        if not (self.profile and self.device.name in ("cuda", "host")):
            return contextlib.nullcontext()
        return _Span(self, stream_name, stream, label)

    _handlers = {Alloc: _alloc, Free: _free, HandOver: _hand_over, Copy: _copy, Record: _record, Wait: _wait,
                 HostWait: _host_wait, HostWrite: _host_write, HostRead: _host_read, Launch: _launch}


def _fits(view, ins) -> None:
    if view.nbytes > ins.nbytes:
        raise _Mismatch(f"allocates {ins.nbytes:,d} bytes, but {ins.tensor} takes {view.nbytes:,d}")


class _Span:
    def __init__(self, executor, stream_name, stream, label):
        self.ex, self.stream_name, self.stream, self.label = executor, stream_name, stream, label

    def __enter__(self):
        self.start = self.ex.device.event(timing=True)
        self.start.record(self.stream)

    def __exit__(self, *exc):
        end = self.ex.device.event(timing=True)
        end.record(self.stream)
        self.ex._spans.append((self.stream_name, self.label, self.start, end))
        return False
