"""Everything snlite needs to learn from a real GPU, in one call that cannot stop half-way.

    NUMBA_ENABLE_CUDASIM=0 python -m snlite.gpucheck --out gpucheck-out          # on a GPU: minutes
    NUMBA_ENABLE_CUDASIM=1 python -m snlite.gpucheck --out /tmp/dry --dry-run    # every line, tiny shapes

A GPU is lent rarely and briefly, so the whole check is this one script, and its dry run on the CUDA
simulator runs in the test suite: every line of it has run before a GPU sees it. The stages, in order:

1. ``environment``: the GPU, its memory, the driver and library versions, the simulator flag;
2. ``gpu_tests``: the tests marked ``gpu`` (``pytest -m gpu``, in a subprocess, with their counts);
3. ``training``: the digits LeNet and a small ResNet trained a few steps under the baseline and
   ``superneurons()`` on ``device="cuda"``: losses and weights must be bit-identical across the two,
   and each run's bytes (the device's own counters, the bytes live at each launch) must equal what the
   meta device planned; CUDA's free memory before and after is reported beside them;
4. ``streams``: one profiled step with offload on, drawn as ``snlite train --device cuda --streams``
   draws it (the same function), the share of copy time the measured streams overlapped with compute
   next to the time model's, and the profile :func:`snlite.timing.calibrate` fits to it;
5. ``kernel_bench``: ``python -m kernels.bench`` (GEMM against ``cupy.matmul``, the convolution
   algorithms, copies, launch cost), in a subprocess.

Each stage is timed and recorded with its figures, or with its error and traceback, and the next
stage runs either way. Everything goes to ``DIR/gpucheck.json``, the pictures and the benchmark's
own JSON beside it. The exit status is 0 when every stage passed (or was skipped for a reason it
states), 1 otherwise. On the simulator, ``--dry-run`` is the only sensible mode (full shapes would
take hours there); without a GPU and without the simulator the CUDA stages fail and say why.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata

import numpy as np
from numba import cuda

from snlite import data, files, models, plot, timing
from snlite.cli import _gpu_of, draw_streams
from snlite.config import MemoryConfig
from snlite.device import get_device, simulator_enabled
from snlite.graph import Graph
from snlite.pipeline import simulate
from snlite.train import Model

REPO = pathlib.Path(__file__).resolve().parent.parent
STAGES = ("environment", "gpu_tests", "training", "streams", "kernel_bench")
PACKAGES = ("numpy", "numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "pytest")
CONFIGS = {"baseline": MemoryConfig(), "superneurons": MemoryConfig.superneurons()}
STREAMS_CONFIG = MemoryConfig(liveness=True, offload=True)  # offload without the cache: copies every step
COPY_STREAMS = ("copy_out", "copy_in")


@dataclass(frozen=True)
class Sizes:
    """How big the check's networks are and how long its subprocesses may run."""

    steps: int  # training steps per run
    nets: tuple  # (name, graph builder, data builder)
    bench_args: tuple  # arguments of python -m kernels.bench after --out
    timeout_s: int  # each subprocess


def _lenet_digits():
    return models.lenet(batch=64, input_shape=(1, 8, 8), num_classes=10)


def _digits_batch(g):
    """A batch of scikit-learn's digits where it is installed, else of the synthetic blobs (same shape)."""
    try:
        train, _ = data.digits(seed=0)
    except ImportError:
        train = data.synthetic(g.input_shape[0], g.input_shape[1:], classes=g.num_classes, seed=0)
    return train.x[:g.input_shape[0]], train.labels[:g.input_shape[0]]


