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
            ("fixed", [], "fixed() failed: fixed() missing 1 required positional argument: 'batch'; a NET "
                          "that is a function takes the batch first"),
            ("tiny", ["--input", "1x8x8"], "--input is a PyTorch NET's; "),
            ("tiyn", [], "defines no 'tiyn'; did you mean tiny?")]:
        code, out, err = run(capsys, "plan", f"{path}:{name}", *flags)
        assert code == 2 and words in err, (name, err)
