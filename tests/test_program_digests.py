"""The planner's programs stay byte for byte what they were when the digests were stored (see
``program_digests.py``): a refactor that changes a program must change the stored digest on purpose.
The suite checks every eighth flag-matrix case (all modes, budgets and schedules among them);
``python tests/program_digests.py`` checks all 1,740, the zoo's too."""
import json

from program_digests import STORE, small_cases, digest


def test_the_flag_matrix_programs_are_unchanged():
    stored = json.loads(STORE.read_text())
    cases = list(small_cases())[::8]
    changed = [key for key, fn in cases if stored.get(key) != digest(fn)]
    assert len(cases) > 200 and not changed, f"{len(changed)} programs changed, e.g. {changed[:5]}"
