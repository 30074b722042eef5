"""GEMM: every version follows the canonical order bit for bit (so v1, v2 and v3 agree exactly),
beta == 0 never reads C, bad shapes and blocks are refused, and the GPU benchmark's helpers work
and it exits cleanly where there is no GPU."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

import kernels
from kernels import bench
from kernels import gemm as gemm_family
from kernels._common import registered_kernels
from kernels._common import record_launches
from kernels.gemm import VERSIONS, gemm, gemm_batched, gemm_flops, gemm_geometry, gemm_ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (bx, by, tm, tn): v1 and v2 use (bx, by); square and oblong tiles, micro-tiles 1x2, 2x2, 2x4
BLOCKS = [(4, 4, 2, 2), (8, 4, 1, 2), (4, 8, 2, 4)]


def _operands(rng, m, n, k, ta, tb):
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    return a, b


def _canonical(a, b, c, ta, tb, alpha, beta):
    """The canonical order in float32, vectorised over outputs: acc = 0; acc += a*b for k = 0..K-1
    (each product and sum rounded to float32, as the simulator does), then the epilogue."""
    a_, b_ = (a.T if ta else a), (b.T if tb else b)
    acc = np.zeros((a_.shape[0], b_.shape[1]), np.float32)
    for k in range(a_.shape[1]):
        acc += a_[:, k:k + 1] * b_[k:k + 1, :]
    out = np.float32(alpha) * acc
    return out + np.float32(beta) * c if beta != 0 else out


def _run(version, a, b, c, block, **kw):
    d_c = cuda.to_device(c)
    gemm(cuda.to_device(a), cuda.to_device(b), d_c, version=version, block=block, **kw)
    return d_c.copy_to_host()


def _assert_all_versions_canonical(a, b, c, ta, tb, alpha, beta, block):
    want = _canonical(a, b, c, ta, tb, alpha, beta)
    for version in VERSIONS:
        got = _run(version, a, b, c, block, trans_a=ta, trans_b=tb, alpha=alpha, beta=beta)
        assert np.array_equal(got, want), \
            f"{version} with block {block} is not bit-identical to the canonical order"


@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m,n,k,block",
                         [(13, 11, 19, BLOCKS[0]), (5, 17, 9, BLOCKS[1]), (16, 8, 24, BLOCKS[2])])
def test_versions_are_bit_identical(rng, m, n, k, block, ta, tb):
    a, b = _operands(rng, m, n, k, ta, tb)
    c = rng.standard_normal((m, n)).astype(np.float32)
    _assert_all_versions_canonical(a, b, c, ta, tb, 0.75, -1.5, block)
    want = c.astype(np.float64)
    gemm_ref(a.astype(np.float64), b.astype(np.float64), want, trans_a=ta, trans_b=tb, alpha=0.75, beta=-1.5)
    np.testing.assert_allclose(_canonical(a, b, c, ta, tb, 0.75, -1.5), want, rtol=1e-4, atol=1e-5)


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 12), n=st.integers(1, 12), k=st.integers(0, 20), ta=st.booleans(), tb=st.booleans(),
       block=st.sampled_from(BLOCKS + [(4, 4)]), seed=st.integers(0, 2**16))
def test_versions_are_bit_identical_on_random_shapes(m, n, k, ta, tb, block, seed):
    rng = np.random.default_rng(seed)
    a, b = _operands(rng, m, n, k, ta, tb)
    _assert_all_versions_canonical(a, b, np.zeros((m, n), np.float32), ta, tb, 1.0, 0.0, block)


def _run_batched(version, a, b, c, block, **kw):
    d_c = cuda.to_device(c)
    gemm_batched(cuda.to_device(a), cuda.to_device(b), d_c, version=version, block=block, **kw)
    return d_c.copy_to_host()


@pytest.mark.parametrize("shared", ["a", "b", None])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_batched_is_one_canonical_gemm_per_matrix(rng, ta, tb, shared):
    """Matrix z of a batched launch is bit for bit what gemm of A[z] and B[z] gives; a shared operand
    (one matrix) serves every z."""
    batch, m, n, k = 3, 7, 5, 9
    pairs = [_operands(rng, m, n, k, ta, tb) for _ in range(batch)]
    a = np.stack([p[0] for p in pairs][:1 if shared == "a" else batch])
    b = np.stack([p[1] for p in pairs][:1 if shared == "b" else batch])
    c = rng.standard_normal((batch, m, n)).astype(np.float32)
    want = np.stack([_canonical(a[z if a.shape[0] > 1 else 0], b[z if b.shape[0] > 1 else 0], c[z],
                                ta, tb, 0.5, 2.0)
                     for z in range(batch)])
    for version, block in zip(VERSIONS, [(4, 4), (4, 8), (4, 4, 2, 2)]):
        got = _run_batched(version, a, b, c, block, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0)
        assert np.array_equal(got, want), f"{version}: a batched launch differs from one gemm per matrix"


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_reduce_sums_the_batch_in_order(rng, beta):
    """reduce=True: C = P_0 (+ beta*C), then C = P_z + 1*C for z = 1, 2, ...: what the backward filter's
    canonical order needs, bit for bit, in one launch; with beta 0 C starts as garbage and is not read."""
    batch, m, n, k = 4, 5, 6, 7
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, n, k)).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    want = _canonical(a[0], b[0], c0, False, True, 1.0, beta)
    for z in range(1, batch):
        want = _canonical(a[z], b[z], want, False, True, 1.0, 1.0)
    start = c0 if beta else np.full((m, n), np.nan, np.float32)
    for version, block in zip(VERSIONS, [(4, 4), (8, 4), (4, 4, 2, 2)]):
        got = _run_batched(version, a, b, start[None], block, trans_b=True, beta=beta, reduce=True)[0]
        assert np.array_equal(got, want), f"{version}: reduce is not the in-order sum of the batch"


def test_batched_geometry_is_one_launch_with_grid_z_the_batch():
    a, b = cuda.to_device(np.zeros((1, 6, 5), np.float32)), cuda.to_device(np.zeros((9, 5, 11), np.float32))
    for reduce, c_batch in ((False, 9), (True, 1)):
        c = cuda.to_device(np.zeros((c_batch, 6, 11), np.float32))
        with record_launches() as launched:
            gemm_batched(a, b, c, version="v3", block=(4, 4, 2, 2), reduce=reduce)
        assert len(launched) == 1
        # the grid: 11/8, 6/8, z
        assert launched[0].grid == (2, 1, 1 if reduce else 9) and launched[0].block == (4, 4, 1)
        assert launched[0].kernel == "kernels.gemm._gemm_v3_4x4_2x2_nn"
        assert launched[0] == gemm_geometry("v3", 6, 11, 5, 9, reduce=reduce, block=(4, 4, 2, 2))
        assert launched[0].flops == 9 * gemm_flops(6, 11, 5)
    assert np.array_equal(c.copy_to_host(), np.zeros((1, 6, 11), np.float32))  # recorded, not run
    assert gemm_geometry("v1", 33, 17, 4, 2, block=(16, 8)).grid == (2, 5, 2)
    assert gemm_geometry("v2", 33, 17, 4, block=(8, 16)).grid == (3, 3, 1)


@pytest.mark.parametrize("shared", ["a", None])
def test_a_batch_over_grid_z_is_launched_in_parts_with_the_same_bits(rng, monkeypatch, shared):
    """More matrices than grid z holds (MAX_GRID_Z, made 2 here) go in launches of at most that many,
    each matrix bit for bit what one launch of the whole batch gives; reduce=True stays one launch
    (grid z 1: each block loops over the batch), its in-order sum unchanged."""
    batch, m, n, k = 5, 7, 5, 9
    a = rng.standard_normal((1 if shared else batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    c = rng.standard_normal((batch, m, n)).astype(np.float32)
    runs = [("v1", (4, 4)), ("v3", (4, 4, 2, 2))]
    whole = {v: _run_batched(v, a, b, c, blk, alpha=0.5, beta=2.0) for v, blk in runs}
    summed = {v: _run_batched(v, a, b, c[:1], blk, beta=2.0, reduce=True) for v, blk in runs}
    monkeypatch.setattr(gemm_family, "MAX_GRID_Z", 2)
    for version, block in runs:
        got = _run_batched(version, a, b, c, block, alpha=0.5, beta=2.0)
        assert np.array_equal(got.view(np.uint32), whole[version].view(np.uint32)), f"{version}: parts differ"
        want = c.copy()
        for z in range(batch):
            gemm_ref(a[z if a.shape[0] > 1 else 0], b[z], want[z], alpha=0.5, beta=2.0)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        got = _run_batched(version, a, b, c[:1], block, beta=2.0, reduce=True)
        assert np.array_equal(got.view(np.uint32), summed[version].view(np.uint32)), \
            f"{version}: reduce differs"
    d = [cuda.to_device(x) for x in (a, b, c)]
    with record_launches() as launched:
        gemm_batched(*d, version="v3", block=(4, 4, 2, 2))
        gemm_batched(d[0], d[1], d[2][:1], version="v3", block=(4, 4, 2, 2), reduce=True)
    assert [launch.grid[2] for launch in launched] == [2, 2, 1, 1]
    assert sum(launch.flops for launch in launched[:3]) == batch * gemm_flops(m, n, k)


def test_a_grid_beyond_cuda_limits_is_refused_before_launch():
    from kernels._common import MAX_GRID

    with pytest.raises(ValueError, match="65,536 blocks in z, more than CUDA's 65,535"):
        gemm_family._gemm_v1[(1, 1, MAX_GRID[2] + 1), (4, 4)]
    geometry = gemm_geometry("v1", 4, 4, 4, MAX_GRID[2] + 1, block=(4, 4))
    d = [cuda.to_device(np.zeros(s, np.float32)) for s in ((1, 4, 4), (1, 4, 4), (1, 4, 4))]
    with pytest.raises(ValueError, match="blocks in z"), record_launches():
        gemm_family._gemm_v1.launch(geometry, 0, *d, False, False, np.float32(1), np.float32(0), False, False)


@pytest.mark.parametrize("call,match", [
    (lambda: gemm_batched(_dev(2, 3, 4), _dev(3, 4, 2), _dev(3, 3, 2)),
     "gemm_batched a: 2 matrices, but the batch is 3"),
    (lambda: gemm_batched(_dev(3, 4), _dev(1, 4, 2), _dev(1, 3, 2)), "gemm_batched a: expected a 3-D stack"),
    (lambda: gemm_batched(_dev(2, 3, 4), _dev(1, 4, 2), _dev(2, 3, 2), reduce=True),
     r"gemm_batched c: expected shape \(1, 3, 2\)"),
    (lambda: gemm_batched(_dev(0, 3, 4), _dev(0, 4, 2), _dev(1, 3, 2), reduce=True), "at least one matrix"),
])
def test_bad_batched_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_beta_zero_never_reads_c(rng):
    a, b = _operands(rng, 9, 6, 11, False, True)
    c = np.full((9, 6), np.nan, np.float32)
    want = _canonical(a, b, np.zeros_like(c), False, True, 2.0, 0.0)
    for version in VERSIONS:
        got = _run(version, a, b, c, BLOCKS[0], trans_b=True, alpha=2.0)
        assert np.array_equal(got, want), f"{version} read C although beta == 0"


def test_default_blocks_are_valid_and_v3_expands_thread_blocks():
    for version in VERSIONS:
        gemm_family._block(version, None)
    assert gemm_family._block("v3", (4, 4)) == (4, 4) + gemm_family.V3_MICRO
    assert gemm_family._block("v1", (4, 8, 2, 2)) == (4, 8, 1, 1)


def test_each_v3_block_is_built_once_and_registered():
    before = len(registered_kernels())
    k1 = gemm_family._gemm_v3(2, 8, 4, 1, True, False)
    k2 = gemm_family._gemm_v3(2, 8, 4, 1, True, False)
    assert k1 is k2
    names = [spec.name for spec in registered_kernels()[before:]]
    assert names in ([], ["kernels.gemm._gemm_v3_2x8_4x1_tn"])  # [] if an earlier test built it


def _dev(*shape, dtype=np.float32):
    return cuda.to_device(np.zeros(shape, dtype))


@pytest.mark.parametrize("call,match", [
    (lambda: gemm(_dev(3, 4), _dev(5, 2), _dev(3, 2)), "inner dimensions must match"),
    (lambda: gemm(_dev(4, 3), _dev(4, 2), _dev(3, 2), trans_a=True, trans_b=True),
     r"op\(A\) is 3x4 but op\(B\) is 2x4"),
    (lambda: gemm(_dev(3, 4), _dev(4, 2), _dev(2, 3)), r"gemm c: expected shape \(3, 2\), got \(2, 3\)"),
    (lambda: gemm(_dev(3, 4, dtype=np.float64), _dev(4, 2), _dev(3, 2)), "gemm a: expected dtype float32"),
    (lambda: gemm(_dev(12), _dev(4, 2), _dev(3, 2)), "gemm a: expected a 2-D array"),
    (lambda: gemm(_dev(4, 3), _dev(2, 4), _dev(3, 2), trans_a=True, trans_b=True,
                  version="v2", block=(64, 4)),
     "v2 tiles are at most 32"),
    (lambda: gemm(_dev(3, 4), _dev(4, 2), _dev(3, 2), version="v1", block=(64, 32)), "more than the 1024"),
    (lambda: gemm(_dev(3, 4), _dev(4, 2), _dev(3, 2), block=(4, 4, 3)), r"expected \(bx, by\) or"),
    (lambda: gemm(_dev(3, 4), _dev(4, 2), _dev(3, 2), block=(4, 4, 3, 3)), "divide one another"),
    (lambda: gemm(_dev(3, 4), _dev(4, 2), _dev(3, 2), block=(8, 8, 16, 1)), "at most 8x8"),
    (lambda: gemm(_dev(16, 8), _dev(8, 16), _dev(16, 16), block=(16, 16, 1, 1)),  # stored past its row
     r"v3 needs at most V3_BK\*by\*tm = 128 threads"),
    (lambda: gemm(_dev(16, 8), _dev(16, 8), _dev(16, 16), trans_b=True, block=(16, 16, 2, 1)),
     r"v3 needs at most V3_BK\*bx\*tn = 128 threads"),
    (lambda: gemm(_dev(3, 4), _dev(4, 2), _dev(3, 2), version="v9"), "unknown kernel version"),
])
def test_bad_arguments_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gemm_flops_counts_a_multiply_and_an_add_per_term():
    m, n, k = 3, 5, 7
    assert gemm_flops(m, n, k) == 2 * m * n * k


@pytest.mark.gpu
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
def test_versions_are_bit_identical_on_a_real_gpu(rng, ta, tb):
    """On a GPU each ``acc += av * bv`` is one FMA; every version must still agree bit for bit."""
    m, n, k = 257, 130, 517
    a, b = _operands(rng, m, n, k, ta, tb)
    c = rng.standard_normal((m, n)).astype(np.float32)
    outs = {v: _run(v, a, b, c, None, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0) for v in VERSIONS}
    for v in VERSIONS:
        assert np.array_equal(outs[v], outs["v1"]), f"{v} differs from v1 on the GPU"
    want = c.astype(np.float64)
    gemm_ref(a.astype(np.float64), b.astype(np.float64), want, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0)
    np.testing.assert_allclose(outs["v1"], want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the GPU benchmark
def test_bench_without_gpu_says_so_and_exits_0(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "bench-out"
    proc = subprocess.run([sys.executable, "-m", "kernels.bench", "--out", str(out)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "No GPU benchmark" in lines[0] and "simulator" in lines[0], proc.stdout
    assert not out.exists()


def test_bench_helpers():
    assert bench.gflops(gemm_flops(1000, 1000, 1000), 1000.0) == gemm_flops(1000, 1000, 1000) / 1e9
    assert bench.gflops(1.0, -1.0) is None and bench.gbytes_per_s(10, None) is None
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert bench.rel_error(x, x) == 0.0
    assert bench.rel_error(x + np.float32(0.5), x) == pytest.approx(0.5 / 5)
    # a convolution costs what its im2col GEMMs cost: (K x CRS) @ (CRS x PQ) for each image
    x_shape, w_shape = (2, 3, 11, 9), (4, 3, 3, 2)
    p, q = bench.conv_out_hw(x_shape, w_shape, 2, 1)
    assert (p, q) == (len(range(0, 11 + 2 - 3 + 1, 2)), len(range(0, 9 + 2 - 2 + 1, 2)))
    assert bench.conv_flops(x_shape, w_shape, 2, 1) == 2 * gemm_flops(4, p * q, 3 * 3 * 2)
    table = bench.format_table("t", [{"a": 1.23456, "b": None}, {"a": "x"}], ["a", "b"]).splitlines()
    assert table[0] == "t" and table[1].split() == ["a", "b"] and table[2].split() == ["1.235", "-"]
    assert len(table) == 4
    rows = [{"impl": "v3", "layout": "nn", "size": "8x8x8", "gflops": 50.0, "block": "a",
             "pct_of_cublas": 25.0},
            {"impl": "v3", "layout": "nn", "size": "64x64x64", "gflops": 10.0, "block": "b",
             "pct_of_cublas": 20.0},
            {"impl": "v3", "layout": "nn", "size": "64x64x64", "gflops": 30.0, "block": "c",
             "pct_of_cublas": 40.0},
            {"impl": "cupy", "layout": "nn", "size": "64x64x64", "gflops": 75.0}]
    assert "64x64x64: best 30 GFLOP/s with block c = 40% of cuBLAS" in bench.gemm_summary(rows)
    assert bench.gemm_summary(rows[3:]) is None


def test_bench_time_ms_warms_up_then_repeats():
    calls = []
    t = bench.time_ms(lambda: calls.append(1), reps=3, warmup=2)
    assert len(calls) == 5 and t["reps"] == 3  # simulator events time nothing, so no row is cut


def test_bench_runs_end_to_end_on_the_simulator(tmp_path, monkeypatch):
    """Every section's code path, at tiny sizes (the simulator's times are meaningless: -1 ms)."""
    for version, block in (("v1", (4, 4)), ("v2", (4, 4)), ("v3", (4, 4, 2, 2))):
        monkeypatch.setitem(gemm_family.DEFAULT_BLOCK, version, block)
    plan = dict(bench.PLAN_QUICK, gemm_sizes=[(9, 7, 5)], v3_sweep=[(4, 8, 2, 4)], gemm_trans=True,
                batched=[("nn", (5, 7, 3), 3, False, False, False), ("tn", (6, 5, 4), 2, True, False, False),
                         ("reduce", (4, 6, 5), 3, False, True, True)],
                conv_layers=[("tiny", (3, 2, 5, 4), (3, 2, 3, 3), 1, 1)], conv_chunks=[1, 2],
                copy_bytes=4096, launches=2, reps=1, warmup=0,
                section_budget_s=600.0)  # the simulator is slow: no warm-up, no cut
    bench.run(str(tmp_path), plan)
    record = json.loads((tmp_path / "bench.json").read_text())
    assert {"environment", "plan", "gemm", "batched", "conv", "copy", "launch"} <= set(record)
    assert [(r["case"], r["impl"], r["launches"]) for r in record["batched"]] == [
        (case, impl, n) for case, batch in (("nn", 3), ("tn", 2), ("reduce", 3))
        for impl, n in (("batched", 1), ("one per matrix", batch))]
    assert all(r["bit_identical"] for r in record["batched"]), record["batched"]
    conv = record["conv"]
    assert not any("error" in r for r in conv) and all(r["same_as_first_algo"] for r in conv), conv
    split = [r for r in conv if r["op"] == "backward_filter" and r["algo"] == "direct"]
    # v2; v3: chunks of 2 and 1 (+ a fold)
    assert [(r["chunk"], r["launches"]) for r in split] == [(1, 1), (2, 3)]
    assert [r["launches"] for r in conv if r["algo"] == "im2col"] == [6, 4] * 3  # 2 a chunk: 3 chunks, then 2
    ours = [r for r in record["gemm"] if r["impl"] != "cupy"]
    assert [(r["layout"], r["impl"]) for r in ours] == [("nn", "v3"), ("nn", "v1"), ("nn", "v2"),
                                                        ("nn", "v3"), ("nt", "v3"), ("tn", "v3")]
    assert all(r["ok"] and r["bit_identical_to_v3"] for r in ours), ours
    assert len(record["copy"]) == 4 and len(record["launch"]) == 2
    assert not any("error" in r for r in record["copy"] + record["launch"])


def test_bench_reports_a_missing_conv_family(monkeypatch):
    monkeypatch.setitem(sys.modules, "kernels.conv", None)  # import kernels.conv now raises ImportError
    rows = bench.bench_conv(bench.PLAN_QUICK)
    assert len(rows) == 1 and "kernels.conv unavailable" in rows[0]["error"]
    assert kernels.FAMILIES  # the package itself is untouched
