"""The README's Python examples run as written (on the host device here).

Numbers that come out of float32 arithmetic differ in their last bits between CPUs (BLAS kernels,
vector widths, thread counts), so a shown output is compared as text with its numbers taken
apart: the words exactly, each number within the tolerance stated where it is compared (the
README prints them rounded, far coarser than any CPU's difference)."""
import math
import os
import re

import pytest

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf)")

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
    m = re.search(r"```(\w*)\n([^`]*?" + re.escape(marker) + r"[^`]*?)```\s*(?:[^`]*?)```\n(.*?)```",
                  text, flags=re.S)
    assert m, marker
    return m[2], m[3]


def assert_same_output(got: str, shown: str, rel: float = 0.0, abs_: float = 0.0) -> None:
    """``got`` reads as ``shown``: the same words and layout (spaces between tokens aside), and every
    number within ``rel`` (relative) or ``abs_`` (absolute) of the one shown; NaN only where NaN is
    shown."""
    words = [NUMBER.sub("#", line).split() for line in (got, shown)]
    assert words[0] == words[1], f"the text differs:\n{got}\nshown:\n{shown}"
    for a, b in zip(NUMBER.findall(got), NUMBER.findall(shown), strict=True):
        x, y = float(a), float(b)
        assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rel, abs_tol=abs_), \
            f"{a} printed where the README shows {b} (tolerance: rel {rel}, abs {abs_})\n{got}"


def test_assert_same_output_fails_on_a_changed_number_or_word():
    assert_same_output("loss 0.052 at step 3", "loss 0.051 at step 3", abs_=0.0015)
    for got in ("loss 0.054 at step 3", "loss 0.051 at step 4", "cost 0.051 at step 3", "loss nan at step 3"):
        with pytest.raises(AssertionError):
            assert_same_output(got, "loss 0.051 at step 3", abs_=0.0015)


def test_the_nan_example_prints_what_the_readme_shows(capsys):
    """The logits, rounded to 3 decimals, may round the other way on another CPU: one unit of the
    last shown digit is allowed (a wrong logit is off by far more)."""
    code, shown = _shown_after("x[0, 0, 2, 3] = np.nan")
    exec(compile(code, README, "exec"), {"__name__": "readme"})
    assert_same_output(capsys.readouterr().out, shown, abs_=0.0011)


def test_the_divergence_example_fails_as_the_readme_shows(capsys):
    """Four steps at a learning rate of 5 amplify every rounding difference between CPUs: the step,
    the layer and the counts are compared exactly, the largest weight within 10%."""
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (pip install -e \".[digits]\")")
    from snlite import cli

    text = open(README).read()
    command, line = re.search(r"\$ snlite (train lenet --data digits --lr 5)\n\.\.\.\n(.*)\n", text).groups()
    assert cli.main(command.split() + ["--device", "host"]) == 1
    assert_same_output(capsys.readouterr().err.strip(), line, rel=0.1)
