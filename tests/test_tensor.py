"""The tensor state machine: every legal move works, every illegal one raises and changes nothing."""
import dataclasses
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snlite.tensor import KINDS, MOVES, TRANSITIONS, IllegalTransition, State, Tensor, describe_transitions

DEVICE_OFFSET, HOST_OFFSET, PREFETCH_OFFSET = 4096, 8192, 12288


def do(t: Tensor, move: str):
    """Perform ``move`` on ``t`` with placeholder offsets; give_buffer is take_buffer seen from the giver."""
    if move == "allocate":
        return t.allocate(DEVICE_OFFSET)
    if move == "take_buffer":
        giver = Tensor("giver", t.nbytes)
        giver.allocate(PREFETCH_OFFSET)
        return t.take_buffer(giver)
    if move == "give_buffer":
        return Tensor("receiver", t.nbytes).take_buffer(t)
    if move == "start_offload":
        return t.start_offload(HOST_OFFSET)
    if move == "start_prefetch":
        return t.start_prefetch(PREFETCH_OFFSET)
    return getattr(t, move)()


def paths_from_unallocated() -> dict[State, list[str]]:
    """Breadth-first search over MOVES: the shortest list of moves that reaches each state."""
    paths, queue = {State.UNALLOCATED: []}, deque([State.UNALLOCATED])
    while queue:
        s = queue.popleft()
        for move, (sources, target) in MOVES.items():
            if s in sources and target not in paths:
                paths[target] = paths[s] + [move]
                queue.append(target)
    return paths


PATHS = paths_from_unallocated()


def tensor_in(state: State) -> Tensor:
    t = Tensor("conv1", 1000)
    for move in PATHS[state]:
        do(t, move)
    assert t.state is state
    return t


def snapshot(t: Tensor) -> dict:
    return dataclasses.asdict(t)


def test_every_state_is_reachable_and_transitions_come_from_the_moves():
    assert set(PATHS) == set(State)
    for s in State:
        assert TRANSITIONS[s] == {dst for srcs, dst in MOVES.values() if s in srcs}
    assert all(TRANSITIONS[s] for s in State)  # no dead end: even FREED can be revived
    table = describe_transitions()
    assert all(s.name in table for s in State) and all(m in table for m in MOVES)


@pytest.mark.parametrize("state", list(State), ids=lambda s: s.name)
@pytest.mark.parametrize("move", list(MOVES))
def test_each_move_is_legal_exactly_from_its_source_states(state, move):
    t = tensor_in(state)
    sources, target = MOVES[move]
    if state in sources:
        do(t, move)
        assert t.state is target and target in TRANSITIONS[state]
        assert t.resident == (t.offset is not None)
    else:
        before = snapshot(t)
        with pytest.raises(IllegalTransition) as info:
            do(t, move)
        msg = str(info.value)
        assert "'conv1'" in msg and state.name in msg and move in msg, msg
        assert (info.value.tensor_name, info.value.state, info.value.move) == ("conv1", state, move)
        assert snapshot(t) == before, "an illegal move must change nothing"


def test_offload_prefetch_cycle_returns_the_offsets_to_free():
    t = Tensor("conv1", 1000)
    t.allocate(256)
    assert t.readable and t.resident and not t.host_valid
    assert t.start_offload(HOST_OFFSET) is True  # no host copy yet: a real copy must run
    assert t.readable and t.resident  # still on the device while the copy runs
    assert t.finish_offload() == 256
    assert (t.state, t.offset, t.host_offset, t.host_valid) == (State.ON_HOST, None, HOST_OFFSET, True)
    assert not t.resident and not t.readable
    t.start_prefetch(512)
    assert t.resident and not t.readable  # holds device memory, but the copy is still in flight
    t.finish_prefetch()
    assert (t.state, t.offset, t.host_valid) == (State.ON_DEVICE, 512, True)
    assert t.start_offload() is False  # clean eviction: the host copy still matches
    assert t.finish_offload() == 512
    t.start_prefetch(768)
    t.finish_prefetch()
    t.mark_written()
    assert t.start_offload() is True  # written since: copy again
    t.finish_offload()
    assert t.free() is None and t.state is State.FREED and t.host_offset == HOST_OFFSET
    assert t.release_host() == HOST_OFFSET and t.host_offset is None


