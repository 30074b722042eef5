"""The GPU time model: CUDA's stream rules on hand-made programs with hand-computed times, the model on
real programs, and the time-aware schedule (snlite.overlap, the cache's write-behind) hiding copies
without raising the peak."""
import dataclasses

import numpy as np
import pytest

from kernels.launches import GPUS
from nets import data_for, mixed_net
from snlite import models, timing
from snlite.adversary import COPY_TIES, AdversarialDevice
from snlite.config import CHOICES, MemoryConfig
from snlite.pipeline import place, simulate
from snlite.program import Alloc, Copy, Free, HostWait, Launch, Program, Record, Wait
from snlite.trace import trace_program
from snlite.train import Model

EXACT = timing.Profile("exact", "H200", h2d_gbs=1.0, d2h_gbs=1.0, copy_latency_us=0.0, launch_us=0.0,
                       copy_us=0.0, host_gbs=1e9)  # 1 GB/s: a copy of 3 MB takes 3 ms; enqueueing is free
A = Launch(0, 0, "a", "forward", "compute", (), ("x",))
B = Launch(1, 1, "b", "forward", "compute", (), ("y",))
TWO_MS = {"a": 2.0, "b": 2.0}


def tiny(*body):
    tensors = {"x": ((750_000,), "float32", "activation"), "y": ((16,), "float32", "activation")}
    setup = (Alloc("x", "arena", 0, 3_000_000), Alloc("y", "arena", 3_000_064, 1024))
    return Program("tiny", "by hand", "train", "pool", tensors, setup, tuple(body), 4_000_000, 3_000_000)


def run(*body):
    return timing.estimate(tiny(*body), None, EXACT, kernel_ms=lambda ins: (TWO_MS[ins.layer], 1))


COPY_X = Copy("x", "offload", "arena", 0, "slab", 0, 3_000_000, "copy_out")
SLOT = Alloc("x", "slab", 0, 3_000_000)


def test_a_copy_overlaps_the_next_kernel_unless_compute_waits_for_it():
    overlapped = run(SLOT, A, Record("r", "compute"), Wait("r", "copy_out"), COPY_X, Record("c", "copy_out"),
                     B, Wait("c", "compute"), Record("end", "compute"), HostWait("end"))
    assert overlapped.step_ms == pytest.approx(5.0)  # a 0-2, copy 2-5 beside b 2-4, then the end waits for it
    assert overlapped.busy_ms == {"compute": 4.0, "copy_out": 3.0, "copy_in": 0.0}
    assert overlapped.transfer_ms == pytest.approx(3.0) and overlapped.exposed_ms == pytest.approx(1.0)
    serialized = run(SLOT, A, Record("r", "compute"), Wait("r", "copy_out"), COPY_X, Record("c", "copy_out"),
                     Wait("c", "compute"), B, Record("end", "compute"), HostWait("end"))
    assert serialized.step_ms == pytest.approx(7.0)  # b waits for the copy: 2 + 3 + 2
    assert serialized.exposed_ms == pytest.approx(3.0) and serialized.overlap == pytest.approx(0.0)
    assert [(s, a, b) for s, a, b, _, _ in serialized.spans] == [("compute", 0, 2), ("copy_out", 2, 5),
                                                                 ("compute", 5, 7)]


def test_a_copy_pays_the_links_latency_before_its_bytes():
    slow_start = dataclasses.replace(EXACT, copy_latency_us=500.0)
    serialized = timing.estimate(
        tiny(SLOT, A, Record("r", "compute"), Wait("r", "copy_out"), COPY_X, Record("c", "copy_out"),
             Wait("c", "compute"), B, Record("end", "compute"), HostWait("end")),
        None, slow_start, kernel_ms=lambda ins: (TWO_MS[ins.layer], 1))
    assert [(s, a, b) for s, a, b, _, _ in serialized.spans] == [("compute", 0, 2), ("copy_out", 2, 5.5),
                                                                 ("compute", 5.5, 7.5)]
    k40 = timing.PROFILES["K40"]  # 10 GB/s, 15 us a copy
    assert timing.copy_ms(k40, 10**9, to_host=True) == pytest.approx(100.015)


