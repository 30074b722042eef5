"""Launches without a GPU: what each launcher launches (counts, grids), occupancy and waves, the
targets on the zoo, the cost model built on them, and the launch report command. Nothing here
runs a kernel: launches are recorded from the launchers themselves on shape-only arrays."""
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from numba import cuda

import snlite
from kernels import conv, gemm
from kernels import launches as L, registers as R
from kernels._common import Launch, ShapeArray, record_launches
from nets import grouped_net
from snlite import MemoryConfig
from snlite import workspace as ws
from snlite.models import PAPER_WIDTH_BATCH, get_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("forward", "backward_data", "backward_filter")
H200 = L.GPUS["H200"]
XS, WS, STRIDE, PADDING = (5, 3, 9, 8), (4, 3, 3, 2), 2, 1  # y: (5, 4, 5, 5); K = 18, P = 25


def _short(launch):
    return launch.kernel.rsplit(".", 1)[1]


# ---------------------------------------------------------------- recording
def test_recording_runs_nothing_and_sees_what_shape_arrays_see(rng):
    x = cuda.to_device(rng.standard_normal(XS).astype(np.float32))
    w = cuda.to_device(rng.standard_normal(WS).astype(np.float32))
    y = cuda.to_device(np.full(conv.output_shape(XS, WS, STRIDE, PADDING), np.nan, np.float32))
    need = conv.workspace_bytes("forward", "im2col", XS, WS, STRIDE, PADDING, chunk=2) // 4
    with record_launches() as launched:
        conv.conv2d_forward(x, w, y, stride=STRIDE, padding=PADDING, algo="im2col", chunk=2,
                            workspace=cuda.to_device(np.zeros(need, np.float32)))
    assert np.isnan(y.copy_to_host()).all(), "a recorded launch ran"
    assert launched == conv.launches("forward", "im2col", XS, WS, STRIDE, PADDING, chunk=2)
    assert len(launched) == 6


def test_shape_array_indexes_and_reshapes_like_numpy():
    a, ref = ShapeArray((4, 3, 5)), np.zeros((4, 3, 5), np.float32)
    for index in (1, slice(1, 3), (slice(None), 2), (slice(2, 9), slice(0, 1))):
        assert a[index].shape == ref[index].shape
    assert a.reshape(2, -1).shape == (2, 30) and a.reshape((60,)).size == 60
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(7, 9)


# ---------------------------------------------------------------- what the conv launchers launch
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("op", OPS)
def test_im2col_is_one_transform_and_one_gemm_per_chunk(op, chunk):
    n, (k, p) = XS[0], (3 * 3 * 2, 5 * 5)
    launched = conv.launches(op, "im2col", XS, WS, STRIDE, PADDING, chunk)
    sizes = [min(chunk, n - n0) for n0 in range(0, n, min(chunk, n))]
    assert len(launched) == 2 * len(sizes)
    for i, m in enumerate(sizes):
        pair = launched[2 * i:2 * i + 2]
        transform, product = (pair[1], pair[0]) if op == "backward_data" else pair
        if op == "backward_data":
            assert _short(transform) == "_col2im_v1" and transform.blocks == math.ceil(m * 3 * 9 * 8 / 128)
        else:
            assert _short(transform) == "_im2col_v1" and transform.blocks == math.ceil(m * k * p / 128)
        assert product.kernel.startswith("kernels.gemm._gemm_v3_16x16_8x8")
        rows, cols = (4, p) if op == "forward" else (k, p) if op == "backward_data" else (4, k)
        assert product.grid == \
            (math.ceil(cols / 128), math.ceil(rows / 128), 1 if op == "backward_filter" else m)


def test_direct_launches():
    n, co, p = XS[0], WS[0], 25
    (fwd,) = conv.launches("forward", "direct", XS, WS, STRIDE, PADDING)
    assert _short(fwd) == "_forward_v2" and fwd.grid == (math.ceil(p / 16), math.ceil(co / 16), n)
    (bwd,) = conv.launches("backward_data", "direct", XS, WS, STRIDE, PADDING)
    assert _short(bwd) == "_backward_data_v1" and bwd.blocks == math.ceil(math.prod(XS) / 128)
    (v2,) = conv.launches("backward_filter", "direct", XS, WS, STRIDE, PADDING)
    assert _short(v2) == "_backward_filter_v2" and v2.grid == (math.ceil(18 / 16), 1, 1)
    split = conv.launches("backward_filter", "direct", XS, WS, STRIDE, PADDING, chunk=2)  # chunks 2, 2, 1
    assert [(_short(l), l.grid[2]) for l in split] == [("_backward_filter_v3", 2), ("_fold_v1", 1)] * 2 + [
        ("_backward_filter_v3", 1)]
    assert split[0].blocks == 2 * v2.blocks  # each image of the chunk in its own blocks


