"""`snlite paper`: the report runs, has every section and table, and its numbers are simulate()'s."""
import contextlib
import io
import os
import re
from unittest import mock

import pytest

from snlite import __version__, cli, measure, report, report_memory, report_tables, search
from snlite.config import MemoryConfig
from snlite.models import get_model
from snlite.pipeline import simulate

SECTIONS = ("## How to read this", "## 1. AlexNet's memory trajectory", "## 2. Recomputation",
            "## 3. Traffic per iteration", "## 4. Table 4: depth", "## 5. Table 5: width", "## 6. Trade-off",
            "## 7. How close to l_peak", "## 8. Speed, estimated")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, so the progress line is drawn."""

    def isatty(self):
        return True


STDERR = Terminal()  # what the module's one run drew on its (terminal) stderr


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `snlite paper --quick` run for the whole module: (exit status, stdout, report text, folder)."""
    out = tmp_path_factory.mktemp("paper")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(STDERR), \
            mock.patch.dict(os.environ, {"COLUMNS": "300"}):  # a narrow terminal truncates the progress line
        code = cli.main(["paper", "--out", str(out), "--quick"])
    path = out / "report.md"
    return code, stdout.getvalue(), path.read_text() if path.exists() else "", out


def test_paper_shows_its_progress_on_a_terminal(quick):
    """Each section says what it runs, on stderr (it used to print nothing for minutes); the line
    is wiped before each section's tables are printed, so stdout never mixes with it."""
    text = STDERR.getvalue()
    for pattern in (r"section 1/8 \(trajectory\): AlexNet: baseline",
                    r"section 2/8 \(recomputation\): resnet50 \(32\): recompute cost_aware",
                    r"section 3/8 \(traffic\): AlexNet, batch 1,024",
                    r"section 4/8 \(Table 4, depth\): liveness: probe \d+, depth [0-9,]+ \([0-9,]+ units\)",
                    r"section 5/8 \(Table 5, width\): alexnet: superneurons: probe \d+, batch [0-9,]+ "
                    r"\[strategy 5/5\]", r"section 6/8 \(trade-off\): alexnet: superneurons\(\)",
                    r"section 7/8 \(min budget\): resnet50 \(32\): the smallest budget",
                    r"section 8/8 \(speed\): alexnet, batch 200: offload when memory suffices"):
        assert re.search(r"\rsnlite paper: " + pattern + r".*\(\d+ s\)\033\[K", text), pattern
    assert text.endswith("\r\033[K") and text.count("\r\033[K") >= 8


def _row(text: str, section: str, first_cell: str) -> list[str]:
    """The cells of the first table row of ``section`` whose first cell is ``first_cell``."""
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in {section!r}")


def test_paper_quick_writes_every_section_and_table(quick):
    code, out, text, folder = quick
    assert code == 0, out
    assert text.startswith("# ") and "snlite paper --out" in text and "--quick" in text \
        and __version__ in text
    for heading in SECTIONS:
        assert heading in text, heading
    # every experiment has its table (Tables 1 and 4: several)
    assert len(re.findall(r"^\|-", text, re.M)) >= 10
    assert re.search(r"in [0-9.]+ s, on the meta device", text)
    # every table is printed too, and the total time
    assert "| technique" in out and "| network" in out and re.search(r"took [0-9.]+ s in all", out)
    # the figures: embedded as relative links to files beside the report, or a line that says how to get them
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    if links:
        assert all(not os.path.isabs(p) and (folder / p).is_file() for p in links)
    else:
        assert "pip install" in text


def test_numbers_are_those_of_simulate(quick):
    code, _, text, _ = quick
    assert code == 0
    graph = get_model("alexnet", 200)
    resident = _row(text, "## 8.", "alexnet (200)")  # the second table's first row
    assert f"{measure.all_resident_ms(graph, 'H200', workspace='dynamic'):,.1f} ms" in resident
    base = _row(text, "## 1.", "baseline")
    assert base[1] == measure.format_size(simulate(graph, MemoryConfig(count="paper")).peak_bytes)
    assert base[5] == measure.format_size(simulate(graph, MemoryConfig()).peak_bytes)
    cost_aware = _row(text, "## 2.", "alexnet (200)")  # first alexnet row: liveness only
    assert cost_aware[4] == \
        measure.format_size(simulate(graph, MemoryConfig(liveness=True, count="paper")).peak_bytes)
    budget = report_tables.BUDGET
    found = search.max_batch(lambda b: get_model("alexnet", b), MemoryConfig(budget_bytes=budget))
    assert _row(text, "## 5.", "alexnet")[1] == f"{found.value:,d}"
    trace = simulate(get_model("alexnet", 256), MemoryConfig.superneurons(cache=False, budget_bytes=budget))
    assert _row(text, "## 3.", "256")[1] == f"{trace.d2h_bytes / 1e9:.2f} GB"
    smallest = search.min_budget(get_model("resnet50", 32))
    assert _row(text, "## 7.", "resnet50 (32)")[1:5] == [
        measure.format_size(smallest.budget_bytes), measure.format_size(smallest.l_peak_bytes),
        measure.format_size(smallest.persistent_bytes), f"{smallest.ratio:.2f}"]


