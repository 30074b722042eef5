"""The checker trusts no number of a program (snlite.validate): a saved program edited by hand so
that its sizes, offsets, streams or names contradict the rest of it (or the net it was planned for) is
refused, through ``check()`` and through ``snlite check`` (one line, exit 1), where before each of
these edits was certified "no races" or crashed the checker; and the executor refuses to run an
Alloc, Free or copy whose numbers differ from the views it uses."""
import dataclasses
import functools
import json
import re

import numpy as np
import pytest

from nets import data_for, mixed_net
from snlite import cli
from snlite.checker import ProgramError, check, find_races
from snlite.config import MemoryConfig
from snlite.graph import Graph
from snlite.models import get_model, lenet
from snlite.pipeline import place
from snlite.program import Alloc, Copy, Free, Launch, Program, Record, Wait
from snlite.train import Model

GRAPH = get_model("lenet", batch=4)
CONFIGS = {"pool": MemoryConfig(liveness=True, offload=True),
           "raw": MemoryConfig(liveness=True, offload=True, allocator="raw"),
           "recompute": MemoryConfig(liveness=True, recompute="memory")}  # a training step: stats count it


@functools.cache
def saved(name: str) -> dict:
    """The program of GRAPH under CONFIGS[name], as JSON, planned on first use rather than at import: in
    a student copy the planner's assignment stubs would otherwise stop the collection of every test."""
    return place(GRAPH, CONFIGS[name], "train" if name == "recompute" else "grads").to_json()


def _find(body, name, where=lambda f: True, start=0):
    return next(i for i, (n, f) in enumerate(body) if i >= start and n == name and where(f))


# ------------------------------------------------------------------------- edits, as a person would make them
def unknown_stream(data):
    data["body"][_find(data["body"], "Record")][1][1] = "gpu7"


def unknown_wait_stream(data):
    data["body"][_find(data["body"], "Wait")][1][1] = "copy_sideways"


def small_arena(data):
    data["arena_bytes"] = 1024


def no_slab(data):
    data["slab_bytes"] = 0


def negative_copy(data):
    data["body"][_find(data["body"], "Copy")][1][6] = -5


def a_reason_of_the_other_way(data):
    i = next(k for k, ins in enumerate(data["body"]) if ins[0] == "Copy" and ins[1][1] == "offload")
    data["body"][i][1][1] = "prefetch"  # a device -> host copy said to bring a tensor back


def negative_dimension(data):
    data["tensors"]["conv1"][0][1] = -20


def unknown_layer(data):
    data["body"][_find(data["body"], "Launch", lambda f: f[2] == "conv2")][1][2] = "conv9"


def unknown_tensor(data):
    i = _find(data["body"], "Launch", lambda f: f[2] == "ip1" and f[3] == "backward")
    data["body"][i][1][9] = ["ip1.ghost"]  # accumulate: summed into the output gradient first


def shrunk_alloc_with_a_live_tensor_in_its_tail(data):
    """x's allocation (and its free) shrunk by y's size, and y, allocated while x is live, moved into
    the tail cut off: the ranges the race checker sees no longer overlap, but x's view still covers y."""
    body = data["body"]
    copied = {f[0] for n, f in body if n in ("Copy", "HandOver")} | {f[1] for n, f in body if n == "HandOver"}

    def free_of(tensor, start):
        return next(j for j in range(start, len(body)) if body[j][0] == "Free"
                    and body[j][1][:2] == [tensor, "arena"])

    for i, (name, f) in enumerate(body):
        if name != "Alloc" or f[1] != "arena" or f[0] in copied:
            continue
        j = free_of(f[0], i)
        k = next((k for k in range(i + 1, j) if body[k][0] == "Alloc" and body[k][1][1] == "arena"
                  and body[k][1][3] < f[3] and body[k][1][0] not in copied), None)
        if k is None:
            continue
        y, size = body[k][1][0], body[k][1][3]
        f[3] -= size
        body[j][1][3] -= size
        body[k][1][2] = body[free_of(y, k)][1][2] = f[2] + f[3]
        return
    raise AssertionError("no allocation to shrink")


def wrong_free_size(data):
    data["body"][_find(data["body"], "Free", lambda f: f[1] == "arena")][1][3] += 1024


def copy_at_another_tensors_offset(data):
    """The offload copies from the start of a weight's block (live all along, never written by a grads
    program, large enough that the copy stays inside it) rather than from its own tensor's."""
    i = _find(data["body"], "Copy", lambda f: f[1] == "offload")
    copy = data["body"][i][1]
    weight = next(f for n, f in data["setup"] if f[3] >= copy[6] and data["tensors"][f[0]][2] == "weight")
    copy[3] = weight[2]


