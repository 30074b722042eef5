"""The README's Python examples run as written (on the host device here)."""
import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", open(README).read(), flags=re.S)


def test_readme_python_examples_run():
    blocks = _python_blocks()
    assert len(blocks) >= 2
    for code in blocks:
        exec(compile(code, README, "exec"), {"__name__": "readme"})


def _shown_after(marker):
    """The code block containing ``marker`` and the plain block right after it (what it prints)."""
    text = open(README).read()
    m = re.search(r"```(\w*)\n([^`]*?" + re.escape(marker) + r"[^`]*?)```\s*(?:[^`]*?)```\n(.*?)```", text, flags=re.S)
    assert m, marker
    return m[2], m[3]


def test_the_nan_example_prints_what_the_readme_shows(capsys):
    code, shown = _shown_after("x[0, 0, 2, 3] = np.nan")
    exec(compile(code, README, "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out == shown


def test_the_divergence_example_fails_as_the_readme_shows(capsys):
    import pytest

    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e \".[digits]\")")
    from snlite import cli

    text = open(README).read()
    command, line = re.search(r"\$ snlite (train lenet --data digits --lr 5)\n\.\.\.\n(.*)\n", text).groups()
    assert cli.main(command.split() + ["--device", "host"]) == 1
    assert capsys.readouterr().err.strip() == line
