"""The PyTorch memory snapshot export (snlite plan --memory-snapshot): plain data PyTorch's viewer
reads, whose events replay to the program's own memory, byte for byte; where torch is installed,
read back through torch's own ``_memory_viz`` functions."""
import io
import pickle
import pickletools

import pytest

from snlite import memory_snapshot
from snlite.cli import main
from snlite.config import MemoryConfig
from snlite.models import get_model
from snlite.pipeline import place
from snlite.program import Alloc
from snlite.search import min_budget
from snlite.trace import trace_program

BASE = memory_snapshot.BASE_ADDRESS


@pytest.fixture(scope="module")
def planned():
    graph = get_model("lenet", batch=8)
    tight = min_budget(graph).budget_bytes + 16 * 2**10  # 16 KiB over the smallest: the cache moves data
    program = place(graph, MemoryConfig.superneurons(budget_bytes=tight))
    assert trace_program(program, "all").d2h_bytes > 0
    buffer = io.BytesIO()
    pickle.dump(memory_snapshot.snapshot(program), buffer, protocol=4)
    return program, buffer.getvalue()


def test_the_events_replay_to_the_programs_memory(planned):
    program, raw = planned
    data = pickle.loads(raw)
    (trace,) = data["device_traces"]
    assert trace[0] == {"action": "segment_alloc", "addr": BASE, "size": program.arena_bytes, "stream": 0,
                        "time_us": 0, "frames": []}
    live, in_use, peak = {}, 0, 0
    for e in trace[1:]:
        assert BASE <= e["addr"] and e["addr"] + e["size"] <= BASE + program.arena_bytes
        if e["action"] == "alloc":
            assert not any(a < e["addr"] + e["size"] and e["addr"] < a + s for a, s in live.items()), e
            live[e["addr"]] = e["size"]
            in_use += e["size"]
            peak = max(peak, in_use)
        elif e["action"] == "free_requested":
            assert live.get(e["addr"]) == e["size"], e
        else:
            assert e["action"] == "free_completed" and live.pop(e["addr"]) == e["size"], e
            in_use -= e["size"]
    assert peak == trace_program(program, "all").peak_bytes
    held = {BASE + ins.offset: ins.nbytes for ins in program.setup
            if isinstance(ins, Alloc) and ins.space == "arena"}
    assert live == held  # the next iteration starts with the persistent tensors, as the program does
    (segment,) = data["segments"]
    blocks = segment["blocks"]
    assert blocks[0]["address"] == BASE and sum(b["size"] for b in blocks) == segment["total_size"]
    assert all(a["address"] + a["size"] == b["address"] for a, b in zip(blocks, blocks[1:]))
    assert {b["address"]: b["size"] for b in blocks if b["state"] == "active_allocated"} == held
    assert segment["allocated_size"] == sum(held.values())


def test_a_block_is_freed_under_the_name_it_was_allocated_under(planned):
    """An in-place write hands a block to another tensor (HandOver), which the snapshot skipped: the
    viewer showed fc8.grad's lifetime as the softmax output's, an activation where it is a gradient."""
    program, raw = planned
    (trace,) = pickle.loads(raw)["device_traces"]
    owner = {}
    for e in trace[1:]:
        name = e["frames"][0]["name"]
        if e["action"] == "alloc":
            owner[e["addr"]] = name
        elif e["action"] == "free_completed":
            assert owner.pop(e["addr"]) == name, (e["addr"], name)
    handed = sum(type(ins).__name__ == "HandOver" for ins in program.body)
    assert handed > 0, "the program hands blocks over in place: the case this checks"


def test_the_file_is_plain_python_data_pickled_with_protocol_4(planned):
    _, raw = planned
    ops = list(pickletools.genops(raw))
    assert ops[0][0].name == "PROTO" and ops[0][1] == 4
    assert not [op for op, _, _ in ops if op.name in ("GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD")], \
        "only dicts, lists, strings and numbers: the viewer unpickles without snlite"
    events = pickle.loads(raw)["device_traces"][0]
    assert {"alloc", "free_requested", "free_completed"} <= {e["action"] for e in events}
    assert any("(activation)" in e["frames"][0]["name"] for e in events[1:])


def test_torchs_own_memory_viz_reads_it(planned):
    viz = pytest.importorskip("torch.cuda._memory_viz", reason="torch is not installed (its exchange extra)")
    program, raw = planned
    data = pickle.loads(raw)
    text = viz.trace(data)
    assert "cudaMalloc" in text and "MEM[" not in text  # every allocation inside the arena's segment
    held = sum(ins.nbytes for ins in program.setup if isinstance(ins, Alloc) and ins.space == "arena")
    kept = viz.filter_alloc_free_pairs(pickle.loads(raw))["device_traces"][0]
    assert sum(e["size"] for e in kept if e["action"] == "alloc") == held
    assert "snapshot.pickle" in viz.trace_plot(data)


def test_plan_writes_it_and_refuses_the_raw_allocator_before_any_work(tmp_path, capsys):
    path = tmp_path / "lenet.pickle"
    assert main(["plan", "lenet", "--batch", "4", "--liveness", "--memory-snapshot", str(path)]) == 0
    assert f"memory snapshot written to {path}" in capsys.readouterr().out
    assert pickle.loads(path.read_bytes())["segments"][0]["total_size"] > 0
    assert main(["plan", "lenet", "--allocator", "raw", "--memory-snapshot", str(tmp_path / "r.pickle")]) != 0
    assert "--allocator raw" in capsys.readouterr().err and not (tmp_path / "r.pickle").exists()


def test_the_segment_tiles_the_arena_with_the_gaps_inactive(planned):
    program, _ = planned
    seg = memory_snapshot._segment(program, {0: ("conv1", 1024), 4096: ("relu1", 2048)})
    assert [(b["address"] - BASE, b["size"], b["state"]) for b in seg["blocks"]] == [
        (0, 1024, "active_allocated"), (1024, 3072, "inactive"), (4096, 2048, "active_allocated"),
        (6144, program.arena_bytes - 6144, "inactive")]
    assert seg["allocated_size"] == 3072


def test_train_writes_one_steps_memory(tmp_path, capsys):
    path = tmp_path / "step.pickle"
    argv = ["train", "lenet", "--data", "synthetic", "--device", "host", "--epochs", "1", "--limit", "32",
            "--batch", "16", "--liveness", "--memory-snapshot", str(path)]
    assert main(argv) == 0 and f"memory snapshot written to {path}" in capsys.readouterr().out
    events = pickle.loads(path.read_bytes())["device_traces"][0]
    assert events[0]["action"] == "segment_alloc" and sum(e["action"] == "alloc" for e in events) > 10
