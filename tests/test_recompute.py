"""Recomputation as the paper does it, pinned on the paper's own experiment (AlexNet, batch 200):
every expected number below is derived here from first principles (the layer shapes, cuDNN's
dependency rules, the segment structure), never copied from a run.

Fig. 10: the peak of one training iteration (the paper's count: activations and their gradients,
each at its own size) under the baseline, liveness, + offload and + cost-aware recomputation, with
the step where it happens and how many tensors are live there. Table 1: the peaks and forward
re-runs of the three recomputation strategies."""
import pytest

from snlite import MemoryConfig, simulate
from snlite.liveness import step_tensors
from snlite.models import alexnet, get_model
from snlite.recompute import expand, forward_steps, segments, step_bytes
from snlite.scheduler import PERSISTENT_KINDS

N = 200  # the paper's batch


def _out(size, k, s, p=0):
    return (size + 2 * p - k) // s + 1


# AlexNet (Caffe's, 227x227): every activation's bytes from the layer shapes, fp32
H1 = _out(227, 11, 4)  # conv1: 55x55
H2 = _out(H1, 3, 2)  # pool1: 27x27 (conv2 keeps it: 5x5, padding 2)
H3 = _out(H2, 3, 2)  # pool2: 13x13 (conv3-5 keep it)
H5 = _out(H3, 3, 2)  # pool5: 6x6
A1 = 4 * N * 96 * H1 * H1  # conv1, relu1, norm1
P1 = 4 * N * 96 * H2 * H2  # pool1
A2 = 4 * N * 256 * H2 * H2  # conv2, relu2, norm2
P2 = 4 * N * 256 * H3 * H3  # pool2, conv5, relu5
A3 = 4 * N * 384 * H3 * H3  # conv3, relu3, conv4, relu4
P5 = 4 * N * 256 * H5 * H5  # pool5
F = 4 * N * 4096  # fc6, relu6, drop6, fc7, relu7, drop7
C = 4 * N * 1000  # fc8, the softmax's probabilities
D = 4 * N * 3 * 227 * 227  # the input batch (not counted), and its gradient (counted)
LOSS = 4
MIB = 2**20

# every layer's output once: 24 tensors (the loss scalar is the softmax layer's second output)
OUTPUTS = 3 * A1 + P1 + 3 * A2 + P2 + 4 * A3 + 2 * P2 + P5 + 6 * F + 2 * C + LOSS
# every gradient as cuDNN gives them: a new buffer for each backward's dx, except ReLU, LRN and
# softmax, which write dx into dy's buffer; dropout's backward writes its own dx. From the top:
# fc8 -> drop7.grad, drop7 -> relu7.grad, fc7 -> drop6.grad, drop6 -> relu6.grad, fc6 -> pool5's,
# pool5 -> relu5.grad, conv5 -> relu4.grad, conv4 -> relu3.grad, conv3 -> pool2.grad,
# pool2 -> norm2.grad, conv2 -> pool1.grad, pool1 -> norm1.grad, conv1 -> the input's: 13 buffers
GRADIENTS = 4 * F + P5 + P2 + 2 * A3 + P2 + A2 + P1 + A1 + D

# cheap layers each
SEGMENTS = {"conv1": 3, "conv2": 3, "conv3": 1, "conv4": 1, "conv5": 2, "fc6": 2, "fc7": 2}


@pytest.fixture(scope="module")
def net():
    return alexnet(batch=N)


def _run(net, **config):
    return simulate(net, MemoryConfig(count="paper", **config))


def _at_peak(trace):
    r = trace.steps[trace.peak_op]
    return r.layer, r.phase, len(trace.peak_tensors)


def test_the_shapes_are_alexnets(net):
    """The derivation's sizes are the model's (a guard for the numbers below, not a result)."""
    t = net.tensors()
    assert (t["conv1"].nbytes, t["pool1"].nbytes, t["conv2"].nbytes, t["pool2"].nbytes, t["conv3"].nbytes,
            t["pool5"].nbytes, t["fc6"].nbytes, t["fc8"].nbytes) == (A1, P1, A2, P2, A3, P5, F, C)
    assert {root: sum(1 for l, r in segments(net).items() if r == root and not net.layers[l].alias_input)
            for root in set(segments(net).values())} == SEGMENTS


def test_l_peak_is_norm1s_backward_with_its_in_place_dx_counted_once(net):
    """l_peak: relu1's output (x), norm1's (y) and norm1's gradient (dy), into which LRN's backward
    writes dx. The trace and the recompute threshold agree on it."""
    persistent = {n for n, t in net.tensors().items() if t.kind in PERSISTENT_KINDS}
    sizes = step_bytes(net.steps(), net.tensors(), persistent)
    top = net.steps()[sizes.index(max(sizes))]
    assert (top.layer, top.phase, max(sizes)) == ("norm1", "backward", 3 * A1)
    assert _run(net).l_peak_bytes == 3 * A1
    assert step_tensors(top.reads, top.writes, top.inplace) == {"relu1", "norm1", "norm1.grad"}


def test_fig10_baseline_holds_every_output_and_every_gradient(net):
    trace = _run(net)
    assert trace.peak_bytes == OUTPUTS + GRADIENTS  # 2,189.44 MiB
    assert _at_peak(trace) == ("conv1", "backward", 24 + 13)  # the last buffer: the input's gradient


