"""Liveness analysis: the paper's Fig. 4 table exactly, and invariants on real networks."""
from dataclasses import dataclass

from snlite.liveness import analyze, first_and_last_use, format_table


@dataclass(frozen=True)
class S:
    reads: tuple
    writes: tuple


# docs/paper.md section 3, Fig. 4: DATA0 -> CONV1 -> POOL2 -> FC4 and DATA0 -> CONV3 -> FC4, then
# SOFTMAX5; backward steps 6..11 (cuDNN dependencies: pooling backward reads x, y, dy; conv and FC
# backward read x and dy; softmax backward reads prob; FC4 hands one gradient, t6, to both branches).
FIG4 = [
    ("DATA", S((), ("t0",))),
    ("CONV", S(("t0",), ("t1",))),
    ("POOL", S(("t1",), ("t3",))),
    ("CONV", S(("t0",), ("t2",))),
    ("FC", S(("t3", "t2"), ("t4",))),
    ("SOFTMAX", S(("t4",), ("prob",))),
    ("SOFTMAX bwd", S(("prob",), ("t5",))),
    ("FC bwd", S(("t3", "t2", "t5"), ("t6",))),
    ("POOL bwd", S(("t1", "t3", "t6"), ("t7",))),
    ("CONV bwd", S(("t0", "t7"), ("t8",))),
    ("CONV bwd", S(("t0", "t6"), ("t9",))),
    ("DATA", S(("t8", "t9"), ())),
]

PAPER_TABLE = [  # (in, out) exactly as docs/paper.md section 3 prints them
    ("{}", "{t0}"),
    ("{t0}", "{t0,t1}"),
    ("{t0,t1}", "{t0,t1,t3}"),
    ("{t0,t1,t3}", "{t0,t1,t3,t2}"),
    ("{t0,t1,t3,t2}", "{t0,t1,t3,t2,t4}"),
    ("{t0,t1,t3,t2,t4}", "{t0,t1,t3,t2,prob}"),
    ("{t0,t1,t3,t2,prob}", "{t0,t1,t3,t2,t5}"),
    ("{t0,t1,t3,t2,t5}", "{t0,t1,t3,t6}"),
    ("{t0,t1,t3,t6}", "{t0,t7,t6}"),
    ("{t0,t7,t6}", "{t0,t6,t8}"),
    ("{t0,t6,t8}", "{t8,t9}"),
    ("{t8,t9}", "{}"),
]


def _parse(text):
    return set(filter(None, text.strip("{}").split(",")))


def test_fig4_table_exactly():
    result = analyze([s for _, s in FIG4])
    assert len(result) == len(PAPER_TABLE)
    for r, (want_in, want_out) in zip(result, PAPER_TABLE):
        assert set(r.live_in) == _parse(want_in), f"step {r.step} in"
        assert set(r.live_out) == _parse(want_out), f"step {r.step} out"
    table = format_table(result, [label for label, _ in FIG4])
    assert "SOFTMAX bwd" in table and "{t0,t1,t3,t2,prob}" in table


def test_real_network_invariants():
    from snlite.models import cifar_resnet

    g = cifar_resnet(20, batch=2)
    steps = g.steps()
    persistent = {n for n, t in g.tensors().items() if t.kind in ("weight", "weight_grad", "buffer")}
    result = analyze(steps, persistent)
    first, last = first_and_last_use(steps, persistent)
    for prev, cur in zip(result, result[1:]):
        assert prev.live_out == cur.live_in
    for r, step in zip(result, steps):
        touched = (set(step.reads) | set(step.writes)) - persistent
        assert touched <= set(r.live_in) | set(step.writes), f"step {r.step} reads a tensor that is not live"
        assert set(r.frees) == {t for t in touched if last[t] == r.step}
        assert not (set(r.live_out) & set(r.frees))
    assert result[-1].live_out == ()
    assert not persistent & {t for r in result for t in r.live_out}


def test_frees_after_agrees_with_the_live_sets():
    from snlite.liveness import frees_after
    from snlite.models import cifar_resnet

    g = cifar_resnet(20, batch=2)
    persistent = {n for n, t in g.tensors().items() if t.kind in ("weight", "weight_grad", "buffer")}
    fast = frees_after(g.steps(), persistent)
    for r in analyze(g.steps(), persistent):
        assert tuple(fast.get(r.step, ())) == r.frees
