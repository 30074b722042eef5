"""Where did the NaN come from? One forward pass re-run on the host, layer by layer.

:class:`~snlite.train.Model` checks the loss of every training step (the one number it reads
anyway). When it is NaN or infinite, this module finds where the first non-finite value appeared:
it runs the forward route again with the host device's NumPy kernels (``kernels.host``'s fast
versions, else each kernel's reference), from the model's parameters
(``Model.params``) and the same batch, iteration and seed (so dropout draws the same masks), and
looks at the input batch, then, layer by layer in route order, each layer's parameters and output.

    from snlite import anomaly
    anomaly.first_nonfinite(model.graph, model.params, x, labels, iteration=model.iteration, seed=model.seed)
    # "layer 'conv2' (conv2d): its output has 24 NaN of 2,304 values (the first at (0, 0, 0, 0)) ..."

It never touches the memory runtime: it needs only the graph, the parameters, the batch and the
host's kernels, so it works the same whatever the device and the MemoryConfig (which never change
the numbers); on the host device it repeats the step's forward pass bit for bit. ``snlite train
--anomaly`` (``Model(..., anomaly=True)``) runs it after every step, not only after a non-finite
loss: it slows training down, and finds a NaN or an infinity that never reached the loss (an
input's -inf that a ReLU turned into 0, say).
"""
from __future__ import annotations

import numpy as np

from kernels import all_ops
from kernels._common import LAUNCH_ONLY
from kernels.host import host_kernel
from snlite.executor import dropout_seed  # the runtime's per-layer seed, so a re-run draws the same masks
from snlite.layers import StepIO


class NonFiniteError(ValueError):
    """Training met a NaN or an infinity; the message says at which iteration and where it came from."""


def _references():
    """``run(op_name, *args, **kwargs)`` with what the host device runs: kernels.host's fast version
    of the op where there is one (it agrees with the reference), else
    its NumPy reference."""
    ops = all_ops()

    def run(op_name, *args, **kwargs):
        host_kernel(ops[op_name])(*args, **{k: v for k, v in kwargs.items() if k not in LAUNCH_ONLY})
    return run


def describe(a: np.ndarray) -> str | None:
    """None if ``a`` is finite, else e.g.
    ``3 NaN and 1 inf of 2,304 values (the first at (0, 1, 0, 2): nan)``."""
    a = np.asarray(a)
    bad = ~np.isfinite(a)
    if not bad.any():
        return None
    found = ((np.isnan(a).sum(), "NaN"), (np.isposinf(a).sum(), "+inf"), (np.isneginf(a).sum(), "-inf"))
    counts = [f"{int(n):,d} {what}" for n, what in found if n]
    first = tuple(int(i) for i in np.argwhere(bad)[0])
    return f"{' and '.join(counts)} of {a.size:,d} values (the first at {first}: {float(a[first])})"


def forward_outputs(graph, params: dict, x, labels=None, *, train: bool = True, iteration: int = 0,
                    seed: int = 0):
    """Run one forward pass on the host with the host device's kernels and yield, in route order,
    ``(layer name, output)``; for the loss layer the output is the loss (a 1-element array).
    ``params``: weights and buffers by name, as ``Model.params`` (copied: BatchNorm's running
    statistics are not changed). ``train``: batch statistics and dropout, else inference."""
    index = {name: i for i, name in enumerate(graph.layers)}  # the runtime's layer numbering, for the seeds
    run, acts = _references(), {}
    labels = None if labels is None else np.ascontiguousarray(labels, dtype=np.int32)
    for name in graph.route()[0]:
        layer = graph.layers[name]
        if layer.kind == "data":
            acts[name] = np.ascontiguousarray(x, dtype=np.float32)
            yield name, acts[name]
            continue
        xs = [acts[i] for i in graph.inputs[name]]
        if layer.alias_input:  # flatten: the input's storage, reshaped
            acts[name] = xs[0].reshape(layer.out_shape)
            yield name, acts[name]
            continue
        if layer.kind == "softmax_loss" and labels is None:
            return  # inference ends at the logits
        io = StepIO(run=run, x=xs, y=np.empty(layer.out_shape, np.float32), labels=labels, train=train,
                    seed=dropout_seed(seed, iteration, index[name]))
        io.params = {p: np.array(params[layer.state_name(p)], np.float32) for p in layer.params()}
        io.buffers = {b: np.array(params[layer.state_name(b)], np.float32) for b in layer.buffers()}
        io.saved = {s: np.empty(shape, dtype) for s, (shape, dtype) in layer.saved().items()}
        with np.errstate(all="ignore"):
            layer.forward(io)
        acts[name] = io.y
        yield name, (io.saved["loss"] if layer.kind == "softmax_loss" else io.y)


def first_nonfinite(graph, params: dict, x, labels=None, *, train: bool = True, iteration: int = 0,
                    seed: int = 0) -> str | None:
    """Where the first NaN or infinity of one forward pass appears, as a sentence: the input batch,
    a layer's parameters (the weights themselves), or a layer's output whose inputs and parameters
    are all finite. None if the whole forward pass is finite (then the device and the host's kernels
    disagree, or the trouble is in the backward pass)."""
    route, outs = graph.route()[0], {}
    for name, out in forward_outputs(graph, params, x, labels, train=train, iteration=iteration, seed=seed):
        outs[name] = out
        layer = graph.layers[name]
        if layer.kind == "data":
            bad = describe(out)
            if bad:
                return f"the input batch: it has {bad}"
            continue
        kinds = list(layer.params()) + (list(layer.buffers()) if not train else [])
        for p in kinds:
            bad = describe(params[layer.state_name(p)])
            if bad:
                return (f"the parameters of layer {name!r} ({layer.kind}): {layer.state_name(p)} has {bad}, "
                        f"before "
                        f"this step ran (an earlier update diverged, or it was loaded so: "
                        f"try a lower learning rate)")
        bad = describe(out)
        if bad:
            what = f"the loss is {float(out[0])}" if layer.kind == "softmax_loss" else f"its output has {bad}"
            ins = [outs[i] for i in graph.inputs[name]] + [params[layer.state_name(p)] for p in kinds]
            largest = max(float(np.abs(a).max()) for a in ins if np.size(a))
            hint = ": float32 overflowed (a learning rate too high?)" if largest > 1e15 else ""
            return (f"layer {name!r} ({layer.kind}, forward step {route.index(name)}): {what}, "
                    f"while its inputs and parameters are finite "
                    f"(the largest in magnitude: {largest:.3g}){hint}")
    return None