def test_without_a_ready_wait_the_copy_starts_at_once_and_the_host_pays_for_launches():
    eager = run(SLOT, A, COPY_X, B, Record("e", "compute"), Record("c", "copy_out"), Wait("c", "compute"),
                Record("end", "compute"), HostWait("end"))
    assert eager.step_ms == pytest.approx(4.0)  # the copy (wrongly unordered) runs 0-3 beside a and b
    slow_host = timing.estimate(tiny(A, B, Record("end", "compute"), HostWait("end")), None,
                                EXACT.__class__(**{**EXACT.__dict__, "launch_us": 5000.0}),
                                kernel_ms=lambda ins: (TWO_MS[ins.layer], 1))
    assert slow_host.step_ms == pytest.approx(12.0)  # enqueued at 5 and 10 ms: launch-bound, 10 + 2


def test_raw_frees_synchronize_the_device():
    raw = timing.estimate(tiny(A, Free("x", "raw", 0, 3_000_000), B, Record("end", "compute"),
                               HostWait("end")), None, EXACT, kernel_ms=lambda ins: (TWO_MS[ins.layer], 1))
    assert raw.step_ms == pytest.approx(4.0 + 2 * EXACT.malloc_us * 1e-3 / 2)


def test_profiles_and_errors():
    assert list(timing.PROFILES) == ["H200", "H100", "A100", "T4", "K40"]
    assert timing.profile("h200").gpu == "H200"
    # the config's schedules are the profiles, in order (config.py, at the bottom of the imports, lists them)
    assert CHOICES["schedule"] == ("paper", *timing.PROFILES)
    assert all(timing.PROFILES[p].gpu in GPUS for p in timing.PROFILES)


@pytest.mark.parametrize("gpu_name,profile", [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100"),
    ("Tesla T4", "T4"), ("Tesla K40c", "K40"), ("NVIDIA RTX A1000", "H200"),
    ("NVIDIA GeForce RTX 4090", "H200"), ("NVIDIA RTX A4000", "H200"), ("CUDA simulator", "H200")])
def test_a_cuda_device_is_timed_on_its_own_gpus_profile_where_there_is_one(gpu_name, profile):
    """A whole word of the device's name picks the profile (an H100 was timed as an H200 before it had
    a profile of its own); any other GPU gets the default."""
    assert timing.profile_for(gpu_name) == profile
    with pytest.raises(ValueError, match="unknown GPU profile 'V100'"):
        timing.profile("V100")


def test_the_model_on_alexnet_is_sane_and_calibrates():
    g = models.alexnet(batch=64)
    h200 = timing.estimate(place(g, MemoryConfig(liveness=True)), g, "H200")
    k40 = timing.estimate(place(g, MemoryConfig(liveness=True)), g, "K40")
    assert 0 < h200.step_ms < k40.step_ms and h200.busy_ms["compute"] > 0
    assert h200.launches > len(g.layers) \
        and len(h200.memory) == len(trace_program(place(g, MemoryConfig(liveness=True))).op_steps)
    measured = [dict(stream="compute", start_ms=0.0, end_ms=2 * h200.busy_ms["compute"])]
    calibrated = timing.calibrate("H200", measured, h200)
    assert calibrated.kernel_scale == pytest.approx(2.0)
    assert timing.estimate(place(g, MemoryConfig(liveness=True)), g, calibrated).busy_ms["compute"] == \
        pytest.approx(2 * h200.busy_ms["compute"])


@pytest.mark.parametrize("name", ["alexnet", "vgg16"])
def test_retimed_eager_offload_hides_its_copies_without_raising_the_peak(name):
    g = models.get_model(name, 32)
    paper = place(g, MemoryConfig(liveness=True, offload=True, workspace="dynamic"))
    timed = place(g, MemoryConfig(liveness=True, offload=True, workspace="dynamic", schedule="H200"))
    before, after = timing.estimate(paper, g, "H200"), timing.estimate(timed, g, "H200")
    assert trace_program(timed).peak_bytes <= trace_program(paper).peak_bytes
    assert trace_program(timed).d2h_bytes == trace_program(paper).d2h_bytes > 0
    assert after.exposed_ms < 0.5 * before.exposed_ms and after.step_ms < before.step_ms


