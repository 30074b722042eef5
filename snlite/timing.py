"""A GPU time model: how long one iteration's program takes on a GPU, stream by stream, without one.

SuperNeurons' offload pays off only if its copies hide behind compute. The program (:mod:`snlite.program`)
says exactly what runs on which stream and which event each stream waits for, so replaying it against a
device profile gives a timeline: when each kernel step and copy starts and ends, how long the step takes,
how busy each stream is, and how much of the transfer time the compute stream actually waits for.

    tl = estimate(place(graph, config), graph, "H200")
    tl.step_ms, tl.busy_ms, tl.transfer_ms, tl.exposed_ms, tl.overlap
    plot_streams(tl.events(), "streams.png", memory=tl.memory)

The model, and what it ignores:

- **Kernels**: a layer step's launches are recorded from its launchers on shape-only arrays
  (:func:`kernels.launches.step_launches`); a launch whose launcher states its work (GEMM, convolution,
  im2col) costs that work at the GPU's peak FP32 rate or memory bandwidth, over the share of the GPU its
  blocks fill (:func:`kernels.launches.launch_ms`, occupancy from ptxas); the other kernels of a step
  (element-wise, pooling, normalisation, softmax, SGD) cost the bytes of the step's tensors at the memory
  bandwidth (a roofline's memory side: they do a few FLOPs a byte). Optimistic: perfect caching and
  bandwidth, no contention between a copy and a kernel for memory bandwidth.
- **Copies**: bytes over the profile's pinned host-to-device or device-to-host bandwidth, plus a fixed
  latency; the two directions run at once (two copy engines), each stream in order.
- **The host**: enqueueing a kernel costs ``launch_us`` of host time (Numba's launch path, not CUDA's
  few microseconds), a copy ``copy_us``; work starts no earlier than it was enqueued, so a program of
  many tiny kernels is launch-bound, as on a real GPU driven from Python. Writing the batch into its
  pinned slot runs at ``host_gbs``. ``HostWait`` blocks the host until its event.
- **Allocation**: the pool's allocations cost nothing (bookkeeping); with ``allocator="raw"`` each
  allocation costs ``malloc_us`` and each free synchronizes the device (``cudaFree``), the churn the paper
  measured at 36% of ResNet-50's time.

Profiles are data (:data:`PROFILES`, from the vendors' data sheets); :func:`calibrate` scales a profile's
kernel times to measured ones (the per-stream events of ``snlite train --streams`` on a real GPU).
"""
from __future__ import annotations

import dataclasses
import re
import types
from dataclasses import dataclass, field

from kernels import launches as L
from snlite.program import COMPUTE, STREAMS, Alloc, Copy, Free, HostRead, HostWait, HostWrite, \
    Launch, Record, Wait, program_of, without_cycle_collection
from snlite.validate import ProgramError, against_graph

MOVING = ("offload", "evict", "prefetch", "fetch", "state")  # copies that exist because memory is short


@dataclass(frozen=True)
class Profile:
    """A GPU and its host link. ``gpu`` names the kernels' model of the chip
    (:data:`kernels.launches.GPUS`: SMs, occupancy limits, peak FP32, memory bandwidth)."""

    name: str
    gpu: str
    h2d_gbs: float  # pinned host-to-device bandwidth, GB/s
    d2h_gbs: float  # pinned device-to-host bandwidth, GB/s
    copy_latency_us: float = 10.0  # per copy, on its stream
    launch_us: float = 10.0  # host time to enqueue one kernel launch (Numba)
    copy_us: float = 5.0  # host time to enqueue one copy or event call
    host_gbs: float = 10.0  # host memcpy into a pinned slot
    malloc_us: float = 50.0  # one cudaMalloc (raw allocator only)
    kernel_scale: float = 1.0  # measured / modelled kernel time (see calibrate)


PROFILES = {
    "H200": Profile("NVIDIA H200 (PCIe Gen5 x16)", "H200", h2d_gbs=55.0, d2h_gbs=55.0),
    "H100": Profile("NVIDIA H100 SXM5 (PCIe Gen5 x16)", "H100", h2d_gbs=55.0, d2h_gbs=55.0),
    "A100": Profile("NVIDIA A100 (PCIe Gen4 x16)", "A100", h2d_gbs=25.0, d2h_gbs=25.0),
    "T4": Profile("NVIDIA T4 (PCIe Gen3 x16)", "T4", h2d_gbs=12.0, d2h_gbs=12.0),
    "K40": Profile("NVIDIA Tesla K40 (PCIe Gen3 x16), the paper's", "K40", h2d_gbs=10.0, d2h_gbs=10.0,
                   launch_us=10.0, copy_latency_us=15.0),
}


def profile(name_or_profile) -> Profile:
    """A :class:`Profile` from its name in :data:`PROFILES` (or a profile, returned as is)."""
    if isinstance(name_or_profile, Profile):
        return name_or_profile
    found = PROFILES.get(str(name_or_profile).upper())
    if found is None:
        raise ValueError(f"unknown GPU profile {name_or_profile!r}; choose one of {', '.join(PROFILES)}")
    return found


