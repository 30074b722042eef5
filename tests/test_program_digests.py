"""The planner's programs stay byte for byte what they were when the digests were stored (see
``program_digests.py``): a refactor that changes a program must change the stored digest on purpose."""
import json

from program_digests import STORE, compute


def test_the_flag_matrix_programs_are_unchanged():
    stored = json.loads(STORE.read_text())
    now = compute(("small",))
    changed = [k for k in now if stored.get(k) != now[k]]
    assert len(now) > 1500 and not changed, f"{len(changed)} programs changed, e.g. {changed[:5]}"
