"""Every file snlite writes is written whole or not at all (snlite.files): a write that fails half-way
leaves the file that was there before, and no temporary file behind."""
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nets import run
from snlite import files, memory_snapshot, plot
from snlite.cli import save_params
from snlite.config import MemoryConfig
from snlite.models import lenet
from snlite.pipeline import place
from snlite.program import Program

ROOT = Path(__file__).resolve().parent.parent


class Interrupted(BaseException):
    """What Ctrl-C is to a write: not an Exception."""


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "report.md"
    path.write_text("the report of yesterday\n")
    for failure in (ValueError("a figure failed"), Interrupted()):
        with pytest.raises(type(failure)):
            with files.replacing(path) as f:
                f.write("half of today's")
                raise failure
        assert path.read_text() == "the report of yesterday\n"
        assert os.listdir(tmp_path) == ["report.md"]
    files.write_text(path, "today's\n")
    assert path.read_text() == "today's\n" and os.listdir(tmp_path) == ["report.md"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path, umask):
    old = os.umask(umask)
    try:
        files.write_text(tmp_path / "x.json", "{}\n")
        with files.replacing(tmp_path / "x.bin", "wb") as f:
            f.write(b"\0")
    finally:
        os.umask(old)
    for name in ("x.json", "x.bin"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_replaced_file_keeps_its_mode_a_link_keeps_linking_and_a_pipe_is_written_into(tmp_path):
    """Renaming over the path replaced whatever was there: a 0600 file became 0644, a link became a
    copy (its target untouched), and --json /dev/stdout or --save-program /dev/null, run as root,
    turned the device into a regular file."""
    private = tmp_path / "private.json"
    private.write_text("old\n")
    private.chmod(0o600)
    files.write_text(private, "new\n")
    assert private.read_text() == "new\n" and private.stat().st_mode & 0o777 == 0o600
    link = tmp_path / "latest.json"
    link.symlink_to("private.json")
    files.write_text(link, "newer\n")
    assert link.is_symlink() and private.read_text() == "newer\n"
    assert sorted(os.listdir(tmp_path)) == ["latest.json", "private.json"]
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader: opening it to write does not block
    try:
        files.write_text(fifo, "through the pipe\n")
        assert os.read(reader, 100) == b"through the pipe\n"
    finally:
        os.close(reader)
    # the pipe is still a pipe (a device is the same case, not tried on /dev/null: a broken
    # replacing() run as root would destroy it)
    assert fifo.is_fifo()


def test_a_mode_that_is_not_a_whole_write_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"mode 'a': a file is replaced as text \('w'\) or bytes \('wb'\)"):
        with files.replacing(tmp_path / "x", "a"):
            pass
    assert os.listdir(tmp_path) == []


class Unpicklable:
    def __reduce__(self):
        raise Interrupted()


def half_an_array(f, array, *args, **kwargs):
    f.write(array.tobytes()[:4])
    raise Interrupted()


@pytest.mark.parametrize("kind", ["memory snapshot", "parameters"])
def test_each_writer_that_fails_half_way_keeps_the_old_file(kind, tmp_path, monkeypatch):
    """The writers that stream their data into the file (the others make it whole first)."""
    path = tmp_path / "out"
    path.write_text("before\n")
    with pytest.raises(Interrupted):
        if kind == "memory snapshot":
            memory_snapshot.write(path, {"segments": [1] * 1000 + [Unpicklable()]})
        else:
            monkeypatch.setattr(np.lib.format, "write_array", half_an_array)
            save_params(str(path), {"w": np.zeros(3), "v": np.ones(3)})
    assert path.read_text() == "before\n" and os.listdir(tmp_path) == ["out"]