def profile_for(gpu_name: str, default: str = "H200") -> str:
    """The profile of the GPU a CUDA device calls itself (``"NVIDIA H100 80GB HBM3"``: "H100"), its name
    found at the start of a word of ``gpu_name`` and not followed by a digit (a K40c is a K40, an A1000 no
    A100); ``default`` for a GPU without a profile (or the simulator)."""
    return next((p for p in PROFILES if re.search(rf"\b{p}(?!\d)", gpu_name, re.IGNORECASE)), default)


@dataclass
class Timeline:
    """One iteration replayed on a profile. ``spans``: (stream, start_ms, end_ms, label, kind) with kind
    "kernel" or the copy's reason; ``memory``: (ms, device bytes in use) at each launched op."""

    profile: str
    spans: list = field(default_factory=list)
    memory: list = field(default_factory=list)
    step_ms: float = 0.0
    busy_ms: dict = field(default_factory=dict)
    transfer_ms: float = 0.0  # copy time of the moves memory forced (offload, eviction, prefetch, fetch)
    exposed_ms: float = 0.0  # how much longer the step is because of those copies
    launches: int = 0

    @property
    def overlap(self) -> float:
        """The share of the moves' copy time hidden behind compute (1.0 when nothing moves)."""
        if not self.transfer_ms:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.exposed_ms / self.transfer_ms))  # (not -0% for rounding)

    def events(self) -> list[dict]:
        """The spans as ``snlite.plot.plot_streams`` (and ``Model.stream_events``) write them."""
        return [dict(stream=s, label=label, start_ms=a, end_ms=b) for s, a, b, label, _ in self.spans]

    def summary(self) -> str:
        busy = ", ".join(f"{s} {self.busy_ms.get(s, 0.0):,.2f} ms" for s in STREAMS)
        return (f"{self.profile}: step {self.step_ms:,.2f} ms ({self.launches:,d} kernel launches); "
                f"busy: {busy}; moves {self.transfer_ms:,.2f} ms, exposed {self.exposed_ms:,.2f} ms, "
                f"overlap {self.overlap:.0%}")


def copy_ms(prof: Profile, nbytes: int, to_host: bool) -> float:
    """One copy's time on its stream: the fixed latency, then the bytes over the pinned bandwidth."""
    bw = prof.d2h_gbs if to_host else prof.h2d_gbs
    return prof.copy_latency_us * 1e-3 + nbytes / (bw * 1e6)


def op_starts(program, graph, gpu: str, n_ops: int) -> list[float]:
    """Estimated start time (ms) of every op of a plan of ``n_ops`` ops, placed as ``program``, if
    compute never waited: the sum of the kernel times of the ops before it (``start[n_ops]``: the
    end of the last). What :mod:`snlite.overlap` retimes copies against."""
    costs = _Costs(graph, program, profile(gpu))
    ms = [0.0] * n_ops
    for ins in program.body:
        if type(ins) is Launch and ins.op >= 0:
            ms[ins.op] = costs.launch(ins)[0]
    start = [0.0]
    for d in ms:
        start.append(start[-1] + d)
    return start


def estimate(program, graph, gpu="H200", kernel_ms=None) -> Timeline:
    """The timeline of ``program`` (of ``graph``) on the profile ``gpu`` (see the module docstring).
    ``kernel_ms``: a function of a Launch instruction giving (milliseconds, kernel launches), in place
    of the kernels' model (for hand-made programs and lessons; ``graph`` may then be None)."""
    program, prof = program_of(program), profile(gpu)
    if kernel_ms is None:  # the kernels' times come from the graph's layers: they must be the program's
        if graph is None:
            raise ValueError("estimate needs the graph the program was planned for (its layers time the "
                             "kernels), or kernel_ms, a function of a Launch giving (milliseconds, launches)")
        try:
            against_graph(program, graph)
        except ProgramError as e:
            raise ProgramError(f"estimate: the graph given is not the program's: {e}") from None
    with without_cycle_collection():
        costs = _Fixed(kernel_ms) if kernel_ms is not None else _Costs(graph, program, prof)
        tl = _replay(program, prof, costs, moving_copies=True)
        tl.exposed_ms = max(0.0, tl.step_ms - _replay(program, prof, costs, moving_copies=False).step_ms)
    return tl