def test_launch_counts_are_the_launches_counted():
    for n in (1, 2, 5, 8, 13, 17):
        for chunk in (1, 2, 3, 4, 16, 40):
            for op in OPS:
                for algo in ("direct", "im2col"):
                    args = (op, algo, (n,) + XS[1:], WS, STRIDE, PADDING, chunk)
                    assert dict(conv.launch_counts(*args)) == Counter(conv.launches(*args)), args


def test_a_launch_geometry_is_what_the_launcher_uses():
    a, b, c = ShapeArray((1, 40, 30)), ShapeArray((6, 30, 50)), ShapeArray((6, 40, 50))
    for version in gemm.VERSIONS:
        with record_launches() as launched:
            gemm.gemm_batched(a, b, c, version=version)
        assert launched == [gemm.gemm_geometry(version, 40, 50, 30, 6)]


# ---------------------------------------------------------------- occupancy, waves, time
def test_occupancy_is_limited_by_registers_shared_memory_or_threads():
    launch = Launch("k", 1000, (16, 16))
    v3 = R.Resources(registers=115, spill_bytes=0, shared_bytes=8448, stack_bytes=0)
    assert L.occupancy(H200, launch, v3) == L.Occupancy(2, "registers")  # 115 -> 128 a thread: 32 KiB a block
    v3_sm75 = R.Resources(registers=137, spill_bytes=0, shared_bytes=8448, stack_bytes=0)
    assert L.occupancy(L.GPUS["T4"], launch, v3_sm75) == L.Occupancy(1, "registers")  # 144 a thread: 36 KiB
    assert L.occupancy(H200, launch, None) == L.Occupancy(8, "threads")  # unmeasured: an upper bound
    big_smem = R.Resources(registers=16, spill_bytes=0, shared_bytes=48 * 1024, stack_bytes=0)
    assert L.occupancy(H200, launch, big_smem) == L.Occupancy(4, "shared memory")  # 228 KiB // 49 KiB
    tiny = Launch("k", 1000, 32)
    assert L.occupancy(H200, tiny, R.Resources(16, 0, 0, 0)) == L.Occupancy(32, "blocks")
    assert L.waves(H200, Launch("k", 2 * 132 * 2, (16, 16)), v3) == 2.0


