"""The Chrome trace export (snlite plan --chrome-trace): read back as a viewer reads it, every kernel
and copy of the program on its stream's track, in program order, never overlapping on one track,
and the memory counter equal to what the program holds at each launch."""
import json

import pytest

from snlite import chrome_trace, timing
from snlite.cli import main
from snlite.config import MemoryConfig
from snlite.models import get_model
from snlite.pipeline import place
from snlite.program import STREAMS, Alloc, Copy, Free, Launch


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    graph = get_model("lenet", batch=8)
    program = place(graph, MemoryConfig(liveness=True, offload=True, recompute="cost_aware"))
    tl = timing.estimate(program, graph, "H200")
    path = tmp_path_factory.mktemp("trace") / "lenet.json"
    chrome_trace.write(str(path), chrome_trace.chrome_trace(tl, "lenet", chrome_trace.held_bytes(program)))
    return program, tl, json.loads(path.read_text())


def test_every_kernel_and_copy_is_on_its_streams_track_in_program_order(exported):
    program, tl, trace = exported
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert [names[k] for k in sorted(names)] == list(STREAMS)
    shown = [(names[e["tid"]], e["name"]) for e in events if e["ph"] == "X"]
    expected = [(ins.stream, f"{ins.layer} {ins.phase}") if isinstance(ins, Launch)
                else (ins.stream, f"{ins.tensor} ({ins.why})")
                for ins in program.body if isinstance(ins, (Launch, Copy))]
    assert shown == expected
    assert {"compute", "copy_out", "copy_in"} <= {s for s, _ in shown}  # offload: copies both ways
    for tid in names:  # a stream runs one thing at a time
        track = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X" and e["tid"] == tid]
        assert all(round(a[1], 3) <= b[0] for a, b in zip(track, track[1:])), names[tid]
        assert all(0 <= start <= end <= tl.step_ms * 1000 + 1e-3 for start, end in track)


def test_the_memory_counter_is_what_the_program_holds_at_each_launch(exported):
    program, _, trace = exported
    held = sum(ins.nbytes for ins in program.setup if isinstance(ins, Alloc) and ins.space == "arena")
    in_use, expected = held, []
    for ins in program.body:
        if isinstance(ins, Alloc) and ins.space == "arena":
            in_use += ins.nbytes
        elif isinstance(ins, Free) and ins.space == "arena":
            in_use -= ins.nbytes
        elif isinstance(ins, Launch) and ins.op >= 0:
            expected.append(in_use)
    counter = [e["args"]["bytes"] for e in trace["traceEvents"] if e["ph"] == "C"]
    assert counter == expected and held > 0 and max(counter) <= program.arena_bytes


def test_no_span_ends_after_the_next_on_its_track_begins_not_even_by_rounding():
    """Start and duration were rounded apart: on AlexNet at batch 64, 9 kernels ended a nanosecond after
    the next one on their stream began, which a viewer shows nested."""
    graph = get_model("alexnet", batch=64)
    program = place(graph, MemoryConfig.superneurons(budget_bytes=700 * 2**20, fit="offline"))
    trace = chrome_trace.chrome_trace(timing.estimate(program, graph, "H200"), "alexnet")
    for tid in {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}:
        track = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
                       if e["ph"] == "X" and e["tid"] == tid)
        assert all(round(a[1], 3) <= b[0] for a, b in zip(track, track[1:])), tid


def test_plan_writes_the_trace_and_refuses_a_path_it_cannot_write(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main(["plan", "lenet", "--batch", "4", "--liveness", "--chrome-trace", str(path)]) == 0
    assert f"timeline written to {path}" in capsys.readouterr().out
    assert {e["ph"] for e in json.loads(path.read_text())["traceEvents"]} == {"M", "X", "C"}
    assert main(["plan", "lenet", "--chrome-trace", str(tmp_path / "missing" / "t.json")]) != 0
    assert "--chrome-trace" in capsys.readouterr().err


def test_train_writes_one_step_and_a_measured_step_beside_it(tmp_path, capsys):
    path = tmp_path / "step.json"
    argv = ["train", "lenet", "--data", "synthetic", "--device", "host", "--epochs", "1", "--limit", "32",
            "--batch", "16", "--liveness", "--chrome-trace", str(path)]
    assert main(argv) == 0 and f"timeline written to {path}" in capsys.readouterr().out
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {1} and sum(e["ph"] == "X" for e in events) > 0
    measured = [{"stream": "compute", "label": "conv1 forward", "start_ms": 0.5, "end_ms": 0.75}]
    trace = chrome_trace.chrome_trace(timing.Timeline("H200"), "t", measured=measured)
    (event,) = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert event == {"ph": "X", "name": "conv1 forward", "cat": "measured", "pid": 2, "tid": 1, "ts": 500.0,
                     "dur": 250.0}


def test_the_timeline_s_memory_panel_and_plan_s_json_say_what_the_chrome_trace_says(tmp_path, monkeypatch,
                                                                                    capsys):
    """plan --timeline drew the walk's bytes without what the setup holds all iteration (the weights:
    430 MiB where the plan peaks at 668 MiB), under "device MiB"; plan --json had none of the time the
    text prints."""
    from snlite import plot

    drawn = {}
    monkeypatch.setattr(plot, "plot_streams", lambda events, path, **kw: drawn.update(kw))
    trace_path, json_path = tmp_path / "t.json", tmp_path / "p.json"
    argv = ["plan", "lenet", "--batch", "8", "--liveness", "--offload", "--timeline", str(tmp_path / "t.png"),
            "--chrome-trace", str(trace_path), "--json", str(json_path)]
    assert main(argv) == 0
    events = json.loads(trace_path.read_text())["traceEvents"]
    counter = [e["args"]["bytes"] for e in events if e["ph"] == "C"]
    assert max(b for _, b in drawn["memory"]) == max(counter)
    data, out = json.loads(json_path.read_text()), capsys.readouterr().out
    time = data["time"]
    assert f"step {time['step_ms']:,.2f} ms ({time['kernel_launches']:,d} kernel launches)" in out
    assert f"exposed {time['exposed_transfer_ms']:,.2f} ms, overlap {time['overlap']:.0%}" in out
