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