def unaligned_offset(data):
    """The allocation at the top of the arena moved up by 4 bytes (with its free and copies; the arena
    one block larger): it overlaps nothing, but the view's offset is not a whole number of blocks."""
    body = data["body"]
    i = _find(body, "Alloc", lambda f: f[1] == "arena" and f[2] + f[3] == data["arena_bytes"])
    tensor = body[i][1][0]
    for name, g in body[i:]:
        if g[0] == tensor and name in ("Alloc", "Free") and g[1] == "arena":
            g[2] += 4
        if g[0] == tensor and name == "Copy":
            g[3 if g[2] == "arena" else 5] += 4
    data["arena_bytes"] += 1024


def stats(**edits):
    def edit(data):
        assert set(edits) <= set(data["stats"]) | {"bogus"}
        data["stats"].update({k: v(data["stats"].get(k)) if callable(v) else v for k, v in edits.items()})
    return edit


def reused_raw_handle(data):
    body = data["body"]
    i = _find(body, "Alloc", lambda f: f[1] == "raw")
    j = _find(body, "Alloc", lambda f: f[1] == "raw", i + 1)
    body[j][1][2] = body[i][1][2]  # while the first still holds it


def small_raw_allocation(data):
    body = data["body"]
    body[_find(body, "Alloc", lambda f: f[1] == "raw" and f[3] > 256)][1][3] = 256


def launch_field(field: int, value, where=lambda f: True):
    """An edit setting field ``field`` of the first Launch (of those ``where`` picks) to ``value``."""
    def edit(data):
        body = data["body"]
        body[_find(body, "Launch", where)][1][field] = value
    return edit


def huge_arena(data):
    data["arena_bytes"] = 2**63


CASES = {  # name -> (edit, the saved program it edits, what the refusal says)
    "a record on a stream that does not exist": (unknown_stream, "pool", r"stream 'gpu7' is not one of"),
    "a wait on a stream that does not exist": (unknown_wait_stream, "pool",
                                               r"stream 'copy_sideways' is not one of"),
    "arena_bytes 1024": (small_arena, "pool", r"past arena_bytes 1,024; arena_bytes should be at least"),
    "slab_bytes 0": (no_slab, "pool", r"past slab_bytes 0; slab_bytes should be at least"),
    "a copy of -5 bytes": (negative_copy, "pool", r"nbytes -5, but \w+ has [\d,]+ bytes"),
    "a copy out for a reason of copies in": (a_reason_of_the_other_way, "pool",
                                             r"reason 'prefetch' is a copy to the device, but this one goes "
                                             r"device -> host"),
    "a negative dimension": (negative_dimension, "pool",
                             r"tensor conv1: shape \(4, -20, .*positive integers"),
    "a launch of a layer the net does not have": (unknown_layer, "pool",
                                                  r"layer 'conv9' is not a layer of lenet"),
    "a tensor name the program does not know": (unknown_tensor, "pool",
                                                r"ip1.ghost is not a tensor of the program"),
    "a shrunken alloc with a live tensor in its tail": (shrunk_alloc_with_a_live_tensor_in_its_tail, "pool",
                                                         r"nbytes [\d,]+ should be at least [\d,]+"),
    "a free of the wrong size": (wrong_free_size, "pool", r"but \S+'s allocation is offset"),
    "a copy at another tensor's offset": (copy_at_another_tensors_offset, "pool",
                                          r"arena offset 0x\w+, but \S+'s block is at"),
    "an unaligned offset": (unaligned_offset, "pool", r"offset 0x\w+ is not a multiple of 1024"),
    "a raw allocation smaller than its tensor": (small_raw_allocation, "raw",
                                                 r"nbytes 256 should be at least"),
    "a raw handle still held": (reused_raw_handle, "raw", r"handle \d+ is still held by"),  # main: "overlaps"
    # what the placement counted without an instruction: trace_program reported these edits as measured
    "cache hits that are a word": (stats(cache_hits="x"), "pool",
                                   r"stats: cache_hits \(the cache's hits\) is 'x', not a count >= 0"),
    "negative cache misses": (stats(cache_misses=-5), "pool", r"stats: cache_misses .* is -5, not a count"),
    "a count of something else": (stats(bogus=1), "pool", r"stats: 'bogus' is not one of \('cache_hits'"),
    "an optimizer state elsewhere": (stats(optimizer_state="disk"), "pool",
                                     r"stats: optimizer_state is 'disk', not 'device' or 'host'"),
    "one recomputation more than launched": (stats(recompute_count=lambda n: n + 1), "recompute",
                                             r"stats: recompute_count is (\d+), but the body's recompute "
                                             r"launches make it (?!\1)\d+"),
    "twice the recomputed FLOPs": (stats(extra_flops=lambda n: 2 * n), "recompute",
                                   r"stats: extra_flops is [\d,]+, but the body's recompute launches"),
    # `snlite check` passed these: an op index no launch has, an algorithm no kernel has, 2**100 bytes
    "a launch of op -3": (launch_field(0, -3), "pool", r"op -3 should be its op's index \(>= 0\), or -1"),
    "a conv algorithm that does not exist": (launch_field(10, [["forward", "nope", 1, 0]], lambda f: f[10]),
                                             "pool", r"convs holds .*'nope'.*: a conv op is one of"),
    "an arena of 2**63 bytes": (huge_arena, "pool",
                                r"arena_bytes is 9223372036854775808; .* less than 2\*\*63"),
}