def test_drop_free_and_revive():
    t = Tensor("relu1", 64)
    t.allocate(1024)
    assert t.drop() == 1024 and t.state is State.DROPPED and t.offset is None
    t.allocate(2048)  # recomputation rebuilds it
    assert t.free() == 2048 and t.offset is None
    t.allocate(0)  # next iteration
    assert t.state is State.ON_DEVICE and t.offset == 0


def test_take_buffer_hands_the_block_over_without_freeing_it():
    x, y = Tensor("bn1", 100), Tensor("relu1", 100)
    for move in ("allocate", "start_offload", "finish_offload", "start_prefetch", "finish_prefetch", "drop"):
        do(y, move)
    assert y.state is State.DROPPED and y.host_valid  # the receiver had a matching host copy...
    x.allocate(3072)
    x.locked = True
    y.take_buffer(x)
    assert (y.state, y.offset, y.host_valid) == (State.ON_DEVICE, 3072, False)  # ...now stale
    assert (x.state, x.offset, x.locked) == (State.FREED, None, False)
    z, w = Tensor("a", 1), Tensor("b", 1)
    w.allocate(0)
    w.start_offload(HOST_OFFSET)
    before = (snapshot(z), snapshot(w))
    with pytest.raises(IllegalTransition, match="'b' is OFFLOADING: cannot give_buffer"):
        z.take_buffer(w)
    assert (snapshot(z), snapshot(w)) == before
    v = Tensor("v", 1)
    with pytest.raises(IllegalTransition, match="its own buffer"):
        v.take_buffer(v)


def test_locked_tensors_cannot_be_evicted():
    t = tensor_in(State.ON_DEVICE)
    t.locked = True
    for move in ("start_offload", "drop"):
        with pytest.raises(IllegalTransition, match="locked"):
            do(t, move)
        assert t.state is State.ON_DEVICE
    t.locked = False
    assert t.drop() == DEVICE_OFFSET


def test_writes_and_host_slots_are_checked():
    for state in State:
        t = tensor_in(state)
        if state is State.ON_DEVICE:
            t.mark_written()
        else:
            with pytest.raises(IllegalTransition, match="mark_written"):
                t.mark_written()
        if state in (State.OFFLOADING, State.ON_HOST, State.PREFETCHING):
            with pytest.raises(IllegalTransition, match="host copy is in use"):
                t.release_host()
    t = tensor_in(State.ON_DEVICE)
    with pytest.raises(ValueError, match="needs a host slot"):
        t.start_offload()
    t.start_offload(HOST_OFFSET)
    t.finish_offload()
    t.start_prefetch(0)
    t.finish_prefetch()
    with pytest.raises(ValueError, match="release_host"):
        t.start_offload(HOST_OFFSET + 256)


def test_kinds_cover_the_graph_and_are_validated():
    from snlite.steps import KINDS as GRAPH_KINDS

    assert set(GRAPH_KINDS) <= set(KINDS) and "workspace" in KINDS
    with pytest.raises(ValueError, match="kind"):
        Tensor("w", 4, kind="weights")
    with pytest.raises(ValueError, match="nbytes"):
        Tensor("w", -4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(sorted(MOVES)), max_size=30))
def test_random_walks_keep_offsets_consistent_with_residency(moves):
    t = Tensor("t", 10)
    for move in moves:
        legal = t.state in MOVES[move][0]
        before = t.state
        try:
            do(t, move)
        except IllegalTransition:
            assert not legal
            assert t.state is before
        else:
            assert legal and t.state in TRANSITIONS[before]
        assert t.resident == (t.offset is not None)
        assert t.readable <= t.resident
        if t.state is State.ON_HOST:
            assert t.host_valid and t.host_offset is not None
