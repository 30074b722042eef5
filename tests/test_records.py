"""snlite.records: ``@record`` is a frozen slotted dataclass in every way a caller sees, and
``without_cycle_collection`` hands the collector back as it found it, without leaving what the pass
made for the youngest generation's next collection to scan."""
import dataclasses
import gc

import pytest

from nets import mixed_net
from snlite import checker, search, timing
from snlite.config import MemoryConfig
from snlite.pipeline import place, probe
from snlite.records import record, without_cycle_collection
from snlite.trace import trace_program


@record
class Move:
    tensor: str
    nbytes: int = 0
    stream: str = "compute"


def test_a_record_is_a_frozen_dataclass_with_slots():
    m = Move("relu1", 4096)
    assert (m.tensor, m.nbytes, m.stream) == ("relu1", 4096, "compute")
    assert m == Move("relu1", 4096, "compute") and m != Move("relu1", 4096, "copy_out")
    assert repr(m) == "Move(tensor='relu1', nbytes=4096, stream='compute')"
    assert dataclasses.replace(m, stream="copy_out") == Move("relu1", 4096, "copy_out")
    assert not hasattr(m, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.nbytes = 0
    with pytest.raises(TypeError):
        Move()  # tensor has no default


def test_a_record_refuses_what_its_init_would_skip():
    with pytest.raises(TypeError, match="no __post_init__"):
        @record
        class Checked:
            x: int

            def __post_init__(self):
                pass


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_as_it_was_after(collector):
    gc.enable()
    with without_cycle_collection():
        assert not gc.isenabled()
        with without_cycle_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pass leaves the outer one's state
    assert gc.isenabled()
    gc.disable()
    with without_cycle_collection():
        pass
    assert not gc.isenabled()


def test_what_a_pass_made_is_not_scanned_as_it_ends(collector):
    gc.enable()
    gc.collect()
    runs = [g["collections"] for g in gc.get_stats()]
    with without_cycle_collection():
        made = [[i] for i in range(20_000)]  # tracked objects, all still held after the pass
    assert [g["collections"] for g in gc.get_stats()] == runs  # no collection ran at the end of the pass
    assert gc.get_count()[0] < gc.get_threshold()[0]  # nor is one due
    assert gc.is_tracked(made[0]) and len(made) == 20_000


def test_objects_the_program_froze_stay_frozen(collector):
    gc.enable()
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with without_cycle_collection():
            made = [[i] for i in range(1_000)]
        assert gc.get_freeze_count() == frozen and gc.isenabled() and made
    finally:
        gc.unfreeze()


def test_the_planning_passes_leave_no_reference_cycle(collector):
    """What without_cycle_collection relies on: every object a pass makes is freed by reference
    counting alone (a cycle would wait for the collector's next full collection: the trace's reader
    once held its own bound method, the validator a dict of its bound methods)."""
    def passes():
        g = mixed_net()
        for config in (MemoryConfig(), MemoryConfig.superneurons(),  # (the cache's second placement)
                       MemoryConfig(liveness=True, offload=True, schedule="H200"),  # retimed copies
                       MemoryConfig.superneurons().replace(fit="offline")):
            program = place(g, config)
            trace_program(program, "all")
            trace_program(program, "paper")
            checker.find_races(program, graph=g)
            timing.estimate(program, g)
        least = search.min_budget(g, MemoryConfig.superneurons()).budget_bytes
        assert probe(g, MemoryConfig.superneurons().replace(budget_bytes=least)) is not None

    gc.disable()
    passes()  # once for what only a first use makes (imports, caches)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        passes()
        gc.collect()
        left = sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.collect()
    assert not left, f"the passes left objects in reference cycles: {left}"


def test_the_main_objects_show_in_one_line_whatever_the_net():
    """A notebook displayed a search's result as ten kilobytes of StepRecords (the dataclasses' own
    reprs list every step, op and instruction); a Graph and a Model showed only their address."""
    from snlite import Model, Scheduler, simulate
    from snlite.models import get_model

    g = get_model("alexnet", 4)
    sn = MemoryConfig.superneurons()
    found = search.max_batch(lambda b: get_model("lenet", b),
                             MemoryConfig(liveness=True, budget_bytes=8 << 20))
    shown = {"graph": g, "trace": simulate(g, sn), "program": place(g, sn), "plan": Scheduler(g, sn).plan(),
             "model": Model(g, device="meta"), "found": found}
    for what, obj in shown.items():
        text = repr(obj)
        assert "\n" not in text and len(text) < 900, (what, len(text), text[:200])
    assert repr(g) == "Graph('alexnet', input (4, 3, 227, 227), 25 layers, 1000 classes)"


def test_the_api_s_small_refusals_say_what_to_write():
    """g.concat(a, b) took b for the name; lenet's input_shape with the batch failed to unpack; a JSON
    string given to from_json was "found 'str'"; tab completion offered importlib and import_module."""
    import snlite
    from snlite import Graph, Program
    from snlite.models import lenet

    g = Graph((2, 3, 8, 8), 4)
    x = g.input()
    with pytest.raises(ValueError, match=r"concat takes its inputs as one list: g\.concat\(\[a, b"):
        g.concat(x, x)
    with pytest.raises(ValueError, match=r"lenet's input_shape is one image, \(C, H, W\), without the batch"):
        lenet(4, input_shape=(4, 1, 8, 8))
    with pytest.raises(ValueError, match=r"from_json\(json\.loads\(text\)\), or Program\.load\(path\)"):
        Program.from_json('{"format": "snlite-program/1"}')
    shown = dir(snlite)
    assert {"Graph", "simulate", "search", "budget", "offline"} <= set(shown)
    assert not {"importlib", "import_module", "_WHERE"} & set(shown)


def test_a_graph_changes_only_through_its_builders_and_copies_whole():
    """g.layers.pop("relu1") left the steps compiled from the whole graph cached, and simulate(g) then
    failed with a KeyError far from the edit."""
    import copy
    import pickle

    from snlite.models import get_model
    from snlite.pipeline import simulate

    g = get_model("lenet", 2)
    with pytest.raises((TypeError, AttributeError)):
        g.layers.pop("relu1")
    with pytest.raises(TypeError):
        g.layers["extra"] = g.layers["relu1"]
    for twin in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert list(twin.layers) == list(g.layers) and simulate(twin).peak_bytes == simulate(g).peak_bytes
