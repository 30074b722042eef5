"""The launch report: what one training iteration launches, and how well each launch fills a GPU,
worked out on the CPU (no GPU, no data):

    snlite launches alexnet --batch 200                           # per layer and op, on an H200
    snlite launches resnet50 --batch 384 --gpu T4 --workspace none --conv
    python -m kernels.launches --registers                        # re-measure kernels/registers.json

Every registered kernel records its launches instead of running inside
``kernels._common.record_launches()``, so calling a launcher with shape-only arrays
(:class:`~kernels._common.ShapeArray`) gives exactly the launches it would make: kernel, grid,
block, and (for GEMM and convolution) the work. The report runs each layer's forward and
backward that way, with the convolution algorithm and chunk that ``snlite.simulate`` chose for
each conv step on the meta device, then the SGD update.

Waves: a GPU runs ``SMs x blocks per SM`` blocks at once; blocks per SM (occupancy) is limited by
threads, by shared memory and by registers per thread. Registers, spills and static shared memory
come from ptxas (``ptxas -v``) on the PTX that Numba generates (:mod:`kernels.registers`); they are
measured once into ``kernels/registers.json`` (``--registers``; ``tests/test_ptx.py`` checks the
file against ptxas where ptxas is installed) and read from there, or measured now with ``--ptxas``.

:func:`launch_ms` turns a launch's work into an estimated time on a GPU (the convolution cost
model of ``snlite.workspace`` uses it). This module never imports snlite: the network and its conv
choices come in as arguments (duck-typed), and ``snlite launches`` (:mod:`snlite.cli_launches`)
builds them.
"""
from __future__ import annotations

import argparse
import math
import sys
import types
from collections import Counter
from dataclasses import dataclass

import numpy as np

from kernels._common import Launch, ShapeArray, record_launches
from kernels.registers import REGISTERS_FILE, Resources, measured_with, resources, write_registers

TARGET_OUTPUT_ELEMENTS = 10**7  # conv ops writing more than this must run at least TARGET_WAVES waves
TARGET_WAVES = 2.0


# ---------------------------------------------------------------- GPUs and occupancy
@dataclass(frozen=True)
class Gpu:
    """What occupancy and the cost model need of a GPU (NVIDIA's data sheets and the CUDA
    occupancy calculator's limits per compute capability)."""

    name: str
    arch: str  # the ptxas target whose register counts apply
    sms: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int
    shared_per_sm: int  # bytes usable by blocks
    shared_reserved_per_block: int  # bytes the driver keeps per block (sm_80 and later: 1 KiB)
    fp32_tflops: float  # peak FP32 (FMA = 2 FLOPs), no tensor cores
    bandwidth_gbs: float  # DRAM bandwidth, GB/s


GPUS = {
    "H200": Gpu("H200", "sm_90", 132, 2048, 32, 65536, 228 * 1024, 1024, 67.0, 4800.0),
    # the same chip (GH100, SXM5) with HBM3 instead of HBM3e: the H200's limits, 70% of its bandwidth
    "H100": Gpu("H100", "sm_90", 132, 2048, 32, 65536, 228 * 1024, 1024, 67.0, 3350.0),
    "A100": Gpu("A100", "sm_80", 108, 2048, 32, 65536, 164 * 1024, 1024, 19.5, 2039.0),
    "T4": Gpu("T4", "sm_75", 40, 1024, 16, 65536, 64 * 1024, 0, 8.1, 320.0),
    # the paper's GPU; no ptxas for sm_35 any more, so its occupancy is an upper bound (threads, blocks, smem)
    "K40": Gpu("K40", "sm_35", 15, 2048, 16, 65536, 48 * 1024, 0, 4.29, 288.0),
}
REGISTER_UNIT = 256  # registers are allocated to a warp in units of 256
SHARED_UNIT = 128  # shared memory is allocated to a block in units of 128 bytes


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limited_by: str  # "threads", "blocks", "registers", "shared memory"


