"""The assignment round trip (docs/INSTRUCTORS.md): a student copy fails each assignment's graders
with that assignment's NotImplementedError, and passes them once the solution is put back; plus
the ``python -m snlite.assignments`` commands (list, check, make-student, and grade, which the
round trip runs in the copy) and the marker checks. This file is left out of the student copy
(it needs the solutions)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snlite import assignments, grading
from snlite.assignments import (AssignmentError, main, make_student, scan, scan_file, student_readme,
                                student_text)

ROOT = Path(__file__).resolve().parent.parent
TITLES = {1: "liveness", 2: "pool", 3: "GEMM", 4: "offload", 5: "recomputation", 6: "workspace"}


def grade_copy(copy: Path, *numbers: int) -> str:
    """``python -m snlite.assignments grade K ... -x`` in the copy, with only the copy on the path, on the
    simulator."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(copy))
    # -x: the graders of K run first (file order); stop at the first failure after them
    cmd = [sys.executable, "-m", "snlite.assignments", "grade", *map(str, numbers), "-x", "-q", "-p",
           "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    return proc.stdout + proc.stderr


def test_student_copy_fails_each_assignment_until_its_solution_is_put_back(tmp_path):
    copy = tmp_path / "student"
    printed = []
    regions = make_student(copy, ROOT, out=printed.append)
    numbers = sorted({r.number for r in regions})
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 6
    assert all(TITLES[r.number].lower() in r.title.lower() for r in regions if r.number in TITLES)
    assert any("left out" in line and "test_student_copy.py" in line and "test_planted_bugs.py" in line
               and "mutants.py" in line
               for line in printed)
    assert (copy / assignments.GRADERS).is_file()
    readme = (copy / "README.md").read_text()  # says what the copy is and how to grade, then the README
    assert readme.startswith(f"# snlite\n\n> **A student copy.** Assignments 1 to {numbers[-1]} are stubs") \
        and "python -m snlite.assignments grade K" in readme.split("\n\n")[1]
    assert readme.endswith((ROOT / "README.md").read_text().partition("\n")[2])
    assert not any((copy / f).exists() for f in assignments.INSTRUCTOR_ONLY)
    in_copy, problems = scan(copy)
    assert not problems and all(r.is_stub for r in in_copy), "every region of the copy is the stub"
    assert [(r.path, r.function) for r in in_copy] == [(r.path, r.function) for r in regions]
    which = subprocess.run([sys.executable, "-c", "import snlite; print(snlite.__file__)"], cwd=tmp_path,
                           env=dict(os.environ, PYTHONPATH=str(copy)), capture_output=True, text=True)
    assert Path(which.stdout.strip()).resolve().is_relative_to(copy.resolve()), \
        "the copy's snlite must be imported"
    # In order: with the solutions of 1..k back, assignment k passes and k+1 fails on its own stub
    # (a grader for k+1 may use the solutions of 1..k only). One grading session per step. (That 1 fails
    # on its own stub with none back is the untouched copy's test below, which grades them all.)
    for k in numbers:
        for path in sorted({r.path for r in regions if r.number == k}):
            assert {r.number for r in regions if r.path == path} == {k}, \
                "one assignment per file, to copy it back"
            shutil.copy2(ROOT / path, copy / path)
        graded = [n for n in (k, k + 1) if n in numbers]
        out = grade_copy(copy, *graded)
        assert re.search(rf"^assignment {k}: passed, (\d+) of \1 tests$", out, re.M), \
            f"assignment {k}: with its solution back it should pass:\n{out[-3000:]}"
        if k + 1 in numbers:
            assert f"assignment {k + 1}: FAILED" in out, \
                f"assignment {k + 1}: its stub should fail:\n{out[-3000:]}"
            assert "NotImplementedError" in out and f"Assignment {k + 1}: " in out, out[-3000:]
            later = [n for n in numbers if n > k + 1 and f"Assignment {n}: " in out]
            assert not later, f"assignment {k + 1}'s graders need assignment(s) {later}, which come later"
    assert not any(r.is_stub for r in scan(copy)[0])


def summary_of(out: str) -> list[str]:
    """The lines ``grade`` prints before pytest's output."""
    lines = out.splitlines()
    return lines[:lines.index(grading.DETAILS)]


def test_an_untouched_student_copy_fails_under_grade_and_under_plain_pytest(tmp_path):
    """Both ways of grading test the copy's code, even where the instructor's repository is
    importable (on PYTHONPATH here, as an editable install of it would be): then the stubs pass
    nothing; and something that imported the other snlite before pytest looked makes the tests
    refuse to run, as does grade run from inside the copy but with the other snlite."""
    copy = tmp_path / "student"
    make_student(copy, ROOT, out=lambda line: None)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT))
    # plain pytest, as its console script runs it (-P: the current directory is not on the path) and as
    # each stub's docstring says, over the whole suite: every file collects, though no stub is filled in
    # (a test module that planned at import stopped the collection of everything, so no grader ran).
    # --assert=plain: rewriting the asserts of every test file of a fresh copy was a third of the run
    proc = subprocess.run([sys.executable, "-P", "-m", "pytest", "-m", "a1", "-q", "-p", "no:cacheprovider",
                           "--tb=line", "--assert=plain"], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and re.search(r"^(\d+) failed, \d+ deselected in", out, re.M), out[-3000:]
    assert " passed" not in out.splitlines()[-1] and "NotImplementedError: Assignment 1: liveness" in out, \
        f"pytest -m a1 in the student copy passed the stubs (it tested another snlite?):\n{out[-3000:]}"
    # grade: all of them fail, the summary first, one line each, the first failure named
    proc = subprocess.run([sys.executable, "-m", "snlite.assignments", "grade", "--tb=line"], cwd=copy,
                          env=env, capture_output=True, text=True, timeout=300)
    summary = summary_of(proc.stdout)
    numbers = sorted({r.number for r in scan()[0]})
    listed = ", ".join(map(str, numbers))
    assert proc.returncode == 1 and summary[0] == f"grading assignments {listed} of {copy.resolve()}", \
        proc.stdout[-3000:]
    for k in numbers:
        line = next(line for line in summary if line.startswith(f"assignment {k}: "))
        assert re.match(rf"assignment {k}: FAILED, \d+ of \d+ tests passed; first failure: test_a{k}_\S+: "
                        rf"NotImplementedError: (tid=.* ctaid=.*: )?Assignment {k}: ", line), line
    assert len(summary) <= len(numbers) + 5, summary
    assert summary[-1].startswith(f"0 of {len(numbers)} assignments passed"), summary
    # snlite imported from the instructor's repository before pytest starts: the copy's tests refuse
    refuse = ("import sys, snlite, pytest; sys.exit(pytest.main(['-m', 'a1', 'tests/test_assignments.py', "
              "'-q', '-p', 'no:cacheprovider']))")
    proc = subprocess.run([sys.executable, "-P", "-c", refuse], cwd=copy, env=env, capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR and "would test that code" in out \
        and "python -m snlite.assignments grade" in out, out[-3000:]
    # grade run from a folder of the copy where Python finds the other snlite: it refuses too
    proc = subprocess.run([sys.executable, "-m", "snlite.assignments", "grade", "1"], cwd=copy / "tests",
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and f"you are in the snlite checkout {copy.resolve()}" in proc.stderr, \
        proc.stdout[-2000:] + proc.stderr[-2000:]


def test_grade_says_which_file_does_not_parse(tmp_path):
    """A student's syntax error stops pytest before any grader runs: the summary names the file and
    line instead of counting tests (and grade still knows assignment 1 from its graders)."""
    copy = tmp_path / "student"
    make_student(copy, ROOT, out=lambda line: None)
    with open(copy / "snlite" / "liveness.py", "a") as f:
        f.write("\ndef half_written(:\n")
    proc = subprocess.run([sys.executable, "-m", "snlite.assignments", "grade", "1"], cwd=copy,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(copy)),
                          capture_output=True, text=True, timeout=300)
    line = summary_of(proc.stdout)[1]
    assert proc.returncode == 1 and line.startswith("assignment 1: not graded (") \
        and "SyntaxError" in line and "snlite/liveness.py, line" in line, proc.stdout[-3000:] + proc.stderr


def test_grade_takes_the_markers_name_and_refuses_what_is_no_number(monkeypatch, capsys):
    """grade a1 (the marker's name) is grade 1; grade 1-2 or grade liveness was taken for a file of
    pytest's and graded every assignment, each "not graded (file or directory not found)"."""
    calls = []
    monkeypatch.setattr(grading, "grade", lambda numbers, root, extra: calls.append((numbers, extra)) or 0)
    assert main(["grade", "a1", "A3", "2", "-x", "tests"]) == 0 and calls == [([1, 3, 2], ["-x", "tests"])]
    node = "tests/test_assignments.py::test_a1_fig4"  # a test by its node id is pytest's to take
    assert main(["grade", "1", node]) == 0 and calls[-1] == ([1], [node])
    for bad in ("1-2", "liveness"):
        assert main(["grade", bad]) == 2
        assert f"{bad!r} is no assignment number and no file for pytest" in capsys.readouterr().err
    assert main(["grade", "-1"]) == 2 and "no assignment -1" in capsys.readouterr().err
    assert len(calls) == 2


def test_grade_outside_any_checkout_refuses_to_grade_the_imported_one(monkeypatch, tmp_path, capsys):
    """From a folder of submissions, grade graded the instructor's own snlite (the one imported) and
    reported its solutions passing."""
    monkeypatch.setattr(grading, "grade", lambda *a, **k: pytest.fail("graded"))
    monkeypatch.chdir(tmp_path)
    assert main(["grade", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path.resolve()} is in no snlite checkout" in err and "--root" in err and str(ROOT) in err
    assert main(["list"]) == 0, "list and check still read the imported checkout from anywhere"


def test_a_root_that_is_no_checkout_is_named_as_such(tmp_path, capsys):
    """--root pointing nowhere said "snlite seems installed without its repository ... or pass --root",
    though --root had been passed."""
    assert main(["--root", str(tmp_path / "nope"), "list"]) == 2
    assert f"--root {tmp_path / 'nope'}: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    assert main(["--root", str(tmp_path), "list"]) == 2
    assert "is no snlite checkout (no snlite/assignments.py and no tests/ there)" in capsys.readouterr().err
    (tmp_path / "snlite").mkdir()
    (tmp_path / "snlite" / "assignments.py").write_text("")
    assert main(["--root", str(tmp_path), "list"]) == 2
    assert "is no snlite checkout (no tests/ there)" in capsys.readouterr().err


def test_the_summary_names_an_assert_allclose_failure_by_its_message():
    """numpy's assert_allclose puts its message on the lines after "AssertionError:", so a3's commonest
    failure (a tile read before the barrier) was summed up as "AssertionError:" and nothing more."""
    from types import SimpleNamespace

    message = ("AssertionError: \nNot equal to tolerance rtol=1e-05, atol=1e-06\nv2 vs NumPy, block (8, 4)\n"
               "Mismatched elements: 84 / 90 (93.3%)")
    report = SimpleNamespace(longrepr=SimpleNamespace(reprcrash=SimpleNamespace(message=message)),
                             nodeid="tests/test_assignments.py::test_a3_v2[False]", when="call")
    assert grading._first_line(report) == ("test_a3_v2[False]: AssertionError: Not equal to tolerance "
                                           "rtol=1e-05, atol=1e-06; v2 vs NumPy, block (8, 4)")
    report.longrepr.reprcrash.message = "NotImplementedError: Assignment 3: tiled GEMM"
    assert grading._first_line(report) == "test_a3_v2[False]: NotImplementedError: Assignment 3: tiled GEMM"


def test_make_student_refuses_a_non_empty_or_nested_directory(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["make-student", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not an empty directory" in err and "never overwrites" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"], "nothing was written"
    with pytest.raises(AssignmentError, match="inside the repository"):
        make_student(ROOT / "student-copy-never-made", ROOT)
    assert not (ROOT / "student-copy-never-made").exists()


def test_list_and_check_on_this_repository(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for path, function in [("snlite/liveness.py", "first_and_last_use"), ("snlite/liveness.py", "analyze"),
                           ("snlite/pool.py", "TensorPool.alloc"), ("kernels/gemm.py", "_gemm_v2"),
                           ("snlite/offload.py", "schedule"), ("snlite/recompute.py", "choose_strategies")]:
        assert any(path in line and function in line and "solution" in line for line in out.splitlines()), \
            function
    assert main(["check"]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {len({r.number for r in scan()[0]})} assignments")


BROKEN = {
    "unclosed": ("def f():\n    # BEGIN ASSIGNMENT 1: t\n    return 1\n", "never closed"),
    "mismatch": ("def f():\n    # BEGIN ASSIGNMENT 1: t\n    return 1\n    # END ASSIGNMENT 2\n",
                 "closes BEGIN"),
    "nested": ("def f():\n    # BEGIN ASSIGNMENT 1: t\n    # BEGIN ASSIGNMENT 2: u\n    return 1\n"
               "    # END ASSIGNMENT 2\n", "do not nest"),
    "no title": ("def f():\n    # BEGIN ASSIGNMENT 1\n    return 1\n    # END ASSIGNMENT 1\n", "no title"),
    "module level": ("# BEGIN ASSIGNMENT 1: t\nX = 1\n# END ASSIGNMENT 1\n", "not inside a function"),
    "empty": ("def f():\n    # BEGIN ASSIGNMENT 1: t\n    # nothing\n    # END ASSIGNMENT 1\n    return 1\n",
              "holds no code"),
    "near miss": ("def f():\n    # begin assignment 1: t\n    return 1\n", "looks like a marker"),
    "indent": ("def f():\n    if True:\n        # BEGIN ASSIGNMENT 1: t\n        return 1\n"
               "    # END ASSIGNMENT 1\n", "not indented like"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_check_names_each_malformed_marker(case):
    text, words = BROKEN[case]
    _, problems = scan_file(text, "x.py")
    assert any(words in p and p.startswith("x.py:") for p in problems), problems


def test_check_wants_numbers_without_gaps_and_graders(tmp_path):
    for d in ("snlite", "tests"):
        (tmp_path / d).mkdir()
    (tmp_path / "snlite" / "assignments.py").write_text("")
    (tmp_path / "snlite" / "x.py").write_text("def f():\n    # BEGIN ASSIGNMENT 2: two\n    return 2\n"
                                              "    # END ASSIGNMENT 2\n")
    (tmp_path / assignments.GRADERS).write_text("import pytest\n\n@pytest.mark.a2\n"
                                                "def test_two():\n    pass\n")
    _, problems = assignments.check(tmp_path)
    assert problems == ["assignments are numbered 1..2 with no gaps, but [1] have no region"]
    (tmp_path / assignments.GRADERS).write_text("")
    assert any("no grader" in p for p in assignments.check(tmp_path)[1])
    # a file that does not parse is that one problem, not also a gap in the numbering
    (tmp_path / "snlite" / "one.py").write_text("def f():\n    # BEGIN ASSIGNMENT 1: one\n    return 1)\n"
                                                "    # END ASSIGNMENT 1\n")
    _, problems = assignments.scan(tmp_path)
    assert problems == ["snlite/one.py:3: does not parse: unmatched ')'"], problems


def test_the_stub_keeps_markers_and_indentation_and_compiles():
    text = ("class P:\n    def alloc(self, n):\n        \"\"\"Docs stay.\"\"\"\n"
            "        # BEGIN ASSIGNMENT 2: the pool\n        need = n + 1\n        return need\n"
            "        # END ASSIGNMENT 2\n")
    regions, problems = scan_file(text, "p.py")
    assert not problems and [(r.function, r.is_stub) for r in regions] == [("P.alloc", False)]
    stubbed = student_text(text, regions)
    assert stubbed.splitlines()[3:] == ["        # BEGIN ASSIGNMENT 2: the pool",
                                        '        raise NotImplementedError("Assignment 2: the pool")',
                                        "        # END ASSIGNMENT 2"]
    compile(stubbed, "p.py", "exec")
    again, _ = scan_file(stubbed, "p.py")
    assert again[0].is_stub and student_text(stubbed, again) == stubbed, "a copy of a copy is the same copy"
    readme = student_readme("# title\n\ntext\n", 6)
    assert readme.count("A student copy") == 1 and student_readme(readme, 6) == readme