def _edited(name):
    edit, base, _ = CASES[name]
    data = json.loads(json.dumps(saved(base)))
    edit(data)
    return data


@pytest.mark.parametrize("name", CASES)
def test_check_refuses_the_edit_in_one_line(name):
    with pytest.raises(ProgramError, match=CASES[name][2]) as e:
        check(Program.from_json(_edited(name)), graph=GRAPH)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(("setup #", "body #", "tensor ", "stats: ", "arena_bytes "))


@pytest.mark.parametrize("name", CASES)
def test_snlite_check_refuses_the_edit_in_one_line_with_exit_1(name, capsys, tmp_path):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(_edited(name)))
    code = cli.main(["check", str(path)])
    out = capsys.readouterr()
    assert code == 1 and out.err == "", out.err
    assert out.out.count("\n") == 1 and out.out.startswith(f"{path}: a malformed program: "), out.out
    assert re.search(CASES[name][2], out.out)


def test_the_unedited_programs_pass_and_say_what_they_were_checked_against(capsys, tmp_path):
    for base in CONFIGS:
        data = saved(base)
        check(Program.from_json(data), graph=GRAPH)
        path = tmp_path / f"{base}.json"
        path.write_text(json.dumps(data))
        assert cli.main(["check", str(path)]) == 0
        out = capsys.readouterr().out
        assert "checked against the zoo's lenet at batch 4" in out and "no races" in out
    g = mixed_net()
    place(g, MemoryConfig.superneurons()).save(tmp_path / "mixed.json")
    assert cli.main(["check", str(tmp_path / "mixed.json")]) == 0
    assert "checked without the net ('mixed' is not a zoo model)" in capsys.readouterr().out


def test_a_zoo_net_with_another_head_or_another_net_of_its_name_is_no_malformed_program(capsys, tmp_path):
    """A LeNet of 5 classes was "a malformed program: tensor ip2: ((64, 5)...) in the program, but ((64,
    10)...) in lenet", and a net of one's own named lenet "lenet has no such tensor": the first is checked
    against the zoo's LeNet of 5 classes (so an edit of it is still caught), the second without the net."""
    five = place(lenet(batch=4, num_classes=5), CONFIGS["pool"], "grads").to_json()
    (tmp_path / "five.json").write_text(json.dumps(five))
    assert cli.main(["check", str(tmp_path / "five.json")]) == 0
    assert "checked against the zoo's lenet at batch 4, 5 classes" in capsys.readouterr().out
    five["tensors"]["conv1.weight"][0][0] = 21  # (20, 1, 5, 5) edited
    (tmp_path / "five.json").write_text(json.dumps(five))
    assert cli.main(["check", str(tmp_path / "five.json")]) == 1
    assert "conv1.weight" in capsys.readouterr().out
    g = Graph(input_shape=(4, 1, 28, 28), num_classes=10, name="lenet")  # the zoo's input, not its layers
    g.softmax_loss(g.linear(g.flatten(g.relu(g.conv2d(g.input(), 4, 3, name="mine"))), 10, name="head"))
    place(g, MemoryConfig.superneurons()).save(tmp_path / "other.json")
    assert cli.main(["check", str(tmp_path / "other.json")]) == 0
    assert "checked without the net (most tensors of the zoo's lenet are not in it" in capsys.readouterr().out