def _replay(program, prof: Profile, costs: "_Costs", moving_copies: bool) -> Timeline:
    tl = Timeline(prof.name)
    clock = dict.fromkeys(STREAMS, 0.0)
    busy = dict.fromkeys(STREAMS, 0.0)
    events: dict[str, float] = {}
    host = 0.0
    in_use = 0
    for ins in program.body:
        t = type(ins)
        if t is Launch:
            ms, n = costs.launch(ins)
            host += n * prof.launch_us * 1e-3
            start = max(clock[ins.stream], host)
            clock[ins.stream] = end = start + ms
            busy[ins.stream] += ms
            tl.launches += n
            tl.spans.append((ins.stream, start, end, f"{ins.layer} {ins.phase}", "kernel"))
            if ins.op >= 0:  # not the SGD step after backward
                tl.memory.append((start, in_use))
        elif t is Copy:
            host += prof.copy_us * 1e-3
            ms = copy_ms(prof, ins.nbytes, ins.to_host)
            if ins.why in MOVING:
                tl.transfer_ms += ms
                if not moving_copies:
                    ms = 0.0
            start = max(clock[ins.stream], host)
            clock[ins.stream] = end = start + ms
            busy[ins.stream] += ms
            tl.spans.append((ins.stream, start, end, f"{ins.tensor} ({ins.why})", ins.why))
        elif t is Record:
            host += prof.copy_us * 1e-3
            events[ins.event] = clock[ins.stream]
        elif t is Wait:
            host += prof.copy_us * 1e-3
            clock[ins.stream] = max(clock[ins.stream], events[ins.event])
        elif t is HostWait:
            host = max(host, events[ins.event])
        elif t is HostWrite or t is HostRead:
            host += ins.nbytes / (prof.host_gbs * 1e6)
        elif t is Alloc:
            if ins.space != "slab":
                in_use += ins.nbytes
            if ins.space == "raw":
                host += prof.malloc_us * 1e-3
                clock[ins.stream] = max(clock[ins.stream], host)
        elif t is Free:
            if ins.space != "slab":
                in_use -= ins.nbytes
            if ins.space == "raw":  # cudaFree waits for the whole device
                host = max(host, *clock.values()) + prof.malloc_us * 1e-3
    tl.step_ms = host
    tl.busy_ms = busy
    return tl


class _Costs:
    """Milliseconds of each layer step on a profile, memoised by what the cost depends on: the layer's
    type, attributes and shapes (not its name: a deep ResNet repeats a few layers thousands of
    times), the phase, the conv choices, the fork accumulations and the bytes the step touches."""

    def __init__(self, graph, program, prof: Profile):
        self.graph, self.program, self.prof, self.L = graph, program, prof, L
        self.gpu = L.GPUS[prof.gpu]
        self.memo: dict = {}
        self.signatures: dict = {}

    def _signature(self, name: str):
        sig = self.signatures.get(name)
        if sig is None:
            layer = self.graph.layers[name]
            sig = self.signatures[name] = (type(layer), tuple(layer.in_shapes), layer.out_shape,
                                           repr(sorted(layer.attrs.items())))
        return sig

    def launch(self, ins) -> tuple[float, int]:
        key = (self._signature(ins.layer), ins.phase, ins.convs, len(ins.accumulate),
               self._bytes({*ins.reads, *ins.writes}))
        if key not in self.memo:
            self.memo[key] = self._cost(ins)
        return self.memo[key]

    def _bytes(self, names) -> int:
        total = 0
        for n in names:
            shape, dtype, _ = self.program.spec(n)
            if shape is not None:
                total += _nbytes(shape, dtype)
        return total

    def _cost(self, ins) -> tuple[float, int]:
        L, gpu = self.L, self.gpu
        bw = gpu.bandwidth_gbs * 1e6  # bytes per ms
        if ins.phase == "update":  # SGD with momentum: read w, g, m; write w, m
            params = self.graph.layers[ins.layer].params()
            nbytes = sum(5 * 4 * _prod(s) for s in params.values())
            return self.prof.kernel_scale * nbytes / bw, len(params)
        choices = {op: types.SimpleNamespace(algo=algo, chunk=chunk, workspace_bytes=ws)
                   for op, algo, chunk, ws in ins.convs}
        phase = "backward" if ins.phase == "backward" else "forward"
        launched = L.step_launches(self.graph, ins.layer, phase, choices, accumulate=len(ins.accumulate))
        ms = sum(L.launch_ms(gpu, l, L.resources(l.kernel, gpu.arch))
                 for l in launched if l.flops is not None)
        if any(l.flops is None for l in launched):  # the memory-bound kernels: the step's tensors, once
            ms += self._bytes({*ins.reads, *ins.writes}) / bw
        return self.prof.kernel_scale * ms, len(launched)


class _Fixed:
    def __init__(self, kernel_ms):
        self.launch = kernel_ms


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _nbytes(shape, dtype) -> int:
    return _prod(shape) * (1 if dtype == "uint8" else 8 if dtype in ("float64", "int64") else 4)


def calibrate(prof, measured_events, modelled: Timeline) -> Profile:
    """``prof`` with its kernel times scaled so that the compute stream's modelled busy time equals the
    measured one (``measured_events``: ``Model.stream_events`` of the same program on a real GPU)."""
    prof = profile(prof)
    measured = sum(e["end_ms"] - e["start_ms"] for e in measured_events if e["stream"] == COMPUTE)
    model = modelled.busy_ms.get(COMPUTE, 0.0)
    if measured <= 0 or model <= 0:
        raise ValueError("calibrate needs compute-stream events and a timeline with kernel time")
    return dataclasses.replace(prof, name=f"{prof.name}, calibrated",
                               kernel_scale=prof.kernel_scale * measured / model)


__all__ = ["MOVING", "PROFILES", "Profile", "Timeline", "calibrate", "estimate", "profile", "profile_for"]
