"""Plots: every function writes a PNG (a real LeNet trace, a 50,000-op synthetic one), or an SVG or a PDF
where the file name says so, downsampling keeps the peaks, and without matplotlib the error says how to
install it."""
import importlib.util
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snlite
from snlite import plot
from snlite.trace import CATEGORIES, StepRecord, Trace

MIB = 1 << 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                               reason='matplotlib is not installed (pip install -e ".[plot]")')


def png_size(path):
    """(width, height) from the PNG header; fails unless the file is a non-empty PNG."""
    data = open(path, "rb").read(24)
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def lenet_traces():
    g = snlite.models.lenet(batch=8)
    return {"baseline": snlite.simulate(g, snlite.MemoryConfig.baseline()),
            "superneurons()": snlite.simulate(g, snlite.MemoryConfig.superneurons())}


def synthetic_trace(n=50_000, seed=0):
    """n ops with random bytes per category; a forward half, a backward half, one tall spike."""
    rng = np.random.default_rng(seed)
    act = rng.integers(0, 64 * MIB, n)
    spike = int(rng.integers(n // 4, 3 * n // 4))
    act[spike] = 512 * MIB
    steps = []
    for i in range(n):
        dev = {c: 0 for c in CATEGORIES}
        dev.update(weights=8 * MIB, activations=int(act[i]), gradients=int(act[i]) // 2 if i >= n // 2 else 0,
                   in_flight=MIB if i % 97 == 0 else 0)
        total = sum(dev.values())
        steps.append(StepRecord(i, i, f"layer{i}", "forward" if i < n // 2 else "backward", dev, 0,
                                3, total, total))
    totals = [r.counted_bytes for r in steps]
    peak = int(np.argmax(totals))
    return Trace(count="all", steps=steps, peak_bytes=totals[peak], peak_step=peak, peak_op=peak,
                 peak_tensors=(("spike", 512 * MIB), ("w", 8 * MIB)), l_peak_bytes=totals[peak])


# ---- pure helpers (no matplotlib needed) ----

@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=300), st.integers(1, 40))
def test_downsample_keeps_every_bucket_peak(values, max_points):
    idx = plot.downsample(values, max_points)
    assert len(idx) == min(len(values), max_points)
    assert list(idx) == sorted(set(idx)), "indices must be sorted and distinct"
    assert max(values[i] for i in idx) == max(values), "the global peak was dropped"


def test_downsample_short_series_is_untouched():
    assert list(plot.downsample([3, 1, 2], 10)) == [0, 1, 2]
    with pytest.raises(ValueError, match="max_points"):
        plot.downsample([1, 2], 0)


def test_timeline_series_of_50k_ops_keeps_the_true_peak():
    trace = synthetic_trace()
    tl = plot.timeline_series(trace, max_points=2000)
    assert len(tl.ops) <= 2000
    assert tl.total_mib.max() * MIB == trace.peak_bytes
    assert tl.peak_op == trace.peak_op and tl.peak_op in set(tl.ops)
    assert "weight_grads" not in tl.categories and "in_flight" in tl.categories  # all-zero ones left out
    assert tl.backward_op == 25_000


def test_timeline_series_paper_count_stacks_activations_and_gradients(lenet_traces):
    trace = lenet_traces["superneurons()"]
    tl = plot.timeline_series(trace, count="paper")
    assert set(tl.categories) <= {"activations", "gradients"}
    assert tl.peak_mib * MIB == \
        max(r.device_bytes["activations"] + r.device_bytes["gradients"] for r in trace.steps)
    full = plot.timeline_series(trace)
    assert full.peak_op == trace.peak_op and full.peak_mib * MIB == trace.peak_bytes


def test_without_matplotlib_the_error_says_how_to_install(tmp_path):
    code = ("import sys\n"
            "from snlite import plot\n"
            "assert 'matplotlib' not in sys.modules, 'snlite.plot imported matplotlib at import time'\n"
            "sys.modules['matplotlib'] = None\n"
            "try:\n    plot.plot_streams([{'stream': 'compute', 'start_ms': 0, 'end_ms': 1, 'label': 'a'}], "
            "'x.png')\nexcept plot.PlotUnavailable as e:\n    print('UNAVAILABLE', e)\n")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "UNAVAILABLE" in out.stdout and 'pip install -e ".[plot]"' in out.stdout
    assert not (tmp_path / "x.png").exists()


