"""The timing harness of ``python -m snlite.bench searches`` and ``tutorials``: it times a fresh
process and reports how it ended (the figures themselves are never asserted)."""
from snlite import bench


def test_a_timed_command_reports_its_time_and_a_failure_its_status():
    shown = []
    ok = bench._timed("fine", ["-c", "print(1)"], 30, show=shown.append)
    assert ok["status"] == 0 and ok["seconds"] > 0 and "(target 30 s: within)" in shown[-1]
    bad = bench._timed("broken", ["-c", "raise SystemExit('no such net')"], None, show=shown.append)
    assert bad["status"] == 1 and "exit status 1: ['no such net']" in shown[-1] and "target" not in shown[-1]


def test_every_tutorial_is_timed(monkeypatch):
    runs = []
    monkeypatch.setattr(bench, "_timed", lambda name, argv, target, env, show: runs.append((name, env)))
    bench.tutorials(quick=True)
    assert [name for name, _ in runs] == sorted(p.name for p in bench.TUTORIALS.glob("[0-9][0-9]_*.py"))
    assert len(runs) >= 9 and all(env == {"SNLITE_TUTORIAL_QUICK": "1"} for _, env in runs)
