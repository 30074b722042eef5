"""GPU benchmark of the kernel library:  python -m kernels.bench --out DIR [--quick]

Measures on a real NVIDIA GPU, and prints as tables:
  (a) GEMM GFLOP/s of every version at 4096^3 and a smaller size, against ``cupy.matmul``
      (cuBLAS FP32; the row is skipped if CuPy is missing), plus a sweep of v3 block shapes and
      the transposed layouts linear layers use. Each result is checked against CuPy's (or
      NumPy's) within a tolerance, and against v3 bit for bit (the versions must agree exactly);
  (b) the strided-batched GEMM of im2col convolution (one launch per chunk, grid z = its images;
      ``reduce`` sums the chunk for backward-filter) against one GEMM launch per image, as the
      convolution ran before, on AlexNet/ResNet-like shapes: both checked bit for bit;
  (c) convolution algorithms of ``kernels.conv``: time, workspace bytes and launches of each op
      on AlexNet/ResNet-like layers, chunk by chunk (backward-filter's direct split version too),
      and whether each result equals the first algorithm's bit for bit;
  (d) host <-> device copy bandwidth of 256 MiB, pageable vs pinned memory, both directions;
  (e) kernel launch overhead: microseconds per launch of an empty kernel and of one with arguments.
Times come from CUDA events: warm-up first, then several repetitions, the median reported (a
slow row runs fewer repetitions, and sections stop at a time budget). Everything, with the GPU,
driver, library versions and date, goes to DIR/bench.json. About 2-3 minutes on an H200;
``--quick`` uses smaller sizes and takes well under a minute.

It needs a real GPU: on the CUDA simulator, or with no GPU, it prints one sentence saying so
and exits with status 0 (CI never runs it). Run it with NUMBA_ENABLE_CUDASIM unset or 0.

This script is the ONE place in the project that allocates device memory directly
(``cuda.device_array``, ``cuda.to_device``, ``cuda.pinned_array``): it is a measurement script,
not the runtime. Kernels, ops and the runtime never allocate (see kernels/_check.py).
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata

import numpy as np
from numba import config, cuda

from kernels import gemm as gemm_family
from kernels.gemm import gemm, gemm_batched, gemm_flops

GEMM_RTOL = 1e-4  # max |got - want| / max |want| allowed against cuBLAS / NumPy
PLAN_FULL = {
    "gemm_sizes": [(4096, 4096, 4096), (1024, 1024, 1024)],
    "v3_sweep": [(16, 8, 8, 8), (8, 16, 8, 8), (16, 16, 4, 8), (8, 8, 8, 8)],  # besides the default block
    "gemm_trans": True,
    "conv_layers": [  # name, x shape (N, C, H, W), w shape (K, C, R, S), stride, padding
        ("alexnet_conv2", (32, 96, 27, 27), (256, 96, 5, 5), 1, 2),
        ("resnet_3x3", (32, 128, 28, 28), (128, 128, 3, 3), 1, 1),
        ("resnet_stem", (8, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    ],
    "conv_chunks": [1, 8, 32],
    "batched": [  # name, (M, N, K), batch, trans_a, trans_b, reduce: conv GEMMs per im2col chunk
        ("alexnet_conv2_forward", (256, 729, 2400), 32, False, False, False),
        ("alexnet_conv2_backward_data", (2400, 729, 256), 32, True, False, False),
        ("alexnet_conv3_backward_filter", (384, 2304, 169), 32, False, True, True),
        ("resnet_3x3_forward", (128, 784, 1152), 32, False, False, False),
    ],
    "copy_bytes": 256 << 20,
    "launches": 5000,
    "reps": 7,
    "warmup": 1,  # untimed calls before each row (0 on the simulator, whose times mean nothing)
    "row_budget_ms": 1500.0,
    "section_budget_s": 50.0,
}
PLAN_QUICK = dict(
    PLAN_FULL, gemm_sizes=[(1024, 1024, 1024), (512, 512, 512)], v3_sweep=[], gemm_trans=False,
    conv_layers=[("resnet_3x3_small", (8, 64, 28, 28), (64, 64, 3, 3), 1, 1)], conv_chunks=[1, 8],
    batched=[("resnet_3x3_forward", (128, 784, 1152), 8, False, False, False),
             ("resnet_3x3_backward_filter", (128, 1152, 784), 8, False, True, True)],
    copy_bytes=64 << 20, launches=1000, reps=5, row_budget_ms=500.0, section_budget_s=20.0,
)


def _empty():  # jitted in bench_launch, so importing this module compiles nothing
    pass


def _touch(a, b, c):  # the same, with three array arguments to pass
    pass


# ---------------------------------------------------------------- helpers (unit-tested)
def no_gpu_reason() -> str | None:
    """None on a real GPU, else the one sentence explaining why nothing can be measured."""
    how = "run `NUMBA_ENABLE_CUDASIM=0 python -m kernels.bench --out DIR` on a machine with an NVIDIA GPU"
    if config.ENABLE_CUDASIM:
        return f"No GPU benchmark: numba.cuda is the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), so {how}."
    if not cuda.is_available():
        return f"No GPU benchmark: no CUDA GPU was found, so {how}."
    return None


def gflops(flops: float, ms: float | None) -> float | None:
    """GFLOP/s of ``flops`` operations done in ``ms`` milliseconds (None if not measured)."""
    return None if ms is None or ms <= 0 else flops / (ms * 1e-3) / 1e9


def gbytes_per_s(nbytes: int, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else nbytes / (ms * 1e-3) / 1e9


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want|: one number for a whole matrix."""
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    return diff / scale if scale > 0 else diff


