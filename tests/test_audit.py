"""The access audit (snlite.audit): every launch touches only the tensors it names, which is all the
race checker and the dataflow check see. Audited, every planner configuration trains, reads gradients
back and predicts bit-identically to a run without the audit; a launch that leaves out a tensor it
writes is refused, naming it, and one that leaves out a tensor it reads computes on the poison (the
race checker passes both)."""
import dataclasses

import numpy as np
import pytest

from nets import ALL_CONFIGS, convnext_net, data_for, gated_net, grouped_net, mixed_net, swin_net, vit_net
from snlite.adversary import AdversarialDevice
from snlite.anomaly import NonFiniteError
from snlite.bench import PRESETS
from snlite.checker import check
from snlite.config import MemoryConfig
from snlite.program import Launch
from snlite.search import min_budget
from snlite.train import Model
from snlite.validate import ProgramError

SGD = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)


def _run(g, config, audit, programs=None, read_back=True):
    """Two training steps, the gradients of a third batch read back (``read_back``), and a prediction:
    everything a Model runs (its train or grads, update and infer programs), audited or not."""
    x, labels = data_for(g)
    model = Model(g, config, device="host", seed=4)
    model.programs.update(programs or {})
    model.audit = audit
    losses = [model.step(x, labels, **SGD) for _ in range(2)]
    grads = {}
    if read_back:
        loss, grads = model.forward_backward(x, labels)
        losses.append(loss)
    return losses, {**model.params, **{f"{k} (grad)": v for k, v in grads.items()}}, model.predict(x)


def _same(a, b) -> bool:
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(
        np.array_equal(a[1][k], b[1][k]) for k in a[1]) and np.array_equal(a[2], b[2])


def test_audited_every_kind_of_configuration_computes_bit_identically():
    """Every eighth combination of the switches (each switch both ways, the momentum on both sides),
    then superneurons() with its blocks placed offline and under a budget that makes the cache move
    data, and the grouped net under the presets: no launch writes what it does not name, and nothing
    it reads unnamed changes a number."""
    g = mixed_net()
    base = _run(g, MemoryConfig(), audit=False)
    for config in ALL_CONFIGS[::8] + [MemoryConfig.superneurons(fit="offline")]:
        assert _same(_run(g, config, audit=True), base), f"audited, {config.describe()} computes otherwise"
    grouped, gated, convnext, vit, swin = grouped_net(), gated_net(), convnext_net(), vit_net(), swin_net()
    for net in (g, grouped, gated, convnext, vit, swin):
        tight = MemoryConfig.superneurons(budget_bytes=_tight(net))  # too tight for every gradient at once
        assert _same(_run(net, tight, audit=True, read_back=False),
                     _run(net, tight, audit=False, read_back=False))
    for net in (grouped, gated, convnext, vit, swin):
        base = _run(net, MemoryConfig(), audit=False)
        for config in PRESETS.values():
            assert _same(_run(net, config, audit=True), base), f"audited, {config.describe()} differs"


def _tight(g) -> int:
    """A budget under which superneurons() has its cache evict and fetch back (the smallest that fits)."""
    return min_budget(g).budget_bytes


def _edited(g, config, edit):
    """The model's training program with ``edit`` applied to the first launch it changes."""
    model = Model(g, config, device="host", seed=4)
    program = model.programs[model.step_mode]
    body = list(program.body)
    for i, ins in enumerate(body):
        if type(ins) is Launch and edit(ins) is not None:
            body[i] = edit(ins)
            return model.step_mode, dataclasses.replace(program, body=tuple(body)), ins
    raise AssertionError("no launch to edit")


def test_a_launch_that_leaves_out_a_tensor_it_writes_is_refused_though_the_checker_passes_it():
    """A fork's gradients are summed in place into the first: drop that one from the launch's writes."""
    g, config = mixed_net(), MemoryConfig(liveness=True)

    def edit(ins):
        first = g.output_grads(ins.layer)[0] if ins.accumulate else None
        if first in ins.writes:
            return dataclasses.replace(ins, writes=tuple(w for w in ins.writes if w != first))
        return None

    mode, program, ins = _edited(g, config, edit)
    check(program)  # the race checker and the dataflow check see nothing wrong
    assert _same(_run(g, config, audit=False, programs={mode: program}), _run(g, config, audit=False))
    first = g.output_grads(ins.layer)[0]
    with pytest.raises(ProgramError, match=rf"launch {ins.layer} backward.*changed [\d,]+ bytes it does not "
                                           rf"declare writing, .*\({first}\)"):
        _run(g, config, audit=True, programs={mode: program})


def test_a_launch_that_leaves_out_a_tensor_it_reads_computes_on_the_poison():
    """conv2's forward reads relu1's output: drop it from the launch's reads."""
    g, config = mixed_net(), MemoryConfig(liveness=True)
    mode, program, _ = _edited(g, config, lambda ins: dataclasses.replace(
        ins, reads=tuple(r for r in ins.reads if r != "relu1")) if ins.layer == "conv2" else None)
    plain = _run(g, config, audit=False, programs={mode: program})
    assert _same(plain, _run(g, config, audit=False))
    with pytest.raises(NonFiniteError, match=r"the loss is nan.* The access audit is on, and fills every "
                                             r"byte a launch does not name with NaN .*a launch that reads a "
                                             r"tensor its program does not name"):
        _run(g, config, audit=True, programs={mode: program})


def test_the_audit_refuses_a_device_or_allocator_it_cannot_watch():
    g = mixed_net()
    with pytest.raises(ValueError, match="host device.*AdversarialDevice.*device='host'"):
        Model(g, device=AdversarialDevice("late")).audit = True
    with pytest.raises(ValueError, match="raw allocator has none.*allocator='pool'"):
        Model(g, MemoryConfig(allocator="raw"), device="host").audit = True
    model = Model(g, MemoryConfig.superneurons(), device="host")  # steps update in backward
    model.audit = True
    model.profile = True
    model.forward_backward(*data_for(g))  # the grads program: larger than the train one, a new executor
    assert model.audit and model.profile, "the switches carry over to the executor that replaces the first"