def test_launch_ms_charges_for_the_part_of_the_gpu_left_idle():
    res = R.Resources(registers=32, spill_bytes=0, shared_bytes=0, stack_bytes=0)
    slots = H200.sms * L.occupancy(H200, Launch("k", 1, 256), res).blocks_per_sm

    def ms(blocks, flops):
        return L.launch_ms(H200, Launch("k", blocks, 256, flops=flops, bytes=0), res)

    assert ms(slots, 10**9) == pytest.approx(ms(slots // 2, 10**9 // 2))  # same work per block, one wave
    assert ms(slots // 2, 10**9) == pytest.approx(2 * ms(slots, 10**9))  # half the GPU idle: twice the time
    assert ms(slots + 1, 10**9) == pytest.approx(ms(slots, 10**9) * 2 * slots / (slots + 1))  # 2nd wave of 1
    assert L.launch_ms(H200, Launch("k", slots, 256, flops=0, bytes=4.8e9), res) == \
        pytest.approx(1.0)  # 4.8 TB/s
    with pytest.raises(ValueError, match="no work"):
        L.launch_ms(H200, Launch("k", 1, 1))


# ---------------------------------------------------------------- the cost model
@pytest.mark.parametrize("op", OPS)
def test_a_bigger_workspace_buys_a_faster_estimated_conv(op):
    """AlexNet at batch 200: the fastest candidate needs workspace and beats the no-workspace one;
    im2col over the whole batch beats one image at a time (fewer launches, more blocks each); the split
    backward-filter fills the GPU where v2 cannot (conv1: 138 blocks)."""
    net = get_model("alexnet", 200)
    for name in ("conv1", "conv2", "conv3"):
        layer = net.layers[name]
        ranked = ws.candidates(layer, op)
        c = {(x.algo, x.chunk): x for x in ranked}
        none = ws.choose(layer, op, "none", None)
        assert none.workspace_bytes == 0 and ranked[0].workspace_bytes > 0 and ranked[0].est_ms < none.est_ms
        if op != "backward_filter":
            # (there im2col's GEMM sums the chunk in one block per tile: chunks save launches)
            assert c[("im2col", 200)].est_ms < 0.7 * c[("im2col", 1)].est_ms, (name, op)
    if op == "backward_filter":
        conv1 = {(x.algo, x.chunk): x for x in ws.candidates(net.layers["conv1"], op)}
        assert conv1[("direct", 200)].est_ms < 0.5 * conv1[("direct", 1)].est_ms


def test_the_cost_model_is_its_launches():
    layer = get_model("alexnet", 16).layers["conv2"]
    model = ws.CostModel(launch_us=0.0)
    for op in OPS:
        for algo, chunk in (("direct", 1), ("im2col", 4)):
            launched = model.launches(layer, op, algo, chunk)
            want = sum(L.launch_ms(H200, l, L.resources(l.kernel, "sm_90")) for l in launched)
            assert model.estimate(layer, op, algo, chunk) == pytest.approx(want)
    slow_launch = ws.CostModel(launch_us=1000.0)
    per_image = slow_launch.estimate(layer, "forward", "im2col", 1) - \
        model.estimate(layer, "forward", "im2col", 1)
    assert per_image == pytest.approx(2 * 16 * 1.0)  # 16 chunks of 2 launches, 1 ms each


# ---------------------------------------------------------------- the targets, on the zoo
@pytest.mark.parametrize("workspace", ["dynamic", "none"])
@pytest.mark.parametrize("name", sorted(PAPER_WIDTH_BATCH))
def test_zoo_targets_at_the_papers_batch_sizes(name, workspace):
    """Every im2col conv op launches at most twice per chunk, and no launch of a conv op that writes
    more than 1e7 elements runs under 2 waves on the H200 (conv choices as simulate makes them, no
    budget; registers from kernels/registers.json)."""
    graph = get_model(name, PAPER_WIDTH_BATCH[name])
    trace = snlite.simulate(graph, MemoryConfig(liveness=True, workspace=workspace))
    rows = [r for r in L.network_launches(graph, trace.conv_choices, optimizer=False) if r.op in L.CONV_OP]
    assert len(rows) == 3 * sum(1 for layer in graph.layers.values() if layer.kind == "conv2d")
    big = 0
    for r in rows:
        if r.algo.startswith("im2col"):
            transforms = [l for l in r.launches if l.kernel.startswith("kernels.im2col.")]
            assert len(transforms) == math.ceil(graph.layers[r.layer].in_shapes[0][0] / r.chunk)
            assert len(r.launches) <= 2 * len(transforms), (r.layer, r.op, len(r.launches))
        if r.output_elements > 10**7:
            big += 1
            for l in r.launches:
                w = L.waves(H200, l, L.resources(l.kernel, "sm_90"))
                assert w >= 2, \
                    f"{r.layer} {r.op} ({r.algo}): {l.kernel} runs {l.blocks} blocks, {w:.2f} waves"
    assert big > 0


# ---------------------------------------------------------------- the report
def test_network_launches_cover_every_step_and_parameter():
    graph = get_model("alexnet", 8)
    trace = snlite.simulate(graph, MemoryConfig(liveness=True, workspace="fastest"))
    rows = L.network_launches(graph, trace.conv_choices)
    steps = {s.index for s in graph.steps() if graph.layers[s.layer].kind not in ("data", "flatten")}
    assert steps <= {r.step for r in rows}
    assert sum(r.phase == "optimizer" for r in rows) == sum(len(l.params()) for l in graph.layers.values())
    conv_rows = {(r.step, L.CONV_OP[r.op]): r for r in rows if r.op in L.CONV_OP}
    assert {(c.step, c.op): (c.algo, c.chunk) for c in trace.conv_choices} == \
        {k: (r.algo.split()[0], r.chunk) for k, r in conv_rows.items()}
    assert all(r.launches for r in rows)


def test_a_grouped_net_launches_the_grouped_twins_and_ptxas_measured_them():
    """Grouped and depthwise convs launch the ``*_grouped`` direct kernels (the plain conv the plain
    ones), one tile row per group of fewer than 16 outputs; every kernel is in kernels/registers.json."""
    graph = grouped_net(n=4)
    rows = L.network_launches(graph, snlite.simulate(graph, MemoryConfig(liveness=True)).conv_choices)
    kernels = {r.layer: {_short(l) for l in r.launches} for r in rows if r.op == "conv2d_forward"}
    grouped = {"_forward_v2_grouped"}
    assert kernels == {"conv1": {"_forward_v2"}, "dw1": grouped, "pw1": grouped, "gc1": grouped}
    (dw,) = next(r.launches for r in rows if r.layer == "dw1" and r.op == "conv2d_forward")
    assert dw.grid[1] == 4  # 4 groups (depthwise) of one output each: a tile row apiece
    assert "not measured" not in L.format_report(rows, H200)
    assert all(L.resources(l.kernel, arch) for r in rows for l in r.launches for arch in R.ARCHS)


def test_report_marks_unmeasured_kernels(monkeypatch):
    graph = get_model("lenet", 4)
    rows = L.network_launches(graph, snlite.simulate(graph, MemoryConfig()).conv_choices)
    assert "not measured" not in L.format_report(rows, H200)
    monkeypatch.setattr(R, "_table", lambda: {"kernels": {}})
    assert "(not measured: an upper bound)" in L.format_report(rows, H200)


def test_the_documented_command(capsys):
    """docs/kernels.md shows this command's whole output (tests/test_docs.py compares it); here, its
    targets hold."""
    from snlite import cli

    assert cli.main(["launches", "alexnet", "--batch", "200", "--conv"]) == 0
    out = capsys.readouterr().out
    assert "launch report: alexnet, batch 200" in out and "gemm._gemm_v3_16x16_8x8_nn" in out
    assert "at most 2 launches per chunk (target <= 2): True" in out
    assert "(target >= 2 on the H200): True" in out
    assert cli.main(["launches", "nosuchnet"]) == 2 and "unknown model 'nosuchnet'" in capsys.readouterr().err
    assert cli.main(["launches", "lenet", "--gpu", "h100"]) == 0, "a GPU in any case, as plan's --gpu"
    assert "on the H100" in capsys.readouterr().out


def test_kernels_launches_only_remeasures_registers_and_points_at_the_report():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    bad = subprocess.run([sys.executable, "-m", "kernels.launches"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "snlite launches NET" in bad.stderr
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(os.path.join(ROOT, "kernels")) for f in names
                   if f.endswith(".py"))
    assert any(os.sep + "host" + os.sep in f for f in files)  # its subpackages are read too
    importing = [f for f in files if re.search(r"^\s*(import snlite|from snlite)", open(f).read(), re.M)]
    assert importing == [], "kernels/ never imports snlite"


def _ptxas_or_skip():
    if R.ptxas_path() is None:
        pytest.skip("ptxas not found (install the CUDA toolkit or set CUDA_HOME): registers not measured")


def test_measuring_one_kernel_gives_the_tables_numbers():
    _ptxas_or_skip()
    table = json.loads(R.REGISTERS_FILE.read_text())
    if R.ptxas_version(R.ptxas_path()) != table["ptxas"]:
        pytest.skip("this ptxas is not the one the table was measured with")
    measured = R.measure_resources({"kernels.conv._fold_v1"}, ("sm_90",))  # a subprocess, simulator off
    assert measured == \
        {"kernels.conv._fold_v1": {"sm_90": table["kernels"]["kernels.conv._fold_v1"]["sm_90"]}}
    assert R.resources("kernels.conv._fold_v1", "sm_90", measured) == \
        R.resources("kernels.conv._fold_v1", "sm_90")


def test_the_registers_command_writes_the_table(tmp_path, monkeypatch, capsys):
    _ptxas_or_skip()
    fake = {"kernels.x._k_v1": {arch: {"registers": 8, "spill_bytes": 0, "shared_bytes": 0, "stack_bytes": 0}
                                for arch in R.ARCHS}}
    monkeypatch.setattr(R, "measure_resources", lambda names=None, archs=R.ARCHS: fake)
    monkeypatch.setattr(R, "REGISTERS_FILE", tmp_path / "registers.json")
    try:
        assert L.main(["--registers"]) == 0
    finally:
        R._table.cache_clear()
    written = json.loads((tmp_path / "registers.json").read_text())
    assert written["kernels"] == fake and written["archs"] == list(R.ARCHS) and "release" in written["ptxas"]
    assert "1 kernels" in capsys.readouterr().out


def test_a_family_self_check_runs_as_a_script():
    """`python -m kernels.<family>` runs the module as __main__: its kernels must still be registered under
    the names their launch geometry uses (kernels.im2col._im2col_v1, not __main__._im2col_v1)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, "-m", "kernels.im2col"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and "0 failure(s)" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
