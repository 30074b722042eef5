"""The GPU check script's dry run: every line of ``python -m snlite.gpucheck`` runs here, on the CUDA
simulator with tiny shapes, so that the few minutes a real GPU is lent are not lost to a Python error."""
import dataclasses
import json

import pytest

from snlite import gpucheck
from snlite.device import simulator_enabled

pytestmark = pytest.mark.skipif(not simulator_enabled(), reason="the dry run is for the CUDA simulator")


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpucheck")
    status = gpucheck.main(["--out", str(out), "--dry-run"])
    return status, out, json.loads((out / "gpucheck.json").read_text())


def test_the_dry_run_runs_every_stage_and_passes(dry):
    status, out, report = dry
    stages = report["stages"]
    assert status == 0 and report["dry_run"] is True
    assert list(stages) == list(gpucheck.STAGES)
    assert {s["status"] for s in stages.values()} <= {"passed", "skipped"}
    assert all(s["skip_reason"] for s in stages.values() if s["status"] == "skipped")
    assert stages["environment"]["simulator"] is True and stages["environment"]["gpu"] == "CUDA simulator"
    # on the simulator the gpu-marked tests run and skip themselves; the benchmark says it needs a GPU
    assert stages["gpu_tests"]["tests"] == stages["gpu_tests"]["skipped"] > 0
    assert "NUMBA_ENABLE_CUDASIM" in stages["kernel_bench"]["skip_reason"]


def test_training_is_bit_identical_and_byte_exact_against_the_meta_plan(dry):
    _, _, report = dry
    nets = {k: v for k, v in report["stages"]["training"].items() if isinstance(v, dict)}
    assert set(nets) == {label for label, _, _ in gpucheck.DRY.nets}
    for runs in nets.values():
        assert runs["bit_identical"] is True
        assert runs["baseline"]["losses"] == runs["superneurons"]["losses"]
        for name in gpucheck.CONFIGS:
            r = runs[name]
            assert len(r["losses"]) == gpucheck.DRY.steps
            assert r["arena_bytes"] == r["planned_arena_bytes"] > 0
            assert r["peak_bytes"] == r["planned_peak_bytes"] > 0
        assert runs["superneurons"]["peak_bytes"] < runs["baseline"]["peak_bytes"]


def test_the_streams_stage_measures_models_and_draws(dry):
    _, out, report = dry
    s = report["stages"]["streams"]
    assert set(s["measured"]["busy_ms"]) == {"compute", "copy_out", "copy_in"}
    assert s["modelled"]["copy_ms"] > 0 and isinstance(s["kernel_scale"], float)
    pytest.importorskip("matplotlib")
    assert s["png"] == "streams.png" and (out / "streams.png").stat().st_size > 0


@pytest.fixture
def one_net(monkeypatch):
    """The dry run with its first network only: what the failure tests need, in half the time."""
    monkeypatch.setattr(gpucheck, "DRY", dataclasses.replace(gpucheck.DRY, nets=gpucheck.DRY.nets[:1]))


def test_a_failing_stage_is_recorded_and_the_next_ones_still_run(tmp_path, monkeypatch, one_net):
    real = gpucheck.simulate

    def off_by_a_block(graph, config, **kw):  # a plan that disagrees with what the device held
        tr = real(graph, config, **kw)
        tr.steps[:] = [dataclasses.replace(s, counted_bytes=s.counted_bytes + 1024) for s in tr.steps]
        return tr

    monkeypatch.setattr(gpucheck, "simulate", off_by_a_block)
    status = gpucheck.main(["--out", str(tmp_path), "--dry-run", "--skip", "gpu_tests", "--skip", "streams"])
    stages = json.loads((tmp_path / "gpucheck.json").read_text())["stages"]
    assert status == 1
    assert stages["training"]["status"] == "failed"
    assert "differ from the plan" in stages["training"]["error"]
    assert stages["training"]["tiny_lenet"]["bit_identical"] is True  # its figures are kept
    assert stages["kernel_bench"]["status"] == "skipped"  # ran after the failure
    assert stages["gpu_tests"] == {"status": "skipped", "reason": "--skip"}


def test_full_shapes_are_refused_on_the_simulator(capsys):
    with pytest.raises(SystemExit) as e:
        gpucheck.main(["--out", "unused"])
    assert e.value.code == 2
    assert "--dry-run" in capsys.readouterr().err


def test_copy_overlap_counts_only_time_while_compute_is_busy():
    events = [dict(stream=s, start_ms=a, end_ms=b) for s, a, b in
              [("compute", 0, 4.0), ("compute", 3.0, 10.0), ("copy_out", 5.0, 15.0), ("copy_in", 20, 22)]]
    f = gpucheck._stream_figures(events)
    assert f["busy_ms"] == {"compute": 11.0, "copy_out": 10.0, "copy_in": 2.0}
    assert f["copy_ms"] == 12.0 and f["copy_overlapped"] == pytest.approx(5.0 / 12.0)
    assert gpucheck._stream_figures([])["copy_overlapped"] is None


def test_weights_that_drift_under_superneurons_fail_the_training_stage(tmp_path, monkeypatch, one_net):
    class Drifting(gpucheck.Model):
        def step(self, x, labels, **kw):
            loss = super().step(x, labels, **kw)
            if self.config.cache and self.device.has_data:  # superneurons() only: one weight moves a little
                params = self.params
                params[self.learnable[0]] = params[self.learnable[0]] * 1.0000001
                self.set_params(params)
            return loss

    monkeypatch.setattr(gpucheck, "Model", Drifting)
    report = gpucheck.run(tmp_path, dry_run=True, skip=set(gpucheck.STAGES) - {"training"})
    training = report["stages"]["training"]
    assert training["status"] == "failed" and "changed the losses or the weights" in training["error"]
    assert training["tiny_lenet"]["bit_identical"] is False
