"""The dataflow check: a read of a value nobody wrote is refused, on hand-made programs (one rule
each) and on every instruction dropped from real ones, while every program the planner makes
passes."""
import pytest

from nets import mixed_net
from snlite.checker import ProgramError, check
from snlite.config import MemoryConfig
from snlite.dataflow import DataflowError, check_dataflow
from snlite.pipeline import place
from snlite.program import Alloc, Copy, Free, HandOver, HostRead, HostWrite, Launch, Program


def tiny(*body, mode="infer", setup=(), extra=None):
    """Two 1 KiB activations x and y, a 1 KiB pinned slot; ``extra`` adds tensors."""
    tensors = {"x": ((256,), "float32", "activation"), "y": ((256,), "float32", "activation"),
               **(extra or {})}
    return Program("tiny", "by hand", mode, "pool", tensors, tuple(setup), tuple(body), 8192, 2048)


ALLOC_X, ALLOC_Y, SLOT = \
    Alloc("x", "arena", 0, 1024), Alloc("y", "arena", 1024, 1024), Alloc("x", "slab", 0, 1024)
WRITE_X = Launch(0, 0, "a", "forward", "compute", (), ("x",))
READ_X = Launch(1, 1, "b", "forward", "compute", ("x",), ("y",))
D2H = Copy("x", "offload", "arena", 0, "slab", 0, 1024, "copy_out")
H2D = Copy("x", "prefetch", "slab", 0, "arena", 0, 1024, "copy_in")


def test_a_kernel_reads_only_what_was_written_before_it():
    check_dataflow(tiny(ALLOC_X, ALLOC_Y, WRITE_X, READ_X))
    with pytest.raises(DataflowError, match=r"body #2 \(launch b forward.*reads x, whose value was never"):
        check_dataflow(tiny(ALLOC_X, ALLOC_Y, READ_X, WRITE_X))
    with pytest.raises(DataflowError, match="reads x"):  # the writer dropped
        check_dataflow(tiny(ALLOC_X, ALLOC_Y, READ_X))


def test_a_fresh_block_holds_no_value_even_where_the_tensor_was_before():
    with pytest.raises(DataflowError, match="reads x"):
        check_dataflow(tiny(ALLOC_X, WRITE_X, Free("x", "arena", 0, 1024), ALLOC_X, ALLOC_Y, READ_X))


def test_a_copy_back_needs_the_copy_out_and_brings_the_value():
    ok = (ALLOC_X, SLOT, WRITE_X, D2H, Free("x", "arena", 0, 1024), ALLOC_X, H2D, ALLOC_Y, READ_X)
    check_dataflow(tiny(*ok))
    with pytest.raises(DataflowError, match=r"launch b forward.*reads x"):
        check_dataflow(tiny(*ok[:3], *ok[4:]))  # the offload dropped: the prefetch brings back nothing
    with pytest.raises(DataflowError, match="reads x"):
        check_dataflow(tiny(*ok[:6], *ok[7:]))  # the prefetch dropped: the new block is empty
    shifted = Copy("x", "prefetch", "slab", 256, "arena", 0, 1024, "copy_in")
    with pytest.raises(DataflowError, match="reads x"):
        check_dataflow(tiny(*ok[:6], shifted, *ok[7:]))
    # a copy of a value never written is harmless until something reads it (an evicted unused input)
    check_dataflow(tiny(ALLOC_X, SLOT, D2H, Free("x", "arena", 0, 1024), ALLOC_X, H2D, ALLOC_Y,
                        WRITE_X, READ_X))


def test_an_in_place_write_ends_the_old_value():
    write_y_over_x = Launch(1, 1, "b", "forward", "compute", ("x",), ("y",), inplace=(("y", "x"),))
    read_x_again = Launch(2, 2, "c", "forward", "compute", ("x",), ())
    check_dataflow(tiny(ALLOC_X, WRITE_X, read_x_again, write_y_over_x, HandOver("y", "x")))
    with pytest.raises(DataflowError, match=r"launch c forward.*reads x"):
        check_dataflow(tiny(ALLOC_X, WRITE_X, write_y_over_x, read_x_again, HandOver("y", "x")))


def test_results_are_read_from_a_slot_their_copy_filled():
    out = Alloc("y:out", "slab", 1024, 256)
    body = (ALLOC_X, ALLOC_Y, WRITE_X, READ_X, out,
            Copy("y", "result", "arena", 1024, "slab", 1024, 1024, "copy_out"), HostRead("y", 1024, 1024))
    check_dataflow(tiny(*body))
    with pytest.raises(DataflowError, match="reads y from a pinned slot that does not hold it"):
        check_dataflow(tiny(*body[:5], body[6]))


def test_the_input_layer_names_the_batch_but_its_copy_writes_it():
    extra = {"data": ((256,), "float32", "input"), "data:in": ((256,), "float32", "input")}
    data_step = Launch(0, 0, "data", "forward", "compute", (), ("data",))
    use = Launch(1, 1, "conv", "forward", "compute", ("data",), ("x",))
    body = [Alloc("data:in", "slab", 0, 1024), Alloc("data", "arena", 2048, 1024), HostWrite("data", 0, 1024),
            Copy("data", "input", "slab", 0, "arena", 2048, 1024, "copy_in"), data_step, ALLOC_X, use]
    check_dataflow(tiny(*body, extra=extra))
    with pytest.raises(DataflowError, match="reads data"):
        check_dataflow(tiny(*body[:3], *body[4:], extra=extra))  # the input copy dropped
    with pytest.raises(DataflowError, match="reads data"):
        check_dataflow(tiny(*body[:2], *body[3:], extra=extra))  # the host's write of the batch dropped


