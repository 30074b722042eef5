"""The commands' limits and bad input, refused before any work: a name that names nothing, an output
path that cannot be written or is given twice, a search's ceiling said out loud. The commands' own
behaviour is tests/test_cli.py's (demo, train) and tests/test_measure.py's (the planning commands)."""
import json
import re

import pytest

from nets import run
from snlite import cli


def test_a_batch_wider_than_a_grid_is_planned_not_refused(capsys):
    """65,536 images are more than grid z holds: the kernels launch them in parts, so the planner's
    cost estimate (kernels.conv.launch_counts) no longer fails."""
    code, out, err = run(capsys, "plan", "lenet", "--batch", "65536")
    assert code == 0 and "lenet, batch 65536" in out and not err, err


@pytest.mark.parametrize("argv,message", [
    (["plan", "lenett"], "unknown model 'lenett'; known: lenet, alexnet"),
    (["plan", "saved.json"], "'saved.json' is a file, not a network: a program saved by plan --save-program "
                             "is checked with snlite check saved.json"),
    (["compare", "resnet51"], "no bottleneck ResNet of depth 51: valid depths are 50, 101"),
    (["plan", "resnet18"], "ResNet-18 is built of basic blocks: import torchvision's (snlite plan "
                           "torchvision:resnet18"),
    (["maxbatch", "cifar_resnet21"], "no CIFAR ResNet of depth 21"),
    (["optimal", "nope"], "unknown model 'nope'"),
    (["train", "lenett", "--data", "synthetic"], "unknown model 'lenett'"),
    (["plan", "lenet", "--gpu", "X100"],
     "--gpu: unknown GPU profile 'X100'; choose one of H200, H100, A100, T4, K40"),
    (["compare", "lenet", "--gpu", ""], "--gpu: unknown GPU profile ''; choose one of"),
    (["train", "lenet", "--data", "imagenet"], "--data 'imagenet': expected one of synthetic"),
    (["train", "lenet", "--data", "mnist"], "--data 'mnist': expected one of"),
    (["plan", "lenet", "--liveness", "--recompute", "speed", "--recompute-keep", "foo"],
     "--recompute-keep: recompute_keep names 'foo' (no such layer); it takes cheap layers of lenet: "
     "pool1, pool2"),
    (["train", "lenet", "--data", "synthetic", "--liveness", "--recompute", "speed",
      "--recompute-keep", "foo"], "recompute_keep names 'foo'"),
])
def test_a_name_that_names_nothing_is_a_usage_error(argv, message, capsys, monkeypatch):
    """An unknown network, GPU profile, --data kind or --recompute-keep layer: exit 2, one line naming
    the value and listing the valid ones, before any planning or training."""
    from snlite import measure

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the bad name was refused")
    monkeypatch.setattr(measure, "measure", no_work)
    monkeypatch.setattr(cli, "Model", no_work)
    code, out, err = run(capsys, *argv)
    assert code == cli.EXIT_USAGE and len(err.strip().splitlines()) == 1 and message in err, err


def test_check_a_directory_says_it_is_one(tmp_path, capsys):
    code, _, err = run(capsys, "check", str(tmp_path))
    assert code == 1 and len(err.strip().splitlines()) == 1 and "a directory, not a program" in err, err
    assert "no such file" not in err


def test_check_and_save_say_an_empty_name_is_empty(capsys):
    code, _, err = run(capsys, "check", "")
    assert code == 1 and "an empty file name" in err and "no such file" not in err, err