def _tiny(residual: bool) -> Graph:
    """The dry run's stand-ins, a few hundred threads a kernel: a conv-pool-fc chain, or one residual
    unit before it."""
    g = Graph((2, 1, 4, 4), 3, name="tiny_resnet" if residual else "tiny_lenet")
    x = g.conv2d(g.input(), 2, 3, padding=1, name="conv1")
    if residual:
        y = g.conv2d(g.relu(g.batchnorm(x, name="bn1"), name="relu1"), 2, 3, padding=1, name="conv2")
        x = g.relu(g.add(g.batchnorm(y, name="bn2"), x, name="add"), name="relu2")
    x = g.maxpool(x, 2, name="pool1")
    g.softmax_loss(g.linear(g.flatten(x, name="flatten"), 3, name="fc"))
    return g


def _random_batch(g):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(g.input_shape).astype(np.float32),
            rng.integers(0, g.num_classes, g.input_shape[0]).astype(np.int32))


FULL = Sizes(steps=5, nets=(("lenet (digits)", _lenet_digits, _digits_batch),
                            ("cifar_resnet8", lambda: models.cifar_resnet(8, batch=32), _random_batch)),
             bench_args=("--quick",), timeout_s=300)
DRY = Sizes(steps=1, nets=(("tiny_lenet", lambda: _tiny(False), _random_batch),
                           ("tiny_resnet", lambda: _tiny(True), _random_batch)),
            bench_args=("--quick",), timeout_s=120)


# ---------------------------------------------------------------- the stages
def environment(out: pathlib.Path, sizes: Sizes) -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "machine": platform.machine(),
            "simulator": simulator_enabled(), "packages": _versions()}
    if not cuda.is_available():
        raise RuntimeError("no CUDA GPU is visible (numba.cuda.is_available() is False) and the simulator is "
                           "off: run on a GPU, or set NUMBA_ENABLE_CUDASIM=1 with --dry-run")
    info["gpu"] = get_device("cuda").gpu_name
    if not info["simulator"]:
        info["compute_capability"] = list(cuda.get_current_device().compute_capability)
        info["driver"] = ".".join(map(str, cuda.cudadrv.driver.driver.get_version()))
        info["memory"] = _memory_info()
    return info


def gpu_tests(out: pathlib.Path, sizes: Sizes) -> dict:
    """``pytest -m gpu`` over the test files that have such tests, counted from its JUnit XML."""
    tests = REPO / "tests"
    files = sorted(str(p) for p in tests.glob("test_*.py") if "mark.gpu" in p.read_text())
    if not files:
        return {"skip_reason": "no tests/ folder with gpu-marked tests beside this snlite"}
    xml = out / "gpu-tests.xml"
    pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
              "-o", "addopts=--strict-markers", f"--junitxml={xml}"]
    run = _subprocess(pytest + files, sizes.timeout_s, cwd=REPO)
    counts = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in ET.parse(xml).getroot().iter("testsuite"):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    result = {"files": [pathlib.Path(f).name for f in files], **counts, "passed": counts["tests"]
              - counts["failures"] - counts["errors"] - counts["skipped"], "seconds": run["seconds"],
              "output_tail": run["output_tail"]}
    if run["returncode"] not in (0, 5) or counts["failures"] or counts["errors"]:
        raise StageFailed(f"pytest -m gpu: {counts['failures']} failed, {counts['errors']} errors "
                          f"(exit {run['returncode']})", result)
    if counts["tests"] and counts["skipped"] == counts["tests"]:
        result["skip_reason"] = f"all {counts['tests']} gpu tests skipped themselves (no real GPU)"
    return result