def test_table1_alexnet_is_found_at_the_papers_batch(quick):
    """The batch search, given AlexNet's row of the paper's Table 1, lands on the paper's batch (200)
    and reproduces its three peaks; the report says so and shows our counts beside the paper's."""
    _, _, text, _ = quick
    table = text.split("*the batch that reproduces", 1)[1].split("\n\n", 2)[1]
    found = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| alexnet")]
    paper = report_memory.PAPER_TABLE1["alexnet"]
    assert [(c[1].strip(), c[2].strip(), c[6].strip(), c[7].strip()) for c in found] == [
        ("200", s, str(paper[s][1]), str(paper[s][1])) for s in report_memory.STRATEGIES]
    assert "alexnet: batch 200 reproduces the paper's three peaks" in text
    best = report_memory.table1_batch("alexnet", report_memory.PAPER_TABLE1["alexnet"], (64,))
    assert best["batch"] == 200 and best["exact"]
    assert {s: best["runs"][s].trace.recompute_count for s in report_memory.STRATEGIES} == {
        s: report_memory.PAPER_TABLE1["alexnet"][s][1] for s in report_memory.STRATEGIES}


def test_without_matplotlib_every_table_is_still_there(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "_plots", lambda: (None, "plots need matplotlib: pip install matplotlib"))
    monkeypatch.setattr(report, "QUICK", dict(recompute=[("alexnet", 200)], traffic=[256, 4096],
                                              depth=["baseline"], width=["alexnet"], speed=[("lenet", 8)],
                                              suffices=[("lenet", 8)]))
    rep = report.paper_report(str(tmp_path), quick=True, log=lambda s: None)
    text = (tmp_path / "report.md").read_text()
    assert rep.plots and "pip install matplotlib" in text and "![" not in text
    assert os.listdir(tmp_path) == ["report.md"]
    for heading in SECTIONS:
        assert heading in text, heading
    row = _row(text, "## 3.", "4,096")  # batch 4096 does not fit 12 GiB: said in its cells, no traceback
    assert len(row) == 12 and row[1] == "does not fit" and row[6] == "does not fit" and row[11] == ""


def test_an_interrupted_run_leaves_the_report_before_it_as_it_was(tmp_path, monkeypatch):
    """Ctrl-C in section 3: the old report.md beside one new figure from section 1 and the older ones
    was a folder that matched no run; now nothing of the interrupted run is left in it."""
    (tmp_path / "report.md").write_text("the last run's report\n")
    (tmp_path / "alexnet_b200_trajectory_paper.png").write_bytes(b"the last run's figure")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(report, "traffic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.paper_report(str(tmp_path), quick=True, log=lambda s: None)
    assert sorted(os.listdir(tmp_path)) == ["alexnet_b200_trajectory_paper.png", "report.md"]
    assert (tmp_path / "report.md").read_text() == "the last run's report\n"
    assert (tmp_path / "alexnet_b200_trajectory_paper.png").read_bytes() == b"the last run's figure"


def test_the_report_is_written_through_a_link_and_keeps_its_permissions(tmp_path, monkeypatch):
    """As every file snlite writes (snlite.files): made in the staging folder, it is copied into place,
    not renamed over the link or the private file it replaces."""
    kept = tmp_path / "elsewhere.md"
    kept.write_text("old\n")
    kept.chmod(0o600)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.md").symlink_to(kept)
    monkeypatch.setattr(report, "_plots", lambda: (None, "no plots here"))
    for name in ("recompute", "traffic", "depth", "width", "min_budgets", "speed"):
        monkeypatch.setattr(report, name, lambda *a, **k: report_tables.Section("stub", "a stubbed section"))
    monkeypatch.setattr(report, "tradeoff", lambda *a, **k: (report_tables.Section("stub", "stubbed"), []))
    monkeypatch.setattr(report, "trajectory", lambda *a, **k: (report_tables.Section("stub", "stubbed"), {}))
    report.paper_report(str(tmp_path / "out"), quick=True, log=lambda s: None)
    assert (tmp_path / "out" / "report.md").is_symlink() and "stubbed" in kept.read_text()
    assert kept.stat().st_mode & 0o777 == 0o600


def test_out_must_be_a_folder(tmp_path, capsys):
    file = tmp_path / "report.md"
    file.write_text("")
    assert cli.main(["paper", "--out", str(file), "--quick"]) == 1
    assert "is not a folder" in capsys.readouterr().err


def test_table1_batch_finds_the_batch_behind_a_networks_figures():
    """The search works on any network whose row lacks its batch: given ResNet-50's own figures at
    batch 24 (rounded as the paper rounds), scaled from a run at batch 32 it lands on 24."""
    runs = report_memory._table1_runs("resnet50", 24, measure.no_progress)
    row = {s: (round(runs[s].paper.peak_bytes / report_tables.MIB, 3), runs[s].trace.recompute_count)
           for s in report_memory.STRATEGIES}
    best = report_memory.table1_batch("resnet50", row, (8, 32))
    assert best["batch"] == 24 and best["exact"] and best["worst"] < 1e-6
