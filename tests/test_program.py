"""Programs are plain data: they print as a table, round-trip through JSON, diff, and a corrupt file
is a clear error; the CLI prints, saves and checks them."""
import json

import pytest

from nets import mixed_net
from snlite import cli
from snlite.config import MemoryConfig
from snlite.models import lenet
from snlite.pipeline import place
from snlite.program import Alloc, Copy, HostWait, Launch, Program, Wait


@pytest.fixture(scope="module")
def program():
    return place(mixed_net(), MemoryConfig.superneurons(cache=False))


def test_the_table_shows_every_instruction_with_its_stream(program):
    table = program.table()
    lines = table.splitlines()
    assert len(lines) == len(program.body) + 2 and "instructions, arena" in lines[0]
    assert any("copy_out  copy conv2 device -> host (offload" in line for line in lines)
    assert any("compute   wait for" in line and "(release)" in line for line in lines)
    assert any("launch conv1 forward (op 1); forward " in line for line in lines)
    assert program.table(limit=5, start=10).splitlines()[-1] == \
        f"... {len(program.body) - 15:,d} more instructions"
    assert sum(isinstance(i, HostWait) for i in program.body) == 1, "one host wait: the end of the iteration"


def test_json_round_trips_exactly_and_diffs_are_readable(program, tmp_path):
    path = tmp_path / "p.json"
    program.save(path)
    again = Program.load(path)
    assert again == program and again.table() == program.table()
    assert program.diff(again) == ""
    with_workspace = place(lenet(batch=8), MemoryConfig(liveness=True, workspace="fastest"))
    assert any(shape is None for shape, _, kind in with_workspace.tensors.values() if kind == "workspace")
    with_workspace.save(path)
    assert Program.load(path) == with_workspace, "a conv workspace (sized by its Alloc) round-trips too"
    k = next(i for i, ins in enumerate(program.body) if isinstance(ins, Wait) and ins.why == "release")
    diff = program.diff(program.without(k))
    assert f"-{k:>6}  compute   wait for" in diff and "(release)" in diff
    other = place(mixed_net(), MemoryConfig(liveness=True))
    assert "+" in program.diff(other) and "-" in program.diff(other)


@pytest.mark.parametrize("text,message", [
    ("{not json", "not JSON"),
    ('{"format": "something else"}', "not an snlite program"),
    ('{"net": "lenet", "batch": 2, "totals": {}}',
     "not an snlite program: the numbers snlite plan --json writes"),
    ("[1, 2]", "not an snlite program"),
    # each said by its field, not a KeyError: 'config' or an AttributeError as before
    ('{"format": "snlite-program/1", "net": "x"}',
     r"a corrupt snlite program: it has no 'config' \(what the configuration was called\)"),
    ('{"format": "snlite-program/1", "net": "x", "config": "", "mode": "train", "allocator": "pool", '
     '"tensors": [], "setup": [], "body": [], "arena_bytes": 0, "slab_bytes": 0}',
     r"a corrupt snlite program: 'tensors' is a list, not an object"),
    ('{"format": "snlite-program/1", "net": ["x"], "config": "", "mode": "train", "allocator": "pool"}',
     r"a corrupt snlite program: 'net' is a list, not text \(the net's name\)"),
    ('{"format": "snlite-program/1", "net": "x", "config": "", "mode": "train", "allocator": "pool", '
     '"tensors": {}, "setup": [["Alloc", ["x", "arena", 0]]], "body": [], "arena_bytes": 0, "slab_bytes": 0, '
     '"stats": {}}',
     r"a corrupt snlite program: setup #0: Alloc takes the fields \(tensor, space, offset, nbytes, stream\), "
     r"got 3 values"),
    ('{"format": "snlite-program/1", "net": "x", "config": "", "mode": "train", "allocator": "pool", '
     '"tensors": {}, "setup": [], "body": [null], "arena_bytes": 0, "slab_bytes": 0, "stats": {}}',
     r"a corrupt snlite program: body #0 is None, not \[INSTRUCTION, \[field, ...\]\]"),
    ('{"format": "snlite-program/1", "net": "x", "arena_bytes": 1' + "0" * 5000 + "}",
     "not JSON snlite reads"),
    ('{"format": "snlite-program/2"}',
     r"an snlite program of another format, 'snlite-program/2'; this snlite reads 'snlite-program/1': plan "
     r"it again here \(snlite plan NET"),
])
def test_a_corrupt_file_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        Program.load(path)


