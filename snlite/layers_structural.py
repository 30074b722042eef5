"""The layers that shape the graph rather than compute features: its ends (:class:`Data`, the
batch and its labels; :class:`SoftmaxLoss`, the loss), its joins (:class:`Add`, residual sums;
:class:`Concat`, channel concatenation), the channel moves of ShuffleNet (:class:`Narrow`, a slice of
the channels; :class:`ChannelShuffle`) and :class:`Flatten`, which only reshapes. The layers
that compute features are in :mod:`snlite.layers`.
"""
from __future__ import annotations

import math

from snlite.layers_base import Layer


class Data(Layer):
    """The input batch and its labels. Its backward step reads the gradients of the data (the
    paper's convention: the first layers compute them, and the route ends at the data layer)."""

    kind = "data"
    checkpoint = True
    n_inputs = 0
    fwd_reads = ()
    fwd_writes = ("y", "labels")
    bwd_reads = ("dy",)
    bwd_writes = ()

    def infer_shape(self):
        return tuple(self.attrs["shape"])

    def flops(self):
        return 0

    def forward(self, io):
        pass  # the executor copies the batch in

    def backward(self, io):
        pass


class Add(Layer):
    """Element-wise sum of two or more inputs (residual joins). Backward: the first input's
    gradient takes over dy's buffer; the others are copies of it."""

    kind = "add"
    checkpoint = True
    n_inputs = None
    bwd_inplace = True

    def infer_shape(self):
        first = self.in_shapes[0]
        for i, s in enumerate(self.in_shapes[1:], 1):
            if s != first:
                raise ValueError(f"add {self.name!r}: input 0 has shape {first} but input {i} has shape {s}")
        return first

    def forward(self, io):
        io.run("add", io.x[0], io.x[1], io.y)
        for x in io.x[2:]:
            io.run("accumulate", io.y, x)

    def backward(self, io):
        for dx in io.dx[1:]:
            io.run("copy", io.dy, dx)
        # io.dx[0] is io.dy's buffer: nothing to do


class Concat(Layer):
    """Channel concatenation of two or more (N, C_i, H, W) inputs (Inception, DenseNet)."""

    kind = "concat"
    checkpoint = True
    n_inputs = None

    def infer_shape(self):
        first = self.in_shapes[0]
        for i, s in enumerate(self.in_shapes):
            if len(s) != 4 or (s[0], s[2], s[3]) != (first[0], first[2], first[3]):
                raise ValueError(f"concat {self.name!r}: inputs must agree in N, H, W; input 0 is {first}, "
                                 f"input {i} is {s}")
        return (first[0], sum(s[1] for s in self.in_shapes), first[2], first[3])

    def offsets(self):
        out, o = [], 0
        for s in self.in_shapes:
            out.append(o)
            o += s[1]
        return out

    def flops(self):
        return 0

    def forward(self, io):
        for x, off in zip(io.x, self.offsets()):
            io.run("concat_forward", x, io.y, offset=off)

    def backward(self, io):
        for dx, off in zip(io.dx, self.offsets()):
            io.run("concat_backward", io.dy, dx, offset=off)


class Narrow(Layer):
    """Channels [start, start + size) of an (N, C, H, W) input: one part of PyTorch's ``x.chunk(k, 1)``
    (ShuffleNet's split). A copy out of x forward, as a concat's gradient is; backward, dx is zero but for
    dy in that slice. A checkpoint, as a concat is."""

    kind = "narrow"
    checkpoint = True

    def infer_shape(self):
        x, (start, size) = self.in_shapes[0], (self.attrs["start"], self.attrs["size"])
        if len(x) != 4 or start < 0 or size < 1 or start + size > x[1]:
            raise ValueError(f"narrow {self.name!r}: channels [{start}, {start + size}) of an (N, C, H, W) "
                             f"input, got {x}")
        return (x[0], size, x[2], x[3])

    def flops(self):
        return 0

    def forward(self, io):
        io.run("concat_backward", io.x[0], io.y, offset=self.attrs["start"])

    def backward(self, io):
        io.run("fill", io.dx[0], value=0.0)
        io.run("concat_forward", io.dy, io.dx[0], offset=self.attrs["start"])


class ChannelShuffle(Layer):
    """ShuffleNet's channel shuffle: the channels, in ``groups`` groups, dealt out one from each group in
    turn. Its gradient is the shuffle back (by C / groups). A checkpoint, as a concat is."""

    kind = "channel_shuffle"
    checkpoint = True

    def infer_shape(self):
        x, groups = self.in_shapes[0], self.attrs["groups"]
        if len(x) != 4 or x[1] % groups:
            raise ValueError(f"channel_shuffle {self.name!r}: {groups} groups must divide the channels of an "
                             f"(N, C, H, W) input, got {x}")
        return x

    def flops(self):
        return 0

    def forward(self, io):
        io.run("channel_shuffle", io.x[0], io.y, groups=self.attrs["groups"])

    def backward(self, io):
        io.run("channel_shuffle", io.dy, io.dx[0], groups=self.out_shape[1] // self.attrs["groups"])


class Flatten(Layer):
    """(N, C, H, W) -> (N, C*H*W). No step of its own does any work: its output is its input's
    storage, reshaped, and its input gradient is its output gradient."""

    kind = "flatten"
    fwd_reads = ()
    fwd_writes = ()
    bwd_reads = ()
    bwd_writes = ()
    alias_input = True

    def infer_shape(self):
        x = self.in_shapes[0]
        return (x[0], math.prod(x[1:]))

    def flops(self):
        return 0

    def forward(self, io):
        pass

    def backward(self, io):
        pass


class SoftmaxLoss(Layer):
    """Softmax + cross-entropy, mean over the batch (PyTorch's CrossEntropyLoss). Its output is
    the probabilities; the loss is a saved scalar. Backward writes dlogits into prob's buffer."""

    kind = "softmax_loss"
    checkpoint = True
    fwd_reads = ("x", "labels")
    fwd_writes = ("y", "loss")
    bwd_reads = ("y", "labels")
    bwd_inplace = True  # in place of y (the probabilities), not dy: it has no dy

    def infer_shape(self):
        x = self.in_shapes[0]
        if len(x) != 2:
            raise ValueError(f"softmax_loss {self.name!r}: expected (N, classes) logits, got {x}; add "
                             "a linear layer")
        if x[1] != self.attrs["num_classes"]:
            raise ValueError(f"softmax_loss {self.name!r}: logits have {x[1]} classes but the graph was "
                             f"built with num_classes={self.attrs['num_classes']}")
        return x

    def saved(self):
        return {"loss": ((1,), "float32")}

    def flops(self):
        return 4 * math.prod(self.out_shape)

    def forward(self, io):
        io.run("softmax_xent_forward", io.x[0], io.labels, io.y, io.saved["loss"])

    def backward(self, io):
        io.run("softmax_xent_backward", io.y, io.labels, io.dx[0])