def occupancy(gpu: Gpu, launch: Launch, res: Resources | None) -> Occupancy:
    """Blocks of ``launch`` one SM of ``gpu`` holds at once. Without ``res`` (the kernel was
    not measured), registers and static shared memory are left out: an upper bound."""
    warps = math.ceil(launch.threads_per_block / 32)
    limits = {"blocks": gpu.max_blocks_per_sm, "threads": gpu.max_threads_per_sm // (32 * warps)}
    static = res.shared_bytes if res else 0
    shared = static + launch.shared_bytes
    if shared:
        per_block = math.ceil((shared + gpu.shared_reserved_per_block) / SHARED_UNIT) * SHARED_UNIT
        limits["shared memory"] = gpu.shared_per_sm // per_block
    if res and res.registers:
        per_warp = math.ceil(res.registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
        limits["registers"] = (gpu.registers_per_sm // per_warp) // warps
    limited_by = min(limits, key=lambda k: limits[k])
    return Occupancy(limits[limited_by], limited_by)


def waves(gpu: Gpu, launch: Launch, res: Resources | None) -> float:
    """Blocks of the launch over the blocks the whole GPU runs at once (inf if none fits)."""
    per_sm = occupancy(gpu, launch, res).blocks_per_sm
    return launch.blocks / (gpu.sms * per_sm) if per_sm else math.inf


def launch_ms(gpu: Gpu, launch: Launch, res: Resources | None = None) -> float:
    """Estimated milliseconds of one launch on ``gpu`` (launch overhead not included): its work
    at the GPU's peak rates, max(FLOPs / (peak FP32 x the FMA share of its inner loop), bytes /
    bandwidth), divided by how much of the GPU its blocks fill: blocks / (whole waves x blocks
    per wave). A launch of 3 blocks uses 3 of the GPU's block slots; the last partial wave of a
    big launch leaves the rest idle."""
    if launch.flops is None or launch.bytes is None:
        raise ValueError(f"{launch.kernel}: the launcher gives no work (FLOPs, bytes) to "
                         "estimate a time from")
    slots = gpu.sms * max(occupancy(gpu, launch, res).blocks_per_sm, 1)
    fill = launch.blocks / (math.ceil(launch.blocks / slots) * slots)
    compute_s = launch.flops / (gpu.fp32_tflops * 1e12 * launch.fma_share)
    memory_s = launch.bytes / (gpu.bandwidth_gbs * 1e9)
    return 1e3 * max(compute_s, memory_s) / fill


# ---------------------------------------------------------------- one iteration of a network
@dataclass(frozen=True)
class OpLaunches:
    """The launches of one op (kernel launcher call) of one route step."""

    step: int
    layer: str
    phase: str  # forward, backward, optimizer
    op: str  # the kernel op, e.g. conv2d_forward
    algo: str  # conv: "im2col x 25" / "direct"; else ""
    chunk: int  # conv: images per chunk; else 0
    output_elements: int  # conv: elements of y, dx or dw; else 0
    launches: tuple


CONV_OP = {"conv2d_forward": "forward", "conv2d_backward_data": "backward_data",
           "conv2d_backward_filter": "backward_filter"}


def _view(shape, dtype="float32"):
    return ShapeArray(tuple(shape), np.dtype(dtype))


def _step_io(graph, step, layer, choices):
    """What the runtime hands a layer (snlite.layers.StepIO), with shape-only views."""
    tensors = graph.tensors()
    inputs = graph.inputs[step.layer]
    io = types.SimpleNamespace(train=True, update_running=True, seed=0, algo={}, chunk={}, workspace=None)
    io.x = [_view(graph.layers[i].out_shape) for i in inputs]
    io.y = _view(layer.out_shape)
    io.params = {p: _view(s) for p, s in layer.params().items()}
    io.buffers = {b: _view(s) for b, s in layer.buffers().items()}
    io.saved = {s: _view(shape, dtype) for s, (shape, dtype) in layer.saved().items()}
    io.labels = _view(tensors["labels"].shape, tensors["labels"].dtype) if "labels" in tensors else None
    io.grads = {p: _view(s) for p, s in layer.params().items()}
    io.dy = _view(layer.out_shape)
    io.dx = [_view(graph.layers[i].out_shape) for i in inputs]
    if choices:
        io.algo = {op: c.algo for op, c in choices.items()}
        io.chunk = {op: c.chunk for op, c in choices.items()}
        nbytes = max(c.workspace_bytes for c in choices.values())
        io.workspace = _view((nbytes // 4,)) if nbytes else None
    return io


def step_launches(graph, layer_name: str, phase: str, choices: dict | None = None,
                  accumulate: int = 0) -> list:
    """The launches of one route step of ``graph`` (duck-typed: a snlite Graph): ``accumulate`` fork
    accumulations, then the layer's forward (also for a recomputed forward) or backward, with each
    conv op's algorithm and chunk from ``choices`` (conv op -> an object with algo, chunk and
    workspace_bytes). Recorded from the launchers on shape-only arrays: nothing runs."""
    import kernels

    ops = kernels.all_ops()
    layer = graph.layers[layer_name]
    io = _step_io(graph, types.SimpleNamespace(layer=layer_name), layer, choices or {})
    calls = [("accumulate", (_view(layer.out_shape), _view(layer.out_shape)), {})] * accumulate
    io.run = lambda name, *args, **kwargs: calls.append((name, args, kwargs))
    (layer.backward if phase == "backward" else layer.forward)(io)
    out = []
    for name, args, kwargs in calls:
        with record_launches() as launched:
            ops[name].launch(*args, **kwargs)
        out += launched
    return out


def network_launches(graph, conv_choices, optimizer: bool = True) -> list[OpLaunches]:
    """Every op of one training iteration of ``graph`` (duck-typed: a snlite Graph) with its
    launches, recorded from the launchers: each route step's fork accumulations and layer
    forward or backward (conv algorithms and chunks from ``conv_choices``, a list of
    ConvChoice(step, layer, op, algo, chunk, workspace_bytes)), then the SGD update of every
    parameter (momentum on)."""
    import kernels

    ops = kernels.all_ops()
    chosen: dict = {}
    for c in conv_choices:
        chosen.setdefault(c.step, {})[c.op] = c
    rows = []

    def record(step, layer, phase, name, args, kwargs):
        with record_launches() as launched:
            ops[name].launch(*args, **kwargs)
        algo, chunk, out = "", 0, 0
        if name in CONV_OP:
            algo, chunk = kwargs.get("algo", "direct"), kwargs.get("chunk", 1)
            algo = f"{algo} x{chunk}" if algo == "im2col" or chunk > 1 else algo
            out = args[2].size  # y, dx or dw: every conv op's third argument
        rows.append(OpLaunches(step, layer, phase, name, algo, chunk, out, tuple(launched)))

    for step in graph.steps():
        layer = graph.layers[step.layer]
        # a fork: its readers' gradients are summed into the first
        if step.phase == "backward" and step.accumulate:
            for _ in step.accumulate:
                record(step.index, step.layer, step.phase, "accumulate",
                       (_view(layer.out_shape), _view(layer.out_shape)), {})
        io = _step_io(graph, step, layer, chosen.get(step.index, {}))
        calls = []
        io.run = lambda name, *args, **kwargs: calls.append((name, args, kwargs))
        (layer.forward if step.phase == "forward" else layer.backward)(io)
        for name, args, kwargs in calls:
            record(step.index, step.layer, step.phase, name, args, kwargs)
    if optimizer:
        for layer in graph.layers.values():
            for p, shape in layer.params().items():
                record(-1, f"{layer.name}.{p}", "optimizer", "sgd_update",
                       (_view(shape), _view(shape), _view(shape)), {"lr": 0.01, "momentum": 0.9})
    return rows


# ---------------------------------------------------------------- the targets, and the report
def im2col_launches_per_chunk(row: OpLaunches) -> float:
    """Launches per chunk of an im2col conv op (the target: at most 2); a chunk is one transform
    launch (im2col, or col2im for backward_data)."""
    chunks = sum(1 for l in row.launches if l.kernel.startswith("kernels.im2col."))
    return len(row.launches) / max(chunks, 1)


def fewest_waves(row: OpLaunches, gpu: Gpu, measured=None) -> float:
    return min((waves(gpu, l, resources(l.kernel, gpu.arch, measured)) for l in row.launches),
               default=math.inf)


def check_targets(rows, gpu: Gpu, measured=None) -> dict:
    """The two targets on the conv ops of ``rows``: im2col at most 2 launches per chunk; an op
    writing more than TARGET_OUTPUT_ELEMENTS runs no launch under TARGET_WAVES waves."""
    conv = [r for r in rows if r.op in CONV_OP]
    im2col = [r for r in conv if r.algo.startswith("im2col")]
    per_chunk = max((im2col_launches_per_chunk(r) for r in im2col), default=0.0)
    big = [r for r in conv if r.output_elements > TARGET_OUTPUT_ELEMENTS]
    worst = min(big, key=lambda r: fewest_waves(r, gpu, measured), default=None)
    worst_waves = fewest_waves(worst, gpu, measured) if worst else math.inf
    return {"im2col_ops": len(im2col), "max_launches_per_chunk": per_chunk, "launches_ok": per_chunk <= 2,
            "big_ops": len(big), "fewest_waves": worst_waves, "fewest_waves_op": worst,
            "waves_ok": worst_waves >= TARGET_WAVES}


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:,d}" if lo == hi else f"{lo:,d}..{hi:,d}"


def format_report(rows, gpu: Gpu, measured=None, conv_only: bool = False) -> str:
    """The per-op table, the per-kernel table (registers, spills, occupancy) and the totals."""
    shown = [r for r in rows if r.op in CONV_OP or not conv_only]
    lines = [f"{'step':>4}  {'layer':14} {'op':24} {'algorithm':12} {'launches':>8}  "
             f"{'blocks per launch':>18}  {'waves':>7}  {'output elems':>12}"]
    for r in shown:
        blocks = _span([l.blocks for l in r.launches]) if r.launches else "-"
        w = f"{fewest_waves(r, gpu, measured):7.2f}" if r.launches else f"{'-':>7}"
        out = f"{r.output_elements:12,d}" if r.output_elements else f"{'':12}"
        step = f"{r.step:4d}" if r.step >= 0 else f"{'':4}"
        lines.append(f"{step}  {r.layer[:14]:14} {r.op:24} {r.algo:12} {len(r.launches):8d}  "
                     f"{blocks:>18}  {w}  {out}")
    lines.append("(waves: the fewest of the op's launches, on the " + gpu.name + ")")
    kernels_used = Counter(l.kernel for r in shown for l in r.launches)
    example = {l.kernel: l for r in shown for l in r.launches}
    ptxas = measured_with()
    src = "measured now with ptxas" if measured else f"kernels/registers.json ({ptxas})"
    lines += ["", f"kernels on the {gpu.name} ({gpu.sms} SMs, {gpu.arch}; registers and spills: {src}):",
              f"{'kernel':44} {'launches':>8} {'threads':>7} {'regs':>5} {'spills':>6} {'smem B':>7} "
              f"{'blocks/SM':>9}  limited by"]
    for name, count in sorted(kernels_used.items(), key=lambda kv: -kv[1]):
        res = resources(name, gpu.arch, measured)
        occ = occupancy(gpu, example[name], res)
        regs, spills, smem = (res.registers, res.spill_bytes, res.shared_bytes) if res else ("?", "?", "?")
        lines.append(f"{name.removeprefix('kernels.'):44} {count:8,d} {example[name].threads_per_block:7d} "
                     f"{regs!s:>5} {spills!s:>6} {smem!s:>7} {occ.blocks_per_sm:9d}  "
                     f"{occ.limited_by}{'' if res else ' (not measured: an upper bound)'}")
    conv = [r for r in rows if r.op in CONV_OP]
    t = check_targets(rows, gpu, measured)
    worst = t["fewest_waves_op"]
    lines += ["", f"one iteration: {sum(len(r.launches) for r in rows):,d} launches "
                  f"({sum(len(r.launches) for r in conv):,d} by convolutions, in {len(conv)} conv ops)",
              f"im2col conv ops: {t['im2col_ops']}, at most {t['max_launches_per_chunk']:g} launches per "
              f"chunk (target <= 2): {t['launches_ok']}",
              f"conv ops writing > {TARGET_OUTPUT_ELEMENTS:,d} elements: {t['big_ops']}, fewest waves "
              + (f"{t['fewest_waves']:.2f} ({worst.layer} {worst.op})" if worst else "-")
              + f" (target >= {TARGET_WAVES:g} on the {gpu.name}): {t['waves_ok']}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.launches",
                                     description="Re-measure kernels/registers.json with ptxas. The launch "
                                                 "report of a network is `snlite launches NET` "
                                                 "(it needs the model zoo).")
    parser.add_argument("--registers", action="store_true",
                        help=f"re-measure {REGISTERS_FILE.name} with ptxas")
    args = parser.parse_args(argv)
    if not args.registers:
        parser.error("pass --registers (the launch report of a network is `snlite launches NET`, e.g. "
                     "`snlite launches alexnet --batch 200`)")
    try:
        table = write_registers()
    except RuntimeError as e:  # no ptxas, or a kernel that does not compile: said in its words
        print(f"python -m kernels.launches --registers: {e}", file=sys.stderr)
        return 1
    print(f"wrote {REGISTERS_FILE} ({len(table['kernels'])} kernels, {table['ptxas']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