def test_a_copy_goes_to_a_slot_made_for_its_tensor():
    """x's copy into y's pinned slot: inside a live allocation, so the race search alone took it (the
    dataflow check refuses it later only if something reads x back from its own slot)."""
    tensors = {"x": ((256,), "float32", "activation"), "y": ((256,), "float32", "activation")}
    write = Launch(0, 0, "a", "forward", "compute", (), ("x", "y"))
    body = (Alloc("x", "arena", 0, 1024), Alloc("y", "arena", 1024, 1024), Alloc("x", "slab", 0, 1024),
            Alloc("y", "slab", 1024, 1024), write, Record("e", "compute"), Wait("e", "copy_out"),
            Copy("x", "offload", "arena", 0, "slab", 1024, 1024, "copy_out"))
    program = Program("tiny", "by hand", "infer", "pool", tensors, (), body, 2048, 2048)
    with pytest.raises(ProgramError, match=r"body #7 .*slab offset 0x400 is not the start of a live pinned "
                                           r"slot made for x \(its slots: x at 0x0\)"):
        find_races(program, iterations=1)


def test_the_graph_is_compared_only_when_given():
    data = _edited("a launch of a layer the net does not have")
    find_races(Program.from_json(data))  # without the net, a layer name is only a name
    other = get_model("lenet", batch=8)
    with pytest.raises(ProgramError, match=r"tensor data: \(\(4, 1, 28, 28\).*\(8, 1, 28, 28\)"):
        find_races(Program.from_json(saved("pool")), graph=other)


def test_a_file_that_is_not_a_program_is_one_line_too(capsys, tmp_path):
    path = tmp_path / "bad.json"
    for text in ("{not json", '{"format": "snlite-program/1", "net": "x"}', "[1, 2]"):
        path.write_text(text)
        assert cli.main(["check", str(path)]) == 1
        out = capsys.readouterr()
        assert out.err == "" and out.out.count("\n") == 1 and "a malformed program: " in out.out
    data = json.loads(json.dumps(saved("pool")))
    data["tensors"] = [1, 2]  # from_json does not expect a list here
    path.write_text(json.dumps(data))
    assert cli.main(["check", str(path)]) == 1
    assert capsys.readouterr().out.count("\n") == 1


# ---------------------------------------------------------------------------- the executor
def test_the_executor_refuses_numbers_that_differ_from_its_views():
    """Run as the Model runs them (no check): an Alloc smaller than its view, a Free of another size, a
    copy of another size or from another offset, each stops the run at that instruction."""
    g = mixed_net()
    config = MemoryConfig(liveness=True, offload=True)
    program = place(g, config, "grads")
    x, labels = data_for(g)
    body = program.body
    alloc = next(i for i, ins in enumerate(body) if type(ins) is Alloc and ins.space == "arena"
                 and ins.nbytes > 1024)
    free = next(i for i, ins in enumerate(body) if type(ins) is Free and ins.space == "arena")
    copy = next(i for i, ins in enumerate(body) if type(ins) is Copy and ins.why == "offload")
    edits = {alloc: (dict(nbytes=body[alloc].nbytes - 1024), r"allocates [\d,]+ bytes, but \S+ takes"),
             free: (dict(nbytes=body[free].nbytes + 1024),
                    r"frees 0x\w+, [\d,]+ bytes, but \S+'s arena allocation"),
             copy: (dict(nbytes=body[copy].nbytes - 4), r"moves [\d,]+ bytes, but \S+ has"),
             -copy: (dict(src_offset=body[copy].src_offset + 1024),
                     r"copies arena 0x\w+, but \S+'s arena allocation")}
    for i, (fields, message) in edits.items():
        i = abs(i)
        mutant = body[:i] + (dataclasses.replace(body[i], **fields),) + body[i + 1:]
        model = Model(g, config, device="host", seed=4)
        model.programs["grads"] = dataclasses.replace(program, body=mutant)
        with pytest.raises(ProgramError, match=rf"body #{i} \(.*\): {message}"):
            model.step(x, labels, lr=0.1, momentum=0.9)
    model = Model(g, config, device="host", seed=4)
    assert np.isfinite(model.step(x, labels, lr=0.1, momentum=0.9))


def test_launches_of_the_planner_name_only_known_layers():
    program = place(GRAPH, CONFIGS["pool"])
    assert {i.layer for i in program.launches()} <= set(GRAPH.layers)
    assert any(isinstance(i, Launch) and i.accumulate == () for i in program.body)