def training(out: pathlib.Path, sizes: Sizes) -> dict:
    """Each net trained ``sizes.steps`` steps under each config on the CUDA device, from the same
    weights and batch: bit-identical losses and weights, and the bytes the meta device planned."""
    results, problems = {}, []
    for label, build, batch_of in sizes.nets:
        g = build()
        x, labels = batch_of(g)
        runs = {}
        for name, config in CONFIGS.items():
            before = _memory_info()
            model = Model(g, config, device="cuda", seed=0)
            after = _memory_info()
            losses = [model.step(x, labels, lr=0.05, momentum=0.9) for _ in range(sizes.steps)]
            planned = simulate(g, config, costs=model.costs)  # the conv choices the GPU's timings made
            meta = Model(g, config, device="meta", costs=model.costs)
            run = {"losses": losses, "arena_bytes": model.device.arena_bytes,
                   "pinned_bytes": model.device.pinned_bytes, "planned_arena_bytes": meta.device.arena_bytes,
                   "planned_pinned_bytes": meta.device.pinned_bytes,
                   "peak_bytes": max(model.step_launch_bytes, default=0),
                   "planned_peak_bytes": max((s.counted_bytes for s in planned.steps), default=0),
                   "cuda_free_drop_bytes": None if before is None else before["free"] - after["free"]}
            if model.step_launch_bytes != [s.counted_bytes for s in planned.steps]:
                problems.append(f"{label}, {name}: the bytes live at each launch differ from the plan")
            if (run["arena_bytes"], run["pinned_bytes"]) != (run["planned_arena_bytes"],
                                                             run["planned_pinned_bytes"]):
                problems.append(f"{label}, {name}: the device allocated {run['arena_bytes']:,d} + "
                                f"{run['pinned_bytes']:,d} pinned bytes, the meta device planned "
                                f"{run['planned_arena_bytes']:,d} + {run['planned_pinned_bytes']:,d}")
            runs[name] = (run, model.params)
        (base, base_params), (sn, sn_params) = runs["baseline"], runs["superneurons"]
        same = base["losses"] == sn["losses"] and all(np.array_equal(v, sn_params[k])
                                                      for k, v in base_params.items())
        if not same:
            problems.append(f"{label}: superneurons() changed the losses or the weights")
        results[label] = {"bit_identical": same, **{k: r for k, (r, _) in runs.items()}}
    if problems:
        raise StageFailed("; ".join(problems), results)
    return results


def streams(out: pathlib.Path, sizes: Sizes) -> dict:
    """One profiled step of the last net with offload on: measured streams against the time model."""
    label, build, batch_of = sizes.nets[-1]
    g = build()
    x, labels = batch_of(g)
    model = Model(g, STREAMS_CONFIG, device="cuda", seed=0)
    model.step(x, labels)  # warm: kernels compiled, conv algorithms timed
    model.profile = True
    model.step(x, labels)
    measured = model.stream_events
    gpu = _gpu_of(model)
    modelled = timing.estimate(model.programs[model.step_mode], g, gpu)
    result = {"net": label, "config": STREAMS_CONFIG.describe(), "profile": gpu,
              "measured": _stream_figures(measured), "modelled": _stream_figures(modelled.events()),
              "modelled_timeline_overlap": modelled.overlap}
    try:
        result["kernel_scale"] = timing.calibrate(gpu, measured, modelled).kernel_scale
    except ValueError as e:
        result["kernel_scale"] = f"not calibrated: {e}"
    png = out / "streams.png"
    try:
        draw_streams(model, argparse.Namespace(net=label, streams=str(png)))
        result["png"] = png.name
    except Exception as e:  # noqa: BLE001 - matplotlib missing is a figure lost, not a failed check
        if not isinstance(getattr(e, "__cause__", None), plot.PlotUnavailable) and "matplotlib" not in str(e):
            raise
        result["png"] = f"not drawn: {e}"
    return result


def kernel_bench(out: pathlib.Path, sizes: Sizes) -> dict:
    run = _subprocess([sys.executable, "-m", "kernels.bench", "--out", str(out / "kernels"),
                       *sizes.bench_args], sizes.timeout_s, cwd=REPO)
    result = {"seconds": run["seconds"], "output_tail": run["output_tail"]}
    report = out / "kernels" / "bench.json"
    if report.exists():
        result["bench_json"] = str(report.relative_to(out))
    elif run["returncode"] == 0:
        said = run["output_tail"].strip()
        result["skip_reason"] = said.splitlines()[-1] if said else "kernels.bench wrote nothing"
    if run["returncode"] != 0:
        raise StageFailed(f"python -m kernels.bench exited {run['returncode']}", result)
    return result