def conv_out_hw(x_shape, w_shape, stride: int, padding: int) -> tuple[int, int]:
    (_, _, h, w), (_, _, r, s) = x_shape, w_shape
    return (h + 2 * padding - r) // stride + 1, (w + 2 * padding - s) // stride + 1


def conv_flops(x_shape, w_shape, stride: int, padding: int) -> int:
    """2*N*K*C*R*S*P*Q: the same for forward, backward_data and backward_filter."""
    p, q = conv_out_hw(x_shape, w_shape, stride, padding)
    n, c = x_shape[:2]
    k, _, r, s = w_shape
    return 2 * n * k * c * r * s * p * q


def time_ms(fn, *, reps: int, warmup: int = 1, budget_ms: float = 1000.0) -> dict:
    """Median / min milliseconds of ``fn()`` between two CUDA events, after ``warmup`` calls.
    After the first timed call, the repetitions are cut so the row stays near ``budget_ms``."""
    for _ in range(warmup):
        fn()
    cuda.synchronize()
    start, end = cuda.event(), cuda.event()
    times: list[float] = []
    while len(times) < reps:
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
        if len(times) == 1 and times[0] > 0:
            reps = max(1, min(reps, int(budget_ms / times[0])))
    return {"ms": statistics.median(times), "min_ms": min(times), "reps": len(times)}


