"""A NET that is a function in a file (``path/to/file.py:FUNCTION``): a network built with snlite's own
Graph builder, asked every question a zoo model is asked, on the command line. No torch needed."""
import json
import textwrap

from snlite import cli
from snlite.config import MemoryConfig
from snlite.pipeline import simulate

NETS = textwrap.dedent("""\
    from snlite import Graph


    def tiny(batch=8, width=8):
        g = Graph((batch, 1, 8, 8), num_classes=10, name="tiny")
        x = g.relu(g.conv2d(g.input(), width, 3, padding=1))
        g.softmax_loss(g.linear(g.flatten(g.maxpool(x, 2)), 10))
        return g


    def fixed(batch):
        return Graph((4, 1, 8, 8), num_classes=10)


    def nothing(batch=8):
        return None


    def broken(batch=8):
        return {}["width"] + len(batch)


    def leaves(batch=8):
        raise SystemExit(0)


    def stub(batch=8):
        raise NotImplementedError("Assignment 1: liveness analysis")


    def lossless(batch=8):
        g = Graph((batch, 1, 8, 8), num_classes=10)
        g.relu(g.input())
        return g
    """)


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_function_in_a_file_is_a_net_like_any_other(tmp_path, capsys):
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    net = f"{path}:tiny"
    code, out, err = run(capsys, "plan", net, "--batch", 4, "--torch-args", '{"width": 4}', "--json", "-")
    data = json.loads(out)
    assert code == 0 and data["net"] == net, err
    import importlib.util

    loaded = importlib.util.spec_from_file_location("nets_here", path)
    nets = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(nets)
    assert data["totals"]["peak_bytes"] == simulate(nets.tiny(4, width=4), MemoryConfig()).peak_bytes
    code, out, err = run(capsys, "plan", net)  # no --batch: the function's own default
    assert code == 0 and out.startswith("tiny, batch 8: 7 layers"), err
    code, out, err = run(capsys, "maxbatch", net, "--budget", "2MiB", "--max-batch", 256, "--json", "-")
    rows = json.loads(out)["rows"]
    assert code == 0 and all(r["batch"] for r in rows), err
    code, out, err = run(capsys, "train", net, "--data", "digits", "--epochs", 1, "--limit", 64,
                         "--batch", 16)
    assert code == 0 and "test accuracy" in out, err


def test_a_function_net_that_returns_the_wrong_thing_is_told_what_to_return(tmp_path, capsys):
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    for name, flags, words in [
            ("nothing", [], "nothing() returned NoneType, not an snlite Graph"),
            ("fixed", ["--batch", 2], "fixed(2) returned a Graph of batch 4: build its input of the batch "
                                      "given"),
            ("fixed", [], "fixed() failed: missing a required argument: 'batch'; a NET "
                          "that is a function takes the batch first"),
            ("tiny", ["--input", "1x8x8"], "--input is a PyTorch NET's; "),
            ("tiyn", [], "defines no 'tiyn'; did you mean tiny?")]:
        code, out, err = run(capsys, "plan", f"{path}:{name}", *flags)
        assert code == 2 and words in err, (name, err)


def test_an_error_in_the_functions_own_code_is_one_line_naming_it(tmp_path, capsys):
    """Whatever the user's function raises (a KeyError, a TypeError inside it, not blamed on its
    signature; a sys.exit, which must not become snlite's exit status), or the file itself on import:
    one line, exit 1, naming the NET; --traceback shows where."""
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    for name, words in [("broken", "broken(2) raised KeyError: 'width' (snlite --traceback ... shows where)"),
                        ("leaves", "leaves(2) called sys.exit(0)")]:
        code, out, err = run(capsys, "plan", f"{path}:{name}", "--batch", 2)
        assert code == 1 and f"{path}:{name}: {words}" in err and "Traceback" not in err, (name, err)
    code, out, err = run(capsys, "plan", f"{path}:stub", "--batch", 2)  # a student copy's stub: said as such
    assert code == 1 and "not written yet: Assignment 1" in err and "grade 1" in err, err
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    code, out, err = run(capsys, "plan", f"{exits}:tiny")
    assert code == 1 and "called sys.exit(3) as it was imported" in err, err


def test_a_graph_without_a_loss_and_a_file_that_is_no_python_are_said_as_such(tmp_path, capsys):
    path = tmp_path / "nets.py"
    path.write_text(NETS)
    code, out, err = run(capsys, "plan", f"{path}:lossless", "--batch", 2)
    assert code == 1 and "the graph has no softmax_loss layer" in err and "--recompute-keep" not in err, err
    text = tmp_path / "nets.txt"
    text.write_text(NETS)
    code, out, err = run(capsys, "plan", f"{text}:tiny")
    assert code == 2 and "nets.txt is a file, but not a Python one: name a .py file" in err, err