def test_a_plot_that_fails_half_way_keeps_the_old_figure(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def half(self, f, **kwargs):
        f.write(b"\x89PNG half")
        raise Interrupted()
    monkeypatch.setattr(Figure, "savefig", half)
    path = tmp_path / "t.png"
    path.write_bytes(b"the old figure")
    with pytest.raises(Interrupted):
        plot.plot_tradeoff([{"label": "x", "peak_bytes": 1, "extra_flops": 0}], path)
    assert path.read_bytes() == b"the old figure" and os.listdir(tmp_path) == ["t.png"]


def test_a_program_saved_over_another_reads_back_whole(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("an older, longer file " * 10_000)
    program = place(lenet(batch=2), MemoryConfig(liveness=True))
    program.save(path)
    assert json.loads(path.read_text()) == program.to_json() and os.listdir(tmp_path) == ["p.json"]


def test_no_module_writes_a_file_but_through_snlite_files():
    """An ``open(path, "w")``, ``Path.write_text``, ``fig.savefig(path)`` or ``np.savez(path)`` in
    snlite/ writes in place: a failure half-way loses the file that was there. (Given ``f``, the file
    :func:`snlite.files.replacing` opened, they are fine.)"""
    found = []
    for path in sorted((ROOT / "snlite").glob("*.py")):
        if path.name == "files.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            first = ast.unparse(node.args[0]) if node.args else ""
            modes = [a.value for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
                     if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            through = ast.unparse(node.func) in ("files.write_text", "write_text")  # snlite.files's
            writes = any(set(m) & set("wax+") for m in modes)
            if (name in ("open", "fdopen") and writes and "devnull" not in first
                    or name in ("write_text", "write_bytes") and not through
                    or name in ("savefig", "savez", "savez_compressed") and first != "f"):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, "write these through snlite.files (replacing, write_text):\n" + "\n".join(found)


# ---------------------------------------------------------------- the command line's files
def test_plan_with_json_on_standard_output_still_writes_every_file_it_was_asked_for(tmp_path, capsys):
    """``plan NET --json`` returned before the exports: --timeline, --chrome-trace, --memory-snapshot
    and --save-program wrote nothing, silently. Each is written, and said on standard error, so that
    standard output stays the JSON alone."""
    pytest.importorskip("matplotlib")
    asked = {"--plot": "m.png", "--timeline": "t.png", "--chrome-trace": "c.json",
             "--memory-snapshot": "s.pickle", "--save-program": "p.json"}
    argv = [a for flag, name in asked.items() for a in (flag, tmp_path / name)]
    code, out, err = run(capsys, "plan", "lenet", "--batch", 2, "--json", *argv)
    assert code == 0 and json.loads(out)["net"] == "lenet", err
    assert sorted(os.listdir(tmp_path)) == sorted(asked.values())
    said = err.splitlines()
    assert [line.split(" to ")[0] for line in said] == [
        "memory timeline drawn", "timeline drawn", "timeline written", "memory snapshot written",
        "program saved"], err
    assert all(str(tmp_path) in line for line in said)
    assert json.loads((tmp_path / "p.json").read_text())["net"] == "lenet"


def test_each_file_a_command_writes_is_said_after_its_tables(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, out, err = run(capsys, "plan", "lenet", "--batch", 2, "--json", tmp_path / "x.json",
                         "--plot", tmp_path / "m.png", "--save-program", tmp_path / "p.json")
    assert code == 0 and not err, err
    tail = out.split("\ntime (estimated, snlite.timing): ")[1].splitlines()
    saved = len(Program.load(tmp_path / "p.json"))
    assert tail[1:] == ["", f"JSON written to {tmp_path / 'x.json'}",
                        f"memory timeline drawn to {tmp_path / 'm.png'}",
                        f"program saved to {tmp_path / 'p.json'} ({saved:,d} instructions)"], out
    code, out, err = run(capsys, "compare", "lenet", "--batch", 2, "--plot", tmp_path / "c.png",
                         "--json", tmp_path / "c.json")
    assert code == 0 and f"JSON written to {tmp_path / 'c.json'}\n" in out \
        and f"trade-off drawn to {tmp_path / 'c.png'}\n" in out, out


def test_a_plot_without_matplotlib_is_refused_before_the_work(tmp_path, capsys, monkeypatch):
    """It failed after the work, with the JSON already written."""
    from snlite import measure

    def missing():
        raise plot.PlotUnavailable("plots need matplotlib: pip install 'snlite[plot]'")
    monkeypatch.setattr(plot, "require_matplotlib", missing)
    monkeypatch.setattr(measure, "measure", lambda *a, **k: pytest.fail("the work started"))
    code, out, err = run(capsys, "plan", "lenet", "--json", tmp_path / "x.json",
                         "--timeline", tmp_path / "t.png")
    assert code == 1 and err == "snlite plan: error: --timeline: plots need matplotlib: pip install " \
        "'snlite[plot]'\n" and os.listdir(tmp_path) == [], err



@pytest.mark.parametrize("command", [["list"], ["check"]])
def test_a_command_ends_quietly_when_its_reader_goes_away(command):
    """``python -m snlite.assignments list | head``: exit status 141 (128 + SIGPIPE) and nothing on
    standard error, as for ``snlite`` itself (tests/test_cli.py), not a BrokenPipeError's traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-m", "snlite.assignments", *command], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=ROOT)
    p.stdout.close()  # gone before the command has printed anything
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == files.EXIT_BROKEN_PIPE and err == "", err


def test_every_entry_point_runs_through_files_main():
    """Each ``python -m snlite.X`` ends ``files.main(main)`` (or is the CLI, which catches the closed
    pipe itself), so that none ends a ``| head`` with a traceback."""
    for path in sorted((ROOT / "snlite").glob("*.py")):
        text = path.read_text()
        if 'if __name__ == "__main__":' in text and path.name != "cli.py":
            tail = text.split('if __name__ == "__main__":')[1]
            assert "files.main(main)" in tail, f"{path.name}: python -m snlite.{path.stem} without files.main"


def test_a_broken_pipe_of_another_process_is_an_error_like_any_other():
    """Only standard output's reader leaving ends a command quietly: a BrokenPipeError from another pipe
    (a subprocess's) while that reader is there is shown, not taken for it."""
    code = ("import sys\nfrom snlite import files\n\ndef command():\n"
            "    raise BrokenPipeError(32, 'a subprocess')\n\nsys.exit(files.main(command))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "BrokenPipeError: [Errno 32] a subprocess" in proc.stderr, proc.stderr