@pytest.mark.parametrize("field,value", [("arena_bytes", 1e15), ("arena_bytes", 6410240.7),
                                         ("slab_bytes", "6410240"), ("stats", None)])
def test_a_header_number_is_read_as_written_and_stats_are_not_optional(field, value):
    """int() made 1e15, 6410240.7 and "6410240" numbers that looked right (a petabyte arena reached the
    memory snapshot); a program without its stats skipped the check of its recomputation count."""
    data = place(mixed_net(), MemoryConfig(liveness=True)).to_json()
    if value is None:
        del data[field]
    else:
        data[field] = value
    said = ("it has no 'stats'" if value is None else
            f"'{field}' is {'text' if isinstance(value, str) else 'a number'} {json.dumps(value)}, not "
            "a whole number")
    with pytest.raises(ValueError, match="a corrupt snlite program: " + said):
        Program.from_json(data)


def test_a_binary_file_is_a_clear_error_too(tmp_path):
    """A memory snapshot (a pickle) given for a program: a bare UnicodeDecodeError before."""
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(b"\x80\x04\x95 not text")
    with pytest.raises(ValueError, match=r"snapshot.pickle: not text \(a binary file\) .*--save-program"):
        Program.load(path)


def test_an_unknown_instruction_is_named(program, tmp_path):
    data = program.to_json()
    data["body"][3] = ["Teleport", ["x"]]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown instruction 'Teleport'"):
        Program.load(path)


def test_programs_hold_what_the_executor_needs(program):
    assert program.mode == "train" and program.allocator == "pool"
    assert {type(i) for i in program.setup} == {Alloc}
    launches = list(program.launches())
    assert [i.op for i in launches if i.phase != "update"] == \
        sorted(i.op for i in launches if i.phase != "update")
    assert {i.phase for i in program.without_updates().launches()} == {"forward", "backward", "recompute"}
    assert program.spec("relu1#r1") == program.spec("relu1")
    for ins in program.body:
        if isinstance(ins, Launch):
            assert ins.stream == "compute"
        if isinstance(ins, Copy):
            assert ins.stream == ("copy_out" if ins.to_host else "copy_in")


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_prints_saves_and_checks_programs(capsys, tmp_path):
    path = tmp_path / "lenet.json"
    code, out, _ = _run(capsys, "plan", "lenet", "--batch", 4, "--preset", "superneurons", "--program",
                        "--save-program", path)
    assert code == 0
    assert "memory needed: device arena " in out and "pinned host memory" in out
    assert "host waits for" in out and "race checker: no races over two iterations" in out
    assert f"program saved to {path}" in out
    code, out, _ = _run(capsys, "check", path)
    assert code == 0 and "no races over two iterations" in out
    data = json.loads(path.read_text())
    k = next(i for i, (name, fields) in enumerate(data["body"]) if name == "Wait" and fields[2] == "landed")
    del data["body"][k]
    path.write_text(json.dumps(data))
    code, out, _ = _run(capsys, "check", path)
    assert code == 1 and "race on " in out and "nothing orders the second after the first" in out
    code, _, err = _run(capsys, "check", tmp_path / "missing.json")
    assert code == 1 and "no such file" in err
    code, _, err = _run(capsys, "plan", "lenet", "--save-program", tmp_path / "no" / "such" / "dir.json")
    assert code == 1 and "its folder does not exist" in err
