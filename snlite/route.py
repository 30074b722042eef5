"""The execution route: SuperNeurons' Algorithm 1 (docs/paper.md section 2), on plain data.

Forward: depth-first from the data layer. Each layer counts how many of its predecessors have
called it; a join runs only when the count reaches its number of inputs, then recurses into its
successors in order. Backward: the same algorithm on the reversed graph, from the last layer, so
a fork waits until the backward steps of all its successors have called it.

Works on any DAG given as ``{node: [successors in order]}``; iterative, so a ResNet with 10,000
layers does not hit Python's recursion limit.
"""
from __future__ import annotations


def join_counting_dfs(successors: dict, start, predecessors: dict | None = None) -> list:
    """Visit order of Algorithm 1 from ``start`` over ``successors`` (node -> ordered list);
    ``predecessors``, the reversed graph, where the caller has it already."""
    if predecessors is None:
        predecessors = reverse(successors)
    waiting = {node: len(p) for node, p in predecessors.items()}  # the predecessors yet to call each node
    order = [start]
    calls = list(reversed(successors.get(start, ())))  # the calls still to make, the next one last
    while calls:
        nxt = calls.pop()
        waiting[nxt] -= 1
        if waiting[nxt] == 0:  # the last predecessor has called: the join runs now, and calls its successors
            order.append(nxt)
            calls.extend(reversed(successors.get(nxt, ())))
    return order


def reverse(successors: dict) -> dict:
    """The reversed graph; each node's new successors are its predecessors in edge order."""
    preds: dict = {node: [] for node in successors}
    for node, succ in successors.items():
        for s in succ:
            preds.setdefault(s, []).append(node)
    return preds


def execution_route(successors: dict, source) -> tuple[list, list]:
    """``(forward, backward)``: the forward visit order from ``source``, and the backward order,
    the same algorithm on the reversed graph from the last forward node."""
    predecessors = reverse(successors)
    forward = join_counting_dfs(successors, source, predecessors)
    missing = set(successors) - set(forward)
    if missing:
        raise ValueError(f"layers not reachable from {source!r} (or part of a cycle): "
                         f"{sorted(map(str, missing))}")
    backward = join_counting_dfs(predecessors, forward[-1], successors)
    if len(backward) != len(forward):
        ends = [str(n) for n in forward if not successors.get(n)]  # outputs: layers that feed nothing
        raise ValueError(f"the network has more than one output layer: {ends} feed nothing, and only the "
                         "loss may end a network, so the backward route cannot reach "
                         f"{sorted(map(str, set(forward) - set(backward)))}; use or remove every other "
                         "output (each layer's output must lead to the loss)")
    return forward, backward