# ---------------------------------------------------------------- helpers
class StageFailed(RuntimeError):
    """A stage that ran to its end and found something wrong: its figures are kept with the error."""

    def __init__(self, message: str, figures: dict):
        super().__init__(message)
        self.figures = figures


def _versions() -> dict:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _memory_info() -> dict | None:
    """CUDA's free and total device memory now (None on the simulator, which has no such counter)."""
    if simulator_enabled():
        return None
    free, total = cuda.current_context().get_memory_info()
    return {"free": int(free), "total": int(total)}


def _subprocess(cmd: list, timeout_s: int, cwd) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code = "timeout"
        said = e.stdout or ""
        output = (said.decode(errors="replace") if isinstance(said, bytes) else said) + \
            f"\n(stopped after {timeout_s} s)"
    seconds = round(time.perf_counter() - start, 1)
    return {"returncode": code, "seconds": seconds, "output_tail": output[-3000:]}


def _stream_figures(events: list[dict]) -> dict:
    """Busy time per stream, and the share of the copies' time spent while compute was busy."""
    busy: dict[str, float] = {}
    for e in events:
        busy[e["stream"]] = busy.get(e["stream"], 0.0) + e["end_ms"] - e["start_ms"]
    compute = _merged([(e["start_ms"], e["end_ms"]) for e in events if e["stream"] == "compute"])
    copies = [(e["start_ms"], e["end_ms"]) for e in events if e["stream"] in COPY_STREAMS]
    copy_ms = sum(b - a for a, b in copies)
    hidden = sum(max(0.0, min(b, d) - max(a, c)) for a, b in copies for c, d in compute)
    return {"busy_ms": busy, "copy_ms": copy_ms, "copy_overlapped": hidden / copy_ms if copy_ms else None}


def _merged(spans: list) -> list:
    """Intervals merged where they touch or overlap, sorted."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def run(out, dry_run: bool = False, skip=()) -> dict:
    """Every stage not in ``skip``, in order; the report as written to ``out/gpucheck.json``."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = DRY if dry_run else FULL
    report = {"dry_run": dry_run, "stages": {}}
    for name in STAGES:
        if name in skip:
            report["stages"][name] = {"status": "skipped", "reason": "--skip"}
            continue
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            figures = globals()[name](out, sizes)
            status = "skipped" if "skip_reason" in figures else "passed"
            entry = {"status": status, **figures}
        except Exception as e:  # noqa: BLE001 - one stage's failure must not lose the others' figures
            entry = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                     "traceback": traceback.format_exc(), **getattr(e, "figures", {})}
        entry["seconds"] = round(time.perf_counter() - start, 1)
        report["stages"][name] = entry
        why = entry.get("error") or entry.get("skip_reason")
        print(f"   {entry['status']} in {entry['seconds']} s" + (f": {why}" if why else ""), flush=True)
        files.write_text(out / "gpucheck.json", json.dumps(report, indent=1, default=str))  # kept after each
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m snlite.gpucheck", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True,
                   help="folder for gpucheck.json, streams.png and kernels/bench.json")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny networks and one step: the whole script on the CUDA simulator in seconds")
    p.add_argument("--skip", action="append", default=[], choices=STAGES, metavar="STAGE",
                   help=f"leave a stage out (repeatable): {', '.join(STAGES)}")
    args = p.parse_args(argv)
    if simulator_enabled() and not args.dry_run:
        p.error("the CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): full shapes would take hours there; "
                "add --dry-run, or run on a GPU with NUMBA_ENABLE_CUDASIM=0")
    report = run(args.out, args.dry_run, set(args.skip))
    failed = [n for n, s in report["stages"].items() if s["status"] == "failed"]
    print(f"report: {pathlib.Path(args.out) / 'gpucheck.json'}; "
          + (f"failed: {', '.join(failed)}" if failed else "every stage passed or was skipped"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(files.main(main))
