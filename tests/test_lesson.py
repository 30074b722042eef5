"""snlite.lesson, the tutorials' one import: checked claims, plots saved and shown inline, the output
folder."""
import sys
import types

import pytest

import snlite
from snlite import lesson


def test_expect_prints_the_claim_and_that_the_run_shows_it(capsys):
    assert lesson.expect("the peak is in backward", 3 > 2, why="gradients arrive") is None  # no stray True
    out = capsys.readouterr().out.splitlines()
    assert out == \
        ["You should see: the peak is in backward", "  -> yes: this run shows it", "  Why: gradients arrive"]


def test_a_claim_the_run_does_not_show_stops_the_lesson(capsys):
    with pytest.raises(lesson.ClaimNotShown, match="the peak is in forward"):
        lesson.expect("the peak is in forward", [])
    assert "NO: this run does not show it" in capsys.readouterr().out
    assert issubclass(lesson.ClaimNotShown, AssertionError)


def test_long_claims_wrap_without_splitting_words(capsys):
    lesson.expect("memory-centric " * 20, True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 2 and all(len(line) <= lesson.WIDTH for line in lines)
    assert all(w == "memory-centric" for line in lines[:-1] for w in line.split() if "memory" in w)


def tiny_trace():
    g = snlite.Graph((2, 1, 4, 4), 2, name="tiny")
    g.softmax_loss(g.linear(g.flatten(g.relu(g.conv2d(g.input(), 2, 3, padding=1))), 2))
    return snlite.simulate(g, snlite.MemoryConfig(liveness=True))


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setattr(lesson, "OUT", tmp_path / "out")
    return tmp_path / "out"


def test_save_plot_writes_the_png_and_returns_nothing(out, capsys):
    pytest.importorskip("matplotlib")
    assert lesson.save_plot("plot_timeline", tiny_trace(), "t.png", title="tiny") is None
    assert (out / "t.png").stat().st_size > 0
    assert f"plot saved: {out / 't.png'}" in capsys.readouterr().out


def test_without_matplotlib_the_lesson_goes_on(out, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails, as where it is not installed
    lesson.save_plot("plot_timeline", tiny_trace(), "t.png")
    printed = capsys.readouterr().out
    assert "plot t.png skipped" in printed and "pip install" in printed
    assert not (out / "t.png").exists()


def fake_kernel(monkeypatch, shown):
    """An IPython module whose shell has a kernel (as in Jupyter) and whose display records what it shows."""
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: types.SimpleNamespace(kernel=object())
    display = types.ModuleType("IPython.display")
    display.Image = lambda filename: ("image", filename)
    display.display = shown.append
    ipython.display = display
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", display)


def test_in_a_notebook_the_plot_is_also_shown_inline(out, monkeypatch):
    pytest.importorskip("matplotlib")
    assert not lesson.in_notebook()
    shown = []
    fake_kernel(monkeypatch, shown)
    assert lesson.in_notebook()
    lesson.save_plot("plot_timeline", tiny_trace(), "t.png")
    assert shown == [("image", str(out / "t.png"))] and (out / "t.png").is_file()


def test_the_output_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SNLITE_TUTORIAL_OUT", str(tmp_path / "x"))
    assert lesson._default_out() == tmp_path / "x"
    monkeypatch.delenv("SNLITE_TUTORIAL_OUT")
    script = tmp_path / "tutorials" / "02_liveness.py"
    monkeypatch.setattr(sys.modules["__main__"], "__file__", str(script), raising=False)
    assert lesson._default_out() == tmp_path / "tutorials" / "out", "a script: out/ next to it"
    fake_kernel(monkeypatch, [])
    monkeypatch.chdir(tmp_path)
    assert lesson._default_out() == tmp_path / "out", "a notebook: out/ in the kernel's working folder"