WEIGHTS = {"w": ((256,), "float32", "weight"), "w.grad": ((256,), "float32", "weight_grad"),
           "w.momentum": ((256,), "float32", "optimizer")}
SETUP = (Alloc("w", "arena", 4096, 1024), Alloc("w.grad", "arena", 5120, 1024),
         Alloc("w.momentum", "arena", 6144, 1024))
FORWARD = Launch(0, 0, "a", "forward", "compute", ("w",), ("x",))
BACKWARD = Launch(1, 1, "a", "backward", "compute", ("x", "w"), ("w.grad",))
UPDATE = Launch(2, 1, "a", "update", "compute", ("w", "w.grad", "w.momentum"), ("w", "w.momentum"))


def test_a_weight_is_updated_once_after_its_gradient_and_never_touched_after():
    def train(*body):
        return tiny(ALLOC_X, *body, mode="train", setup=SETUP, extra=WEIGHTS)

    check_dataflow(train(FORWARD, BACKWARD, UPDATE))
    with pytest.raises(DataflowError, match="reads w.grad, whose value was never written"):
        check_dataflow(train(FORWARD, UPDATE, BACKWARD))  # last iteration's gradient is not this one's
    with pytest.raises(DataflowError, match="never updates w"):
        check_dataflow(train(FORWARD, BACKWARD))
    with pytest.raises(DataflowError, match="updates w a second time"):
        check_dataflow(train(FORWARD, BACKWARD, UPDATE, UPDATE))
    late_read = Launch(3, 2, "b", "backward", "compute", ("w",), ())
    with pytest.raises(DataflowError, match="touches w after the SGD update of w"):
        check_dataflow(train(FORWARD, BACKWARD, UPDATE, late_read))


def test_a_grads_program_leaves_every_gradient_and_an_update_program_reads_them():
    grads = tiny(ALLOC_X, FORWARD, BACKWARD, mode="grads", setup=SETUP, extra=WEIGHTS)
    check_dataflow(grads)
    with pytest.raises(DataflowError, match="leaves w.grad unwritten"):
        check_dataflow(tiny(ALLOC_X, FORWARD, mode="grads", setup=SETUP, extra=WEIGHTS))
    check_dataflow(tiny(UPDATE, mode="update", setup=SETUP, extra=WEIGHTS))


@pytest.mark.parametrize("config", [MemoryConfig.baseline(), MemoryConfig.superneurons(),
                                    MemoryConfig(liveness=True, offload=True, allocator="raw"),
                                    MemoryConfig.superneurons(update_in_backward=True,
                                                              optimizer_state="host")],
                         ids=["baseline", "superneurons", "raw", "in backward, momentum on the host"])
def test_the_planners_programs_pass_and_every_dropped_kernel_or_copy_is_refused(config):
    g = mixed_net()
    for mode in ("train", "grads", "update", "infer"):
        program = place(g, config, mode)
        check_dataflow(program)
        for i, ins in enumerate(program.body):
            if type(ins) in (Launch, Copy, HostWrite) and (ins.writes if type(ins) is Launch else True):
                if type(ins) is Launch and all(program.spec(n)[2] == "input" for n in ins.writes):
                    continue  # the input layer's step: it writes nothing
                with pytest.raises((DataflowError, ProgramError)):
                    check(program.without(i))


def test_momentum_kept_on_the_host_must_go_back_after_its_update():
    on_host = (Alloc("w", "arena", 4096, 1024), Alloc("w.grad", "arena", 5120, 1024),
               Alloc("w.momentum", "slab", 0, 1024))
    fetch = (Alloc("w.momentum", "arena", 6144, 1024),
             Copy("w.momentum", "state", "slab", 0, "arena", 6144, 1024, "copy_in"))
    back = Copy("w.momentum", "state", "arena", 6144, "slab", 0, 1024, "copy_out")
    body = (ALLOC_X, FORWARD, BACKWARD, *fetch, UPDATE, back, Free("w.momentum", "arena", 6144, 1024))
    check_dataflow(tiny(*body, mode="train", setup=on_host, extra=WEIGHTS))
    with pytest.raises(DataflowError, match="the pinned slot of w.momentum does not hold its new value"):
        check_dataflow(tiny(*body[:6], *body[7:], mode="train", setup=on_host, extra=WEIGHTS))
    with pytest.raises(DataflowError, match="reads w.momentum"):  # the copy in dropped
        check_dataflow(tiny(*body[:4], *body[5:], mode="train", setup=on_host, extra=WEIGHTS))


def test_an_inference_program_may_evict_the_labels_it_never_reads():
    """Under a tight budget the LRU cache evicts whatever is idle, the unused labels of an inference
    program included: a copy of a value never written, harmless, which the check must accept."""
    g = mixed_net(n=4)
    config = MemoryConfig(cache=True)  # (with liveness, inference frees enough that nothing need leave)
    program = place(g, config.replace(budget_bytes=place(g, config, "infer").arena_bytes - 1024), "infer")
    assert any(type(i) is Copy and i.tensor == "labels" and i.to_host for i in program.body)
    check_dataflow(program)
    check(program, graph=g)


def test_results_sent_to_the_host_are_read_and_training_returns_its_loss():
    program = place(mixed_net(), MemoryConfig(liveness=True, offload=True), "grads")
    reads = [i for i, ins in enumerate(program.body) if type(ins) is HostRead]
    check_dataflow(program)
    for i in reads:  # the loss and the logits: dropping either read loses what Model returns
        with pytest.raises(DataflowError,
                           match=f"{program.body[i].tensor} is copied to the host as a result, but"):
            check_dataflow(program.without(i))
