"""Grading: the graders of some assignments run in one pytest session, summed up one line each.

    python -m snlite.assignments grade            # all of them: a summary first, pytest's output after
    python -m snlite.assignments grade 2 -x -v    # one; what follows the numbers goes to pytest

:func:`grade` runs ``pytest -m "a1 or a2 ..." tests/test_assignments.py`` in the checkout, and this
module is also the pytest plugin that session loads (``-p snlite.grading``): it registers the
markers ``a1``...``aN`` found in the graders (so a checkout grades even before setup.cfg lists
them) and writes each assignment's counts and first failure where :func:`grade` reads them. The
assignments themselves (markers, the student copy) are :mod:`snlite.assignments`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from snlite import files

GRADERS = "tests/test_assignments.py"

def _hypothesis_plugin() -> list[str]:
    """``-p`` for hypothesis's pytest plugin, the one installed plugin grading loads (if installed)."""
    return ["-p", "_hypothesis_pytestplugin"] if importlib.util.find_spec("_hypothesis_pytestplugin") else []


def grade_command(numbers, extra=()) -> list[str]:
    """The pytest command that grades the given assignments in one session (from the repository root,
    with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``: see :func:`grade`)."""
    numbers = [numbers] if isinstance(numbers, int) else list(numbers)
    return [sys.executable, "-m", "pytest", "-o", "addopts=", *_hypothesis_plugin(), "-p",
            "snlite.grading", "-m", " or ".join(f"a{k}" for k in numbers), GRADERS, "--tb=short", *extra]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def summary_line(k: int, c: dict, rc: int, width: int = 200) -> tuple[bool, str]:
    """(passed?, the one line that says how assignment k did), from the counts the plugin wrote."""
    passed, failed, skipped = c.get("passed", 0), c.get("failed", 0), c.get("skipped", 0)
    selected = max(c.get("selected", 0), passed + failed + skipped)
    not_run = selected - passed - failed - skipped
    rest = "".join([f", {skipped} skipped" if skipped else "", f", {not_run} not run" if not_run else ""])
    if failed:
        line = f"assignment {k}: FAILED, {passed} of {selected} tests passed{rest}; first failure: "
        return False, _clip(line + str(c.get("first")), width)
    if passed and not not_run:
        return True, f"assignment {k}: passed, {passed} of {selected} tests{rest}"
    why = c.get("error") or f"pytest exit {rc}, no test of it ran"
    return False, _clip(f"assignment {k}: not graded ({why}: see the details below)", width)


def grade(numbers, root, extra=(), out=print) -> int:
    """Run the graders of the assignments in ``numbers`` in one pytest session, then print a summary
    (one line per assignment: tests passed, the first failing check) and after it pytest's output;
    0 if all passed.

    The session runs in ``root`` with ``root`` first on the path, so it grades that checkout's code
    whatever snlite is installed; it loads no installed pytest plugin but hypothesis's
    (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``: a plugin in the student's environment cannot reorder or
    change the graders) and ignores setup.cfg's ``addopts``."""
    root = Path(root)
    numbers = list(numbers)
    env = dict(os.environ)
    env.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # as tests/conftest.py does; 0 grades on a real GPU
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    cmd = grade_command(numbers, extra)
    which = "assignment" if len(numbers) == 1 else "assignments"
    out(f"grading {which} {', '.join(map(str, numbers))} of {root}")
    sys.stdout.flush()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        env[REPORT_ENV] = report = os.path.join(tmp, "grades.json")
        proc = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace")
        counts = json.loads(Path(report).read_text()) if os.path.exists(report) else {}
    seconds = time.perf_counter() - start
    width = max(200, shutil.get_terminal_size((200, 24)).columns)  # one line, if a long one
    error = counts.get("error") or next((line.strip(" !") for line in proc.stdout.splitlines()
                                         if line.startswith(("ERROR", "E   ")) or "Exit:" in line), None)
    verdicts = []
    for k in numbers:
        c = dict(counts.get(str(k), {}))
        if error and not c.get("error"):
            c["error"] = error
        ok, line = summary_line(k, c, proc.returncode, width)
        verdicts.append(ok)
        out(line)
    tests = [counts.get(str(k), {}) for k in numbers]
    passed, selected = sum(c.get("passed", 0) for c in tests), sum(c.get("selected", 0) for c in tests)
    out(f"{sum(verdicts)} of {len(numbers)} {which} passed ({passed} of {selected} tests) in "
        f"{seconds:.1f} s; the details follow: the output of python {shlex.join(cmd[1:])}")
    out(DETAILS)
    out(proc.stdout.rstrip("\n"))
    out("-" * 69)
    out(f"{sum(verdicts)} of {len(numbers)} {which} passed: the summary is above the details")
    return 0 if all(verdicts) and proc.returncode == 0 else 1


