"""The planted bugs of tests/mutants.py still apply to the code as it is (``python tests/mutants.py``
plants each one and runs the tests that must catch it: a few minutes, so not here)."""
import re
from pathlib import Path

import pytest

from mutants import MUTANTS, ROOT, main, plant


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.bug)
def test_each_planted_bug_applies_once_and_names_tests_that_exist(mutant):
    planted = plant((ROOT / mutant.path).read_text(), mutant)
    assert planted != (ROOT / mutant.path).read_text()
    assert mutant.tests and all((ROOT / t).is_file() for t in mutant.tests)


def test_a_bug_whose_text_has_moved_is_named_with_the_fix():
    moved = MUTANTS[0]._replace(old="text that is nowhere")
    with pytest.raises(ValueError, match=r"occurs 0 times, not once: update its entry in tests/mutants.py"):
        plant(Path(ROOT / moved.path).read_text(), moved)


def test_the_list_names_every_bug(capsys):
    assert main(["--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(MUTANTS) == len({m.bug for m in MUTANTS})
    said = re.search(r"or that none did \((\d+) bugs, all caught", (ROOT / "docs" / "testing.md").read_text())
    assert said and int(said[1]) == len(MUTANTS), "docs/testing.md counts the planted bugs"