@pytest.mark.parametrize("argv,message", [
    (["plan", "lenet", "--timeline", "{missing}/t.png"],
     "--timeline {missing}/t.png: its folder does not exist"),
    (["plan", "lenet", "--plot", "{missing}/p.png"], "--plot {missing}/p.png: its folder does not exist"),
    (["plan", "lenet", "--budget", "1KiB", "--json", "{missing}/x.json"],
     "--json {missing}/x.json: its folder"),
    (["plan", "lenet", "--save-program", "{tmp}"],
     "--save-program {tmp}: is a folder; give a file name in it, e.g. {tmp}/program.json"),
    (["plan", "lenet", "--plot", "{tmp}"], "--plot {tmp}: is a folder; give a file name in it, e.g. "
                                           "{tmp}/out.png"),
    (["compare", "lenet", "--plot", "{file}/p.png"], "--plot {file}/p.png: {file} is a file, not a folder"),
    (["maxbatch", "lenet", "--json", "{missing}/x.json"], "its folder does not exist"),
    (["maxdepth", "--json", "{missing}/x.json"], "its folder does not exist"),
    (["optimal", "lenet", "--plot", "{missing}/f.png"], "its folder does not exist"),
    (["train", "lenet", "--data", "synthetic", "--streams", "{missing}/s.png"], "--streams {missing}/s.png"),
    (["train", "lenet", "--data", "synthetic", "--save", "{tmp}"], "--save {tmp}: is a folder"),
    (["paper", "--quick", "--out", "{file}/sub"], "{file} is a file, so the folder cannot be created"),
    (["bench", "--out", "{file}/b"], "{file} is a file, so the folder cannot be created"),
    (["plan", "lenet", "--plot", "{tmp}/p.txt"], "--plot {tmp}/p.txt: a plot is written as PNG, SVG or PDF"),
    (["plan", "lenet", "--timeline", "{tmp}/t"], "--timeline {tmp}/t: a plot is written as PNG, SVG or PDF"),
    (["compare", "lenet", "--plot", "{tmp}/c.jpeg"], "its suffix is '.jpeg'; name it e.g. c.png"),
    (["optimal", "lenet", "--plot", "{tmp}/f.eps"], "its suffix is '.eps'"),
    (["train", "lenet", "--data", "synthetic", "--streams", "{tmp}/s.txt"], "--streams {tmp}/s.txt: a plot"),
])
def test_an_output_path_that_cannot_be_written_fails_before_the_work(argv, message, tmp_path,
                                                                     capsys, monkeypatch):
    """Every output path is checked before anything is computed: the planner, the searches, the
    report, the benchmark and training are all forbidden to start here."""
    from snlite import bench, explain, gap, measure, report, search

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the output path was checked")
    for module, names in ((measure, ("measure", "compare")),
                          (search, ("max_batch_table", "max_depth_table")), (explain, ("explain_budget",)),
                          (report, ("paper_report",)), (bench, ("main",)), (gap, ("gap_rows",)),
                          (cli, ("load_data",))):
        for name in names:
            monkeypatch.setattr(module, name, no_work)
    (tmp_path / "f").write_text("")
    fill = {"missing": str(tmp_path / "no" / "such"), "tmp": str(tmp_path), "file": str(tmp_path / "f")}
    code, out, err = run(capsys, *[a.format(**fill) for a in argv])
    assert code == cli.EXIT_ERROR and len(err.strip().splitlines()) == 1 \
        and message.format(**fill) in err, err