def test_write_behind_starts_eviction_copies_early_and_keeps_peak_and_traffic():
    g = models.resnet(50, batch=16)
    top = simulate(g, MemoryConfig.superneurons()).peak_bytes
    budget = int(top * 0.6) // 1024 * 1024
    paper = place(g, MemoryConfig.superneurons(budget_bytes=budget, schedule="paper"))
    timed = place(g, MemoryConfig.superneurons(budget_bytes=budget))
    a, b = trace_program(paper), trace_program(timed)
    assert b.peak_bytes <= a.peak_bytes \
        and b.d2h_bytes + b.h2d_bytes <= a.d2h_bytes + a.h2d_bytes and a.d2h_bytes
    body = timed.body
    early = 0
    for k, ins in enumerate(body):  # an eviction copy with kernels between it and its block's release
        if isinstance(ins, Copy) and ins.why == "evict":
            release = next(i for i in range(k, len(body)) if isinstance(body[i], Free)
                           and body[i].tensor == ins.tensor and body[i].space == "arena")
            early += any(isinstance(i, Launch) for i in body[k:release])
    assert early > 0
    assert timing.estimate(timed, g).exposed_ms < timing.estimate(paper, g).exposed_ms


@pytest.mark.parametrize("copies", COPY_TIES)
@pytest.mark.parametrize("order", ["late", "early"])
def test_time_aware_schedules_train_bit_identically_on_the_adversarial_device(order, copies):
    g = mixed_net(n=4)
    x, labels = data_for(g)
    relaxed = simulate(g, MemoryConfig(liveness=True, cache=True))
    configs = [MemoryConfig(liveness=True, offload=True, schedule="T4"),
               MemoryConfig(liveness=True, cache=True, budget_bytes=relaxed.peak_bytes - 8 * 1024,
                            schedule="K40"),
               MemoryConfig.superneurons(budget_bytes=relaxed.peak_bytes - 8 * 1024)]
    base = Model(g, MemoryConfig(), device="host", seed=4)
    want = [base.step(x, labels, lr=0.1, momentum=0.9) for _ in range(2)]
    for config in configs:
        model = Model(g, config, device=AdversarialDevice(order, seed=4, copies=copies), seed=4)
        assert [model.step(x, labels, lr=0.1, momentum=0.9) for _ in range(2)] == want, config.describe()
        assert all(np.array_equal(model.params[n], v) for n, v in base.params.items())


@pytest.mark.parametrize("flags, profile", [
    ((), "NVIDIA H200"), (("--schedule", "K40"), "NVIDIA Tesla K40"), (("--schedule", "H100"), "NVIDIA H100"),
    (("--schedule", "K40", "--gpu", "T4"), "NVIDIA T4"), (("--gpu", "a100"), "NVIDIA A100")])
def test_plan_times_the_iteration_on_the_gpu_its_copies_were_scheduled_for(flags, profile, capsys):
    """Without --gpu, a plan whose copies --schedule moved for a GPU is timed on that GPU (it was timed
    on the H200 whatever the schedule); --gpu still picks any profile."""
    from snlite.cli import main

    assert main(["plan", "lenet", "--batch", "4", "--liveness", "--offload", *flags]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time (estimated"))
    assert line.startswith(f"time (estimated, snlite.timing): {profile}"), line


def test_the_time_of_a_program_is_refused_against_another_graph():
    """The kernels' times come from the graph's layers: a graph of another batch gave a time 5.7 times
    the program's, without a word; no graph gave a bare AttributeError."""
    program = place(models.lenet(batch=8), MemoryConfig.superneurons())
    assert timing.estimate(program, models.lenet(batch=8)).step_ms > 0
    with pytest.raises(ValueError, match=r"estimate: the graph given is not the program's: tensor data: "
                                         r"\(\(8, 1, 28, 28\), .*in the program, but \(\(64, 1, 28, 28\)"):
        timing.estimate(program, models.lenet(batch=64))
    with pytest.raises(ValueError, match=r"estimate needs the graph the program was planned for .*or "
                                         r"kernel_ms"):
        timing.estimate(program, None)