def test_fig10_liveness_peaks_at_pool5s_backward(net):
    """Every forward output some backward step still reads (conv1 ... pool5: 15 of them; the input
    is not counted), pool5's gradient (dy) and its dx, relu5.grad."""
    trace = _run(net, liveness=True)
    forward = 3 * A1 + P1 + 3 * A2 + P2 + 4 * A3 + 2 * P2 + P5
    assert trace.peak_bytes == forward + P5 + P2  # 1,489.36 MiB
    assert _at_peak(trace) == ("pool5", "backward", 15 + 2)


def test_fig10_offload_peaks_at_pool2s_backward(net):
    """CONV outputs wait on the host until the backward needs them: at pool2's backward, conv1's
    cheap outputs (relu1, norm1, pool1), conv2's output (back for relu2's backward) and its cheap
    outputs, pool2's gradient and its dx, norm2.grad."""
    trace = _run(net, liveness=True, offload=True)
    assert trace.peak_bytes == (2 * A1 + P1) + (A2 + 2 * A2 + P2) + P2 + A2  # 1,132.06 MiB
    assert _at_peak(trace) == ("pool2", "backward", 9)


def test_fig10_recompute_peaks_at_norm1s_backward(net):
    """With cost-aware recomputation on top: conv1's segment is memory-centric; rebuilding relu1
    for norm1's backward holds conv1 (back from the host), relu1, norm1 (kept from pool1's backward,
    which read it too) and norm1's gradient: four conv1-sized tensors."""
    trace = _run(net, liveness=True, offload=True, recompute="cost_aware")
    assert trace.peak_bytes == 4 * A1  # 886.23 MiB
    assert _at_peak(trace) == ("relu1", "recompute", 4) and trace.steps[trace.peak_op].step == \
        next(s.index for s in net.steps() if (s.layer, s.phase) == ("norm1", "backward"))


def _reruns_memory_centric():
    """m(m+1)/2 per segment of m cheap layers: before the next checkpoint's backward the chain is
    rebuilt whole (m); the last layer's backward reads that output again (kept) and its own input
    (m - 1 re-runs), and so on down to the first, whose input is the checkpoint (0)."""
    return sum(m * (m + 1) // 2 for m in SEGMENTS.values())


def _speed_centric_segments():
    """Which segments cost-aware rebuilds once: those whose speed-centric peak fits l_peak (3 A1).
    conv1's holds conv1, relu1, norm1, pool1, pool1's gradient and norm1's at pool1's backward:
    4 A1 + 2 P1 > 3 A1. conv2's holds at most conv2, relu2, norm2, pool2 and the two gradients of
    pool2's backward: 4 A2 + 2 P2 <= 3 A1. The rest are smaller still."""
    assert 4 * A1 + 2 * P1 > 3 * A1 and 4 * A2 + 2 * P2 <= 3 * A1
    assert max(2 * A3 + A3, 3 * P2 + 2 * P5 + P2, 3 * F + 2 * F) <= 3 * A1
    return {root for root in SEGMENTS if root != "conv1"}


def test_table1_alexnet_strategies(net):
    """The paper's Table 1 for AlexNet: peaks and re-runs of the three strategies (on liveness)."""
    speed = _run(net, liveness=True, recompute="speed")
    memory = _run(net, liveness=True, recompute="memory")
    cost = _run(net, liveness=True, recompute="cost_aware")
    assert speed.recompute_count == sum(SEGMENTS.values()) == 14  # every cheap layer once
    assert memory.recompute_count == _reruns_memory_centric() == 23
    fast = _speed_centric_segments()
    assert cost.recompute_count == sum(m if root in fast else m * (m + 1) // 2
                                       for root, m in SEGMENTS.items()) == 17
    assert speed.peak_bytes == 4 * A1 + 2 * P1  # 993.02 MiB, at pool1's backward
    assert memory.peak_bytes == cost.peak_bytes == 4 * A1  # 886.23 MiB: cost-aware, as few re-runs, same peak
    _, info = expand(net, "cost_aware", {n for n, t in net.tensors().items() if t.kind in PERSISTENT_KINDS})
    assert {r for r, s in info.segment_strategy.items() if s == "speed"} == fast


@pytest.mark.parametrize("name", ["alexnet", "vgg16"])
def test_memory_centric_costs_m_m_plus_1_over_2_per_chain_segment(name):
    """On chain networks whose cheap layers' backward steps read x and y (ReLU, pooling, LRN) or
    nothing saved (dropout), memory-centric costs exactly sum m(m+1)/2 and speed-centric sum m."""
    g = get_model(name, 2)
    sizes = {}
    for layer, root in segments(g).items():
        if not g.layers[layer].alias_input:
            sizes[root] = sizes.get(root, 0) + 1
    assert expand(g, "speed")[1].count == sum(sizes.values())
    assert expand(g, "memory")[1].count == sum(m * (m + 1) // 2 for m in sizes.values())


def test_dropout_saves_nothing_so_its_backward_needs_no_rerun(net):
    """Dropout's backward reads only dy (its mask is drawn again from the seed): no re-run serves it."""
    ops, _ = expand(net, "memory")
    served = {op.step for op in ops if op.phase == "recompute"}
    drops = {s.index for s in net.steps() if s.layer.startswith("drop") and s.phase == "backward"}
    assert drops and not drops & served
    assert not [t for t in net.tensors() if t.startswith("drop") and t.endswith("mask")]


@pytest.mark.parametrize("name", ["alexnet", "resnet50", "inception_v4"])
def test_forward_steps_are_the_routes_first_half(name):
    """The recompute stage walks only the forward half of the route where it wants forward steps:
    that half must be every forward step, in route order, and nothing else."""
    g = get_model(name, 1)
    assert forward_steps(g) == [s for s in g.steps() if s.phase == "forward"]
    assert [s.layer for s in forward_steps(g)] == g.route()[0]