@pytest.mark.parametrize("argv, net", [
    (["plan", "--json", "lenet"], "lenet"),
    (["compare", "--json", "torchvision:resnet18", "lenet"], "torchvision:resnet18"),
    (["maxbatch", "--json", "ResNet50", "--budget", "1GiB", "lenet"], "ResNet50"),
    (["optimal", "--json", "cifar_resnet20", "lenet"], "cifar_resnet20"),
])
def test_json_before_its_net_is_refused_not_written_to_a_file_named_for_it(argv, net, tmp_path, capsys,
                                                                           monkeypatch):
    """``--json [FILE]`` takes the word after it as its file, so ``plan --json lenet`` said NET was
    missing, and ``compare --json torchvision:resnet18 lenet`` would have written a file of that name.
    A file name that names a network is refused, saying what to write instead."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == cli.EXIT_USAGE and f"argument --json: {net} names a network, not a file: " \
        "put --json after NET" in err and "or - (standard output)" in err, err
    assert list(tmp_path.iterdir()) == []
    code, out, err = run(capsys, "plan", "lenet", "--budget", "1GiB", "--json", "./lenet")  # a file, as asked
    assert code == 0 and json.loads((tmp_path / "lenet").read_text())["net"] == "lenet", err


@pytest.mark.parametrize("argv, first, second", [
    (["plan", "lenet", "--json", "{tmp}/same.json", "--save-program", "{tmp}/same.json"], "--json",
     "--save-program"),
    (["plan", "lenet", "--chrome-trace", "{tmp}/x", "--memory-snapshot", "{tmp}/sub/../x"], "--chrome-trace",
     "--memory-snapshot"),
])
def test_two_outputs_to_one_file_are_refused_before_the_work(argv, first, second, tmp_path, capsys):
    """Each flag said it wrote the file and only the last one's survived."""
    (tmp_path / "sub").mkdir()
    code, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == cli.EXIT_USAGE and f"{first} and {second} would both write" in err and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_maxdepth_stops_at_a_stated_ceiling_and_says_why(capsys, monkeypatch):
    """A budget nothing fills (200GiB at batch 1) used to probe up to 10,000 residual units (minutes,
    silent with --quiet); the search stops at a ceiling, lower where planning would need more of this
    machine's memory than is free, and says which and how to raise it. The default still reaches every
    depth docs/results.md reports (2,865 units at batch 1 in 12GiB)."""
    from snlite import cli_search, search

    assert 2_865 < search.MAX_UNITS <= 3_000
    monkeypatch.setattr(cli_search, "free_memory_bytes", lambda: 60 * search.PLANNER_BYTES_PER_UNIT)
    code, out, err = run(capsys, "maxdepth", "--batch", "1", "--budget", "200GiB", "--quiet")
    assert code == 0 and not err, err
    assert re.search(r"^superneurons +>= 182 +60 ", out, re.M), out
    assert ">=: still fits at the ceiling 182 (60 residual units; planning a deeper ResNet would hold more " \
           "than the 7.5 MiB of this machine's memory that is free, about 128.0 KiB a residual unit); " \
           "raise it with --max-units" in out


def test_maxbatch_says_when_it_stopped_at_its_ceiling_and_takes_a_host_budget(capsys):
    code, out, err = run(capsys, "maxbatch", "lenet", "--budget", "12GiB", "--max-batch", "64", "--quiet")
    assert code == 0 and re.search(r"^superneurons +>= 64 ", out, re.M), err
    assert ">=: still fits at the ceiling, batch 64 (--max-batch, default 65,536: the search probes no " \
           "further); raise it with --max-batch" in out
    code, out, err = run(capsys, "maxbatch", "lenet", "--budget", "16MiB", "--host-budget", "300KiB",
                         "--max-batch", "4096", "--json", "-")
    rows = {r["strategy"]: r for r in json.loads(out)["rows"]}  # without it: + offload 75 (3.5 MiB on host)
    assert code == 0 and all(r["batch"] and r["host_peak_bytes"] <= 300 << 10 for r in rows.values()), rows
    assert rows["+ offload"]["batch"] < 75


def test_a_batch_larger_than_the_images_left_names_the_limit_that_left_them(capsys):
    code, _, err = run(capsys, "train", "lenet", "--data", "synthetic", "--limit", 1, "--batch", 4)
    assert code == 1 and "--batch 4 is larger than the 1 training images --limit 1 kept" in err, err
    # a limit that cut nothing is not named
    code, _, err = run(capsys, "train", "lenet", "--data", "synthetic", "--limit", 100000, "--batch", 5000)
    assert code == 1 and err.rstrip().endswith("training images"), err


def test_a_file_the_system_refuses_is_said_in_words(capsys, monkeypatch, tmp_path):
    """A file snlite may not read: "p.json: permission denied", not Python's "[Errno 13] ..." (as root,
    as here, chmod cannot make one: the refusal is the system's, made up below)."""
    from snlite.program import Program

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(Program, "load", staticmethod(refused))
    (tmp_path / "p.json").write_text("{}")
    code, _, err = run(capsys, "check", tmp_path / "p.json")
    assert code == 1 and err.rstrip().endswith(f"{tmp_path / 'p.json'}: permission denied"), err
