"""Algorithm 1, the execution route, on the paper's Fig. 6 example and on built graphs."""
import pytest

from snlite.route import execution_route, join_counting_dfs, reverse

FIG6_EDGES = "a-b, b-c, b-d, c-e, d-f, f-g, f-h, e-i, g-i, h-i, i-j"


def _graph(edges):
    succ = {}
    for e in edges.split(", "):
        a, b = e.split("-")
        succ.setdefault(a, []).append(b)
        succ.setdefault(b, [])
    return succ


def test_fig6_route_exactly():
    forward, backward = execution_route(_graph(FIG6_EDGES), "a")
    steps = [f"{n}{i}" for i, n in enumerate(forward + backward, start=1)]
    assert " ".join(steps) == "a1 b2 c3 e4 d5 f6 g7 h8 i9 j10 j11 i12 e13 c14 g15 h16 f17 d18 b19 a20"


def test_join_waits_for_all_inputs_and_every_node_once():
    succ = _graph(FIG6_EDGES)
    order = join_counting_dfs(succ, "a")
    assert sorted(order) == sorted(succ)
    pos = {n: i for i, n in enumerate(order)}
    for node, targets in succ.items():
        for t in targets:
            assert pos[node] < pos[t], f"{t} ran before its input {node}"
    back = join_counting_dfs(reverse(succ), "j")
    bpos = {n: i for i, n in enumerate(back)}
    for node, targets in succ.items():
        for t in targets:
            assert bpos[t] < bpos[node], f"backward of fork {node} ran before its successor {t}"


def test_deep_chain_does_not_recurse():
    n = 20000
    succ = {i: [i + 1] for i in range(n)}
    succ[n] = []
    forward, backward = execution_route(succ, 0)
    assert forward == list(range(n + 1)) and backward == forward[::-1]


def test_unreachable_and_multiple_outputs_are_named():
    with pytest.raises(ValueError, match="not reachable.*'z'"):
        execution_route({"a": ["b"], "b": [], "z": ["b"]}, "a")
    with pytest.raises(ValueError, match=r"more than one output layer: \['b', 'c'\] feed nothing"):
        execution_route({"a": ["b", "c"], "b": [], "c": []}, "a")


def test_a_layer_whose_output_the_loss_never_uses_is_named():
    """A ReLU nobody reads is a second output: the error names it (it named only the layers the
    backward route missed, conv1 and data among them, though both lead to the loss)."""
    from snlite import Graph, simulate

    g = Graph((2, 1, 8, 8), 3)
    a = g.conv2d(g.input(), 2, 3, padding=1, name="conv1")
    g.relu(a, name="unused")
    g.softmax_loss(g.linear(g.flatten(a), 3))
    with pytest.raises(ValueError, match=r"more than one output layer: \[.*'unused'.*\] feed nothing.*use or "
                                         r"remove every other output"):
        simulate(g)