def test_require_matplotlib_raises_runtime_error(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.delitem(sys.modules, "matplotlib.pyplot", raising=False)
    with pytest.raises(RuntimeError, match=r"pip install") as err:
        plot.require_matplotlib()
    assert isinstance(err.value, plot.PlotUnavailable)
    with pytest.raises(plot.PlotUnavailable, match=r"\[plot\]"):
        plot.plot_timeline(synthetic_trace(10), "never.png")


# ---- figures ----

@needs_mpl
@pytest.mark.parametrize("count", [None, "paper"])
def test_plot_timeline_writes_a_png(lenet_traces, tmp_path, count):
    path = plot.plot_timeline(lenet_traces["superneurons()"], tmp_path / "t.png", count=count)
    assert path == tmp_path / "t.png"
    w, h = png_size(path)
    assert w == 12 * 110 and 4.5 * 110 <= h <= 6 * 110  # 12 in wide at 110 dpi


@needs_mpl
def test_plot_timeline_of_50k_ops_finishes(tmp_path):
    assert png_size(plot.plot_timeline(synthetic_trace(), tmp_path / "long.png",
                                       title="50,000 ops"))[0] == 1320


@needs_mpl
def test_plot_compare_timelines_writes_a_png(lenet_traces, tmp_path):
    w, h = png_size(plot.plot_compare_timelines(lenet_traces, tmp_path / "cmp.png"))
    assert w == 1320 and h > 500


@needs_mpl
def test_plot_tradeoff_writes_a_png(lenet_traces, tmp_path):
    g = snlite.models.lenet(batch=8)
    rows = [{"label": name, "peak_bytes": t.peak_bytes, "extra_flops": t.extra_flops,
             "moved_bytes": t.d2h_bytes} for name, t in lenet_traces.items()]
    rows.append({"label": "made up", "peak_bytes": 5 * MIB, "extra_flops": 10**7})
    png_size(plot.plot_tradeoff(rows, tmp_path / "gflops.png"))
    png_size(plot.plot_tradeoff(rows, tmp_path / "pct.png", base_flops=g.flops()))
    with pytest.raises(ValueError):
        plot.plot_tradeoff([], tmp_path / "none.png")


@needs_mpl
def test_plot_streams_writes_a_png(tmp_path):
    events = [{"stream": s, "start_ms": 1.5 * i + (0.4 if s != "compute" else 0), "end_ms": 1.5 * i + 1.2,
               "label": f"{s[:4]}{i}"} for i in range(30) for s in ("copy_in", "compute", "copy_out")]
    events.append({"stream": "compute", "start_ms": 50.0, "end_ms": 50.0, "label": "instant"})
    w, h = png_size(plot.plot_streams(events, tmp_path / "streams.png", title="synthetic"))
    assert w == 1320
    model = [dict(e, start_ms=e["start_ms"] * 1.1, end_ms=e["end_ms"] * 1.1) for e in events]
    w2, h2 = png_size(plot.plot_streams(events, tmp_path / "both.png", estimate=model,
                                        memory=[(0.0, 2**20), (10.0, 3 * 2**20), (40.0, 2**20)]))
    assert w2 == 1320 and h2 > h, "the model's rows and the memory curve make the figure taller"
    with pytest.raises(ValueError, match="ends before"):
        plot.plot_streams([{"stream": "compute", "start_ms": 2, "end_ms": 1, "label": "x"}],
                          tmp_path / "bad.png")


@needs_mpl
def test_a_plot_is_written_in_the_format_its_suffix_names(lenet_traces, tmp_path):
    trace = lenet_traces["superneurons()"]
    svg = open(plot.plot_timeline(trace, tmp_path / "t.svg"), "rb").read()
    assert svg.startswith(b"<?xml") and b"<svg" in svg[:1000], "not an SVG"
    pdf = plot.plot_tradeoff([{"label": "a", "peak_bytes": MIB, "extra_flops": 0}], tmp_path / "t.PDF")
    assert open(pdf, "rb").read(5) == b"%PDF-", "an upper-case .PDF is a PDF too"
    assert png_size(plot.plot_compare_timelines(lenet_traces, tmp_path / "t.Png"))[0] == 1320


@pytest.mark.parametrize("name,words", [("t.txt", "its suffix is '.txt'"), ("t", "it has no suffix"),
                                        ("t.jpg", "name it e.g. t.png")])
def test_a_file_name_that_names_no_format_is_refused_before_anything_is_drawn(name, words, tmp_path,
                                                                               monkeypatch):
    """It used to write a PNG under any name (``x.txt`` held a PNG). Refused before matplotlib is even
    imported: without it, the error is still about the name."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for draw, data in ((plot.plot_timeline, synthetic_trace(10)),
                       (plot.plot_tradeoff, [{"label": "a", "peak_bytes": 1, "extra_flops": 0}]),
                       (plot.plot_streams, [{"stream": "compute", "start_ms": 0, "end_ms": 1,
                                             "label": "a"}])):
        with pytest.raises(ValueError, match="a plot is written as PNG, SVG or PDF") as err:
            draw(data, tmp_path / name)
        assert words in str(err.value)
    assert os.listdir(tmp_path) == []
    assert [plot.figure_format(n) for n in ("a.png", "b.SVG", "dir.v2/c.pdf")] == ["png", "svg", "pdf"]


@needs_mpl
def test_alexnet_figure_regenerates(tmp_path):
    assert png_size(plot.alexnet_figure(tmp_path / "alexnet.png"))[0] == 1320


def test_module_help_outside_the_repository_writes_nothing(tmp_path):
    """`python -m snlite.plot --help` used to draw a PNG named --help (and, run outside the repository
    root, fail to find docs/)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "snlite.plot", "--help"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage: python -m snlite.plot [-h] [PATH.png]"), p.stderr
    assert os.listdir(tmp_path) == []


def test_module_default_is_the_repositorys_figure_wherever_it_runs(tmp_path, monkeypatch, capsys):
    drawn = []
    monkeypatch.setattr(plot, "alexnet_figure", lambda path: drawn.append(path) or path)
    monkeypatch.chdir(tmp_path)
    assert plot.main([]) == 0
    assert drawn == [os.path.join(REPO, "docs", "alexnet_b200_timeline.png")]
    assert plot.main([str(tmp_path / "here.png")]) == 0 and drawn[-1] == str(tmp_path / "here.png")
    assert plot.main([str(tmp_path / "no" / "x.png")]) == 1
    assert "its folder does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        plot.main([str(tmp_path / "x.txt")])
    assert exit_.value.code == 2 and "written as PNG, SVG or PDF" in capsys.readouterr().err
    assert plot.main([str(tmp_path / "fig.svg")]) == 0 and drawn[-1] == str(tmp_path / "fig.svg")