DETAILS = "-" * 30 + " details " + "-" * 30  # the line between grade's summary and pytest's output
REPORT_ENV = "SNLITE_GRADE_REPORT"  # where ``grade`` asks this plugin to write each assignment's counts
_counts: dict = {}


def _assignments_of(keywords) -> list[int]:
    return [int(k[1:]) for k in keywords if re.fullmatch(r"a\d+", k)]


def _first_line(report) -> str:
    """What failed, in one line: the test's name and the first line of its error."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else str(report.longrepr)
    message = re.sub(r"tid=\[[^]]*\] ctaid=\[[^]]*\]: ", "", message)  # the simulator's thread, not the check
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if lines and lines[0].endswith(":"):  # "AssertionError:" and its message below (numpy's assert_allclose)
        lines[0] = " ".join([lines[0]] + ["; ".join(lines[1:3])])
    name = report.nodeid.split("::", 1)[-1]
    where = f" (in {report.when})" if report.when != "call" else ""
    return f"{name}: {lines[0] if lines else 'failed'}{where}"


def pytest_configure(config):
    """Plugin hook (``pytest -p snlite.grading``): register the markers a1..aN the graders use."""
    _counts.clear()
    graders = Path(config.rootpath) / GRADERS
    marked = re.findall(r"\bpytest\.mark\.a(\d+)\b", graders.read_text()) if graders.is_file() else []
    for number in sorted({int(k) for k in marked}):
        config.addinivalue_line("markers", f"a{number}: grades assignment {number} (python -m "
                                           f"snlite.assignments grade {number})")


def pytest_collectreport(report):
    """Plugin hook: a graders file that does not load (a syntax error in the student's code, a
    refusal to grade another checkout) is the reason nothing was graded."""
    if report.failed and "error" not in _counts:
        lines = [line.strip() for line in str(report.longrepr).splitlines() if line.strip()]
        errors = [line[1:].strip() for line in lines if line.startswith("E ")]  # the exception's lines
        where = [m for m in (re.match(r'File "(.+)", line (\d+)', e) for e in errors) if m]
        at = f" ({os.path.relpath(where[-1][1])}, line {where[-1][2]})" if where else ""
        _counts["error"] = _clip(f"{report.nodeid} does not load: {(errors or lines or ['?'])[-1]}{at}", 300)


def pytest_collection_finish(session):
    """Plugin hook: how many graders each assignment has in this session."""
    for item in session.items:
        for k in _assignments_of(item.keywords):
            _counts.setdefault(k, {}).setdefault("selected", 0)
            _counts[k]["selected"] += 1


def pytest_runtest_logreport(report):
    """Plugin hook: count each grader's outcome under its assignment (a failure in set-up or
    tear-down counts) and keep each assignment's first failure."""
    outcome = ("failed" if report.failed else "skipped" if report.skipped else
               "passed" if report.when == "call" else None)
    for k in _assignments_of(report.keywords) if outcome else ():
        c = _counts.setdefault(k, {})
        c[outcome] = c.get(outcome, 0) + 1
        if outcome == "failed" and "first" not in c:
            c["first"] = _first_line(report)


def pytest_sessionfinish(session, exitstatus):
    """Plugin hook: write the counts where ``grade`` asked for them."""
    if os.environ.get(REPORT_ENV):
        files.write_text(os.environ[REPORT_ENV], json.dumps({str(k): c for k, c in _counts.items()}))