def format_table(title: str, rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of ``columns`` of ``rows`` (floats to 4 significant digits)."""
    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    body = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(columns)]
    lines = [title, "  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(b, widths)) for b in body]
    return "\n".join(lines)


def _cupy():
    try:
        import cupy
        return cupy
    except Exception:  # not installed, or installed without a usable CUDA
        return None


def environment() -> dict:
    """GPU, driver and library versions, and the date, for the JSON record."""
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "python": platform.python_version(), "numpy": np.__version__,
           "simulator": bool(config.ENABLE_CUDASIM)}
    for dist in ("numba", "numba-cuda", "cupy", "cupy-cuda12x", "cupy-cuda13x"):
        try:
            env[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            env[dist] = None
    env["cupy_tf32"] = os.environ.get("CUPY_TF32", "0")
    try:
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        env["gpu"], env["compute_capability"] = name, list(dev.compute_capability)
        env["cuda_driver_api"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
    except Exception as e:  # the simulator has no driver
        env["gpu_error"] = f"{type(e).__name__}: {e}"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        found = out.returncode == 0 and out.stdout.strip()
        env["driver"] = out.stdout.strip().splitlines()[0] if found else None
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    return env


def _guard(rows: list, label: dict, fn):
    """Run one row; on any error record it in the row instead of stopping the benchmark."""
    try:
        rows.append({**label, **fn()})
    except Exception as e:
        rows.append({**label, "error": f"{type(e).__name__}: {e}"[:300]})


# ---------------------------------------------------------------- (a) GEMM
def bench_gemm(plan: dict) -> list[dict]:
    cp = _cupy()
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    for si, (m, n, k) in enumerate(plan["gemm_sizes"]):
        size = f"{m}x{n}x{k}"
        transposed = [(False, True), (True, False)] if plan["gemm_trans"] and si == 0 else []
        layouts = [(False, False)] + transposed
        for ta, tb in layouts:
            a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
            b = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
            d_a, d_b, d_c = cuda.to_device(a), cuda.to_device(b), cuda.device_array((m, n), np.float32)
            layout = "nn" if not (ta or tb) else ("nt" if tb else "tn")
            want, cublas_ms = _gemm_reference(cp, a, b, d_a, d_b, ta, tb, plan, rows, size, layout)
            impls = [("v3", gemm_family.DEFAULT_BLOCK["v3"])]
            if layout == "nn":
                impls += [("v1", None), ("v2", None)]
                impls += [("v3", blk) for blk in (plan["v3_sweep"] if si == 0 else []) if blk != impls[0][1]]
            first = None
            for version, block in impls:
                def run(version=version, block=block):
                    gemm(d_a, d_b, d_c, trans_a=ta, trans_b=tb, version=version, block=block)

                def row(run=run):
                    t = time_ms(run, reps=plan["reps"], warmup=plan.get("warmup", 1),
                                budget_ms=plan["row_budget_ms"])
                    got = d_c.copy_to_host()
                    nonlocal first
                    first = got if first is None else first
                    rate, err = gflops(gemm_flops(m, n, k), t["ms"]), rel_error(got, want)
                    pct = None if rate is None or not cublas_ms else 100 * cublas_ms / t["ms"]
                    return {**t, "gflops": rate, "rel_err": err, "ok": err <= GEMM_RTOL,
                            "bit_identical_to_v3": bool(np.array_equal(got, first)), "pct_of_cublas": pct}

                shown = block or gemm_family.DEFAULT_BLOCK[version]
                _guard(rows, {"size": size, "layout": layout, "impl": version,
                              "block": "x".join(map(str, shown))}, row)
            d_a = d_b = d_c = None  # free the device buffers before the next size
    return rows


def _gemm_reference(cp, a, b, d_a, d_b, ta, tb, plan, rows, size, layout):
    """(product to check against, cuBLAS milliseconds or None): CuPy's product, timed, if CuPy
    works here, else NumPy's (float64) with a row saying why cuBLAS was skipped."""
    a_, b_ = (a.T if ta else a), (b.T if tb else b)
    (m, k), n = a_.shape, b_.shape[1]
    label = {"size": size, "layout": layout, "impl": "cupy", "block": "cuBLAS"}
    if cp is not None:
        try:
            ca, cb = cp.asarray(d_a), cp.asarray(d_b)
            ca, cb = (ca.T if ta else ca), (cb.T if tb else cb)
            cc = cp.empty((m, n), dtype=cp.float32)
            t = time_ms(lambda: cp.matmul(ca, cb, out=cc), reps=plan["reps"], warmup=plan.get("warmup", 1),
                        budget_ms=plan["row_budget_ms"])
            rows.append({**label, **t, "gflops": gflops(gemm_flops(m, n, k), t["ms"]),
                         "pct_of_cublas": 100.0})
            return cp.asnumpy(cc), t["ms"]
        except Exception as e:  # e.g. a CuPy built for another CUDA
            rows.append({**label, "error": f"cupy.matmul failed, row skipped: {type(e).__name__}: {e}"[:300]})
    else:
        rows.append({**label, "error": "CuPy not installed: row skipped"})
    return a_.astype(np.float64) @ b_.astype(np.float64), None


# ---------------------------------------------------------------- (b) batched GEMM
def bench_batched(plan: dict) -> list[dict]:
    """One batched launch per chunk against one launch per matrix (beta = 1 after the first with
    ``reduce``), for each conv-shaped case: time, GFLOP/s, launches, and the same bits."""
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    for name, (m, n, k), batch, ta, tb, reduce in plan["batched"]:
        # the weights, shared (forward, backward-data), or dy (backward-filter)
        a_batch = batch if reduce else 1
        a = rng.standard_normal((a_batch,) + ((k, m) if ta else (m, k)), dtype=np.float32)
        b = rng.standard_normal((batch,) + ((n, k) if tb else (k, n)), dtype=np.float32)
        d_a, d_b = cuda.to_device(a), cuda.to_device(b)
        d_c = cuda.device_array((1 if reduce else batch, m, n), np.float32)
        kw = dict(trans_a=ta, trans_b=tb)

        def batched():
            gemm_batched(d_a, d_b, d_c, reduce=reduce, **kw)

        def per_matrix():
            for z in range(batch):
                za = z if d_a.shape[0] > 1 else 0
                gemm(d_a[za], d_b[z], d_c[0 if reduce else z], beta=1.0 if reduce and z else 0.0, **kw)

        first = None
        for impl, fn, launches in (("batched", batched, 1), ("one per matrix", per_matrix, batch)):
            def row(fn=fn, launches=launches):
                nonlocal first
                t = time_ms(fn, reps=plan["reps"], warmup=plan.get("warmup", 1),
                            budget_ms=plan["row_budget_ms"])
                got = d_c.copy_to_host()
                first = got if first is None else first
                return {**t, "launches": launches, "gflops": gflops(batch * gemm_flops(m, n, k), t["ms"]),
                        "bit_identical": bool(np.array_equal(got, first))}

            _guard(rows, {"case": name, "batch": batch, "impl": impl}, row)
        d_a = d_b = d_c = None  # free the device buffers before the next case
    return rows


# ---------------------------------------------------------------- (c) convolution
def bench_conv(plan: dict) -> list[dict]:
    try:
        conv = importlib.import_module("kernels.conv")
        algorithms, workspace_bytes = conv.ALGORITHMS, conv.workspace_bytes
        ops = {"forward": conv.conv2d_forward, "backward_data": conv.conv2d_backward_data,
               "backward_filter": conv.conv2d_backward_filter}
    except (ImportError, AttributeError) as e:
        return [{"layer": "-", "error": f"kernels.conv unavailable: {type(e).__name__}: {e}"}]
    rng = np.random.default_rng(0)
    rows: list[dict] = []
    t0 = time.perf_counter()
    for name, x_shape, w_shape, stride, padding in plan["conv_layers"]:
        p, q = conv_out_hw(x_shape, w_shape, stride, padding)
        y_shape = (x_shape[0], w_shape[0], p, q)
        d = {key: cuda.to_device(rng.standard_normal(shape, dtype=np.float32))
             for key, shape in (("x", x_shape), ("w", w_shape), ("dy", y_shape))}
        d.update(y=cuda.device_array(y_shape, np.float32), dx=cuda.device_array(x_shape, np.float32),
                 dw=cuda.device_array(w_shape, np.float32))
        args = {"forward": ("x", "w", "y"), "backward_data": ("dy", "w", "dx"),
                "backward_filter": ("x", "dy", "dw")}
        for op, fn in ops.items():
            first = None
            for algo in algorithms:
                # the split backward-filter takes chunks
                chunked = algo != "direct" or op == "backward_filter"
                for chunk in (plan["conv_chunks"] if chunked else [1]):
                    label = {"layer": name, "op": op, "algo": algo, "chunk": chunk}
                    if time.perf_counter() - t0 > plan["section_budget_s"]:
                        rows.append({**label, "error": "skipped: section time budget spent"})
                        continue

                    def row(fn=fn, op=op, algo=algo, chunk=chunk):
                        nonlocal first
                        nbytes = int(workspace_bytes(op, algo, x_shape, w_shape, stride, padding,
                                                     chunk=chunk))
                        ws = cuda.device_array(max(1, -(-nbytes // 4)), np.float32) if nbytes else None
                        arrays = [d[a] for a in args[op]]
                        t = time_ms(lambda: fn(*arrays, stride=stride, padding=padding, algo=algo,
                                               workspace=ws, chunk=chunk),
                                    reps=plan["reps"], warmup=plan.get("warmup", 1),
                                    budget_ms=plan["row_budget_ms"])
                        got = arrays[2].copy_to_host()
                        first = got if first is None else first
                        n_launches = len(conv.launches(op, algo, x_shape, w_shape, stride, padding, chunk))
                        return {**t, "workspace_bytes": nbytes, "launches": n_launches,
                                "same_as_first_algo": bool(np.array_equal(got, first)),
                                "gflops": gflops(conv_flops(x_shape, w_shape, stride, padding), t["ms"])}

                    _guard(rows, label, row)
        d = None  # free the device buffers before the next layer
    return rows


# ---------------------------------------------------------------- (d) copies, (e) launches
def bench_copy(plan: dict) -> list[dict]:
    nbytes = int(plan["copy_bytes"])
    dev = cuda.device_array(nbytes // 4, np.float32)
    pageable = np.ones(nbytes // 4, np.float32)
    pinned = cuda.pinned_array(nbytes // 4, np.float32)
    pinned[:] = 1.0
    rows: list[dict] = []
    for kind, host in (("pageable", pageable), ("pinned", pinned)):
        for direction, fn in (("host->device", lambda h=host: dev.copy_to_device(h)),
                              ("device->host", lambda h=host: dev.copy_to_host(h))):
            def row(fn=fn):
                t = time_ms(fn, reps=plan["reps"], warmup=plan.get("warmup", 1),
                            budget_ms=plan["row_budget_ms"])
                return {**t, "GB/s": gbytes_per_s(nbytes, t["ms"])}

            _guard(rows, {"memory": kind, "direction": direction, "MiB": nbytes >> 20}, row)
    return rows


def bench_launch(plan: dict) -> list[dict]:
    n = int(plan["launches"])
    a = cuda.device_array(16, np.float32)
    kernels = (("empty kernel", cuda.jit("void()")(_empty), ()),
               ("3 array arguments", cuda.jit("void(float32[::1], float32[::1], float32[::1])")(_touch),
                (a, a, a)))
    rows: list[dict] = []
    for label, kernel, args in kernels:
        def row(kernel=kernel, args=args):
            def many():
                for _ in range(n):
                    kernel[1, 1](*args)

            wall = time.perf_counter()
            t = time_ms(many, reps=3, budget_ms=plan["row_budget_ms"])
            wall = (time.perf_counter() - wall) / (t["reps"] + 1)  # warm-up included
            return {"launches": n, "us_per_launch": None if t["ms"] <= 0 else 1e3 * t["ms"] / n,
                    "wall_us_per_launch": 1e6 * wall / n}

        _guard(rows, {"kernel": label}, row)
    return rows


# ---------------------------------------------------------------- driver
SECTIONS = (
    ("gemm", bench_gemm, ["size", "layout", "impl", "block", "ms", "gflops", "pct_of_cublas", "rel_err", "ok",
                          "bit_identical_to_v3", "error"]),
    ("batched", bench_batched, ["case", "batch", "impl", "launches", "ms", "gflops", "bit_identical",
                                "error"]),
    ("conv", bench_conv, ["layer", "op", "algo", "chunk", "launches", "ms", "gflops", "workspace_bytes",
                          "same_as_first_algo", "error"]),
    ("copy", bench_copy, ["memory", "direction", "MiB", "ms", "GB/s", "error"]),
    ("launch", bench_launch, ["kernel", "launches", "us_per_launch", "wall_us_per_launch", "error"]),
)


def gemm_summary(rows: list[dict]) -> str | None:
    """One line: v3's best rate at the largest size against cuBLAS (the project's target is 50%)."""
    mine = [r for r in rows if r.get("impl") == "v3" and r.get("layout") == "nn" and r.get("gflops")]
    if not mine:
        return None
    size = max((r["size"] for r in mine), key=lambda s: np.prod([int(v) for v in s.split("x")]))
    best = max((r for r in mine if r["size"] == size), key=lambda r: r["gflops"])
    vs = f" = {best['pct_of_cublas']:.0f}% of cuBLAS" if best.get("pct_of_cublas") else " (no cuBLAS row)"
    return f"v3 at {size}: best {best['gflops']:.0f} GFLOP/s with block {best['block']}{vs}"


def run(out_dir: str, plan: dict) -> dict:
    """Run every section, print its table, write ``out_dir/bench.json``; return the record."""
    record = {"environment": environment(), "plan": plan}
    print(f"GPU: {record['environment'].get('gpu')}  driver {record['environment'].get('driver')}")
    for name, fn, columns in SECTIONS:
        t0 = time.perf_counter()
        try:
            rows = fn(plan)
        except Exception as e:  # a whole section failed (e.g. out of memory): keep the others
            rows = [{"error": f"{type(e).__name__}: {e}"[:300]}]
        record[name] = rows
        print("\n" + format_table(f"{name} ({time.perf_counter() - t0:.1f} s)", rows, columns), flush=True)
        if name == "gemm" and gemm_summary(rows):
            record["gemm_summary"] = gemm_summary(rows)
            print(record["gemm_summary"])
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "bench.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=str)
    print(f"\nwrote {path}")
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for bench.json")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, well under a minute")
    args = parser.parse_args(argv)
    reason = no_gpu_reason()
    if reason:
        print(reason)
        return 0
    run(args.out, PLAN_QUICK if args.quick else PLAN_FULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
