"""Saved programs edited at random: the checker refuses the edit, or the edited program still trains
bit-identically to the original on the adversarial device, in the late, early and random orders.

A program is a file a person can edit (``snlite plan NET --save-program p.json``, then ``snlite
check p.json``), so the checker's "no races" must mean "runs right": an instruction dropped, two
swapped, an offset shifted or a size changed is either refused (a ProgramError naming what is
wrong, or a RaceError) or harmless. The edits are made to the saved JSON, as a person would.
"""
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nets import mixed_net, train_steps
from snlite.adversary import AdversarialDevice
from snlite.checker import ProgramError, RaceError, check
from snlite.config import MemoryConfig
from snlite.pipeline import place
from snlite.program import Program

# 40 edits of each program in the suite (the same ones every run); SNLITE_EDITS=2000 for a long hunt
SETTINGS = settings(max_examples=int(os.environ.get("SNLITE_EDITS", 40)), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DELTAS = (-1024, -256, -4, 4, 256, 1024)
# positions in JSON
OFFSETS = {"Alloc": (2,), "Free": (2,), "Copy": (3, 5), "HostWrite": (1,), "HostRead": (1,)}
SIZES = {"Alloc": 3, "Free": 3, "Copy": 6, "HostWrite": 2, "HostRead": 2}


def _case(name):
    g = mixed_net()
    config = {"eager offload": MemoryConfig(liveness=True, offload=True),
              "superneurons": MemoryConfig.superneurons(),
              "raw allocator": MemoryConfig(liveness=True, offload=True, allocator="raw")}[name]
    return g, config


CASES = {name: _case(name) for name in ("eager offload", "superneurons", "raw allocator")}


BASE = {}


def _base(name):
    if name not in BASE:
        g, config = CASES[name]
        BASE[name] = place(g, config, "grads").to_json(), train_steps(g, config, "host")
    return BASE[name]


@st.composite
def edit(draw, saved):
    """One edit of a saved program's body (or of its arena and slab sizes)."""
    body = saved["body"]
    kind = draw(st.sampled_from(["drop", "swap", "shift", "resize", "sizes"]))
    data = json.loads(json.dumps(saved))
    if kind == "drop":
        i = draw(st.integers(0, len(body) - 1))
        del data["body"][i]
        return data, f"drop #{i} {body[i][0]}"
    if kind == "swap":
        i = draw(st.integers(0, len(body) - 2))
        data["body"][i], data["body"][i + 1] = data["body"][i + 1], data["body"][i]
        return data, f"swap #{i} {body[i][0]} and #{i + 1} {body[i + 1][0]}"
    if kind == "sizes":
        field = draw(st.sampled_from(["arena_bytes", "slab_bytes"]))
        data[field] = max(data[field] + draw(st.sampled_from(DELTAS)), 0)
        return data, f"{field} -> {data[field]}"
    table = OFFSETS if kind == "shift" else {k: (v,) for k, v in SIZES.items()}
    editable = [i for i, (name, _) in enumerate(body) if name in table]
    i = draw(st.sampled_from(editable))
    pos = draw(st.sampled_from(table[body[i][0]]))
    delta = draw(st.sampled_from(DELTAS))
    data["body"][i][1][pos] += delta
    return data, f"{kind} #{i} {body[i][0]} field {pos} by {delta}"


@pytest.mark.parametrize("name", CASES)
def test_an_edited_program_is_refused_or_trains_as_the_original(name):
    saved, base = _base(name)
    g, config = CASES[name]

    @SETTINGS
    @given(edit(saved))
    def property_(case):
        data, what = case
        try:
            mutant = Program.from_json(data)
            check(mutant)
        except (ProgramError, RaceError, ValueError) as e:
            event(f"refused: {type(e).__name__}")
            return
        event("accepted")
        for order, seed in (("late", 0), ("early", 0), ("random", 1)):
            run = train_steps(g, config, AdversarialDevice(order, seed=seed), mutant)
            assert run[0] == base[0], f"{what}: accepted, but the losses differ in the {order} order"
            for n, v in base[1].items():
                assert np.array_equal(run[1][n], v), f"{what}: accepted, but {n} differs in the {order} order"

    property_()
