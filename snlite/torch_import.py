"""Your own network in: a ``torch.nn.Module`` traced with torch.fx into an snlite :class:`Graph`.

    import torchvision, snlite
    net = torchvision.models.resnet18()
    g = snlite.from_torch(net, (3, 224, 224), batch=32)      # a training graph, ending in softmax_loss
    model = snlite.Model(g, device="host")
    model.set_params(net.state_dict())                       # and back: net.load_state_dict(...)

``torch.fx.symbolic_trace`` turns the module's ``forward`` into a list of nodes (a call of a
submodule, of a function such as ``torch.cat``, or of a tensor method), and shape propagation
runs it once on a batch of one to learn every node's shape. Each node becomes one snlite layer,
named so that snlite's parameter names are PyTorch's ``state_dict`` keys: a submodule's layer is
named by its path (``layer2.0.conv1``); a parameter-free function by the path of the module whose
forward called it and the operation (``layer2.0.add``); a name used twice (torchvision's ResNets
call one ``relu`` module three times) gets ``_1``, ``_2``... as fx names its nodes. A module named
``data`` or ``labels``, or whose name holds '@', '#' or ':' (snlite's own names use them), is renamed
with a warning naming its new name: its state_dict entries are then under that name. The logits the
module returns feed a ``softmax_loss`` whose classes are their width (the last Linear's
``out_features``). Every layer's shape is checked against the one PyTorch computed.

What snlite cannot import stops with one :class:`TorchImportError` naming the fx node, its op and
target, and where in the model it sits (:mod:`snlite.torch_walk` turns each node into a layer;
:mod:`snlite.torch_nodes` lists in ``NOT_YET`` the hyper-parameters snlite's layers do not have
yet). torch is imported only inside these functions: snlite itself never needs it.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import importlib.util
import os
import sys
import warnings

from snlite.checks import integer
from snlite.graph import Graph
from snlite.torch_nodes import TorchImportError, refuse
from snlite.torch_walk import Importer


class FrozenParameters(UserWarning):
    """A module with parameters that do not train (``requires_grad=False``), which snlite trains."""


def from_torch(module, input_shape, batch: int = 32, name: str | None = None) -> Graph:
    """The training graph of ``module`` on inputs of ``input_shape`` (C, H, W), or (features,) for a
    model on vectors (an MLP), ``batch`` at a time,
    with PyTorch's parameter names (see the module docstring). ``module`` is neither changed nor
    run in training mode: its shapes are propagated once, in eval mode and without gradients."""
    if importlib.util.find_spec("torch") is None:
        raise ImportError("snlite.from_torch needs PyTorch: pip install -e \".[torch]\"")
    import torch
    from torch.fx.passes.shape_prop import ShapeProp

    batch = integer(batch, "from_torch's batch")
    shape = tuple(input_shape) if isinstance(input_shape, (tuple, list)) else ()
    if len(shape) not in (1, 3) or not all(isinstance(s, int) and s >= 1 for s in shape):
        raise ValueError(f"input_shape must be (C, H, W) of positive integers, or (features,) for a model on "
                         f"vectors (an MLP), got {input_shape!r}")
    recurrent = [f"{n}: {type(m).__name__}" for n, m in
                 (module.named_modules() if isinstance(module, torch.nn.Module) else ())
                 if isinstance(m, torch.nn.RNNBase)]
    if recurrent:
        raise TorchImportError(f"{type(module).__name__} has recurrent layers ({', '.join(recurrent[:3])}), "
                               "and snlite has none: it plans networks on images or on vectors (CNNs, MLPs, "
                               "vision transformers)")
    gm = _trace(module)
    modes = {m: m.training for m in module.modules()}
    try:
        module.eval()
        with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints tracebacks
            ShapeProp(gm).propagate(torch.zeros((1,) + shape))
    except Exception as e:
        cause = e.__cause__ or e  # ShapeProp wraps the module's own error in a dump of the fx node
        raise TorchImportError(f"PyTorch could not run {type(module).__name__} on an input of shape "
                               f"(1, {', '.join(map(str, shape))}): {cause} (a model made for another "
                               "input size: give it, as input_shape or --input CxHxW)") from None
    finally:
        for m, training in modes.items():
            m.train(training)
    out = _output(gm)
    logits = tuple(out.meta["tensor_meta"].shape)
    if len(logits) != 2:
        raise refuse(out, f"the model returns a tensor of shape {logits}; snlite needs logits (N, classes) "
                          "to put a softmax_loss on")
    if logits[1] < 2:
        raise TorchImportError(f"{type(module).__name__} returns {logits[1]} output per sample: snlite "
                               "trains classifiers, whose logits (N, classes >= 2) a softmax_loss reads (a "
                               "regression loss is not one of its layers yet)")
    g = Graph((batch,) + shape, logits[1], name=name or type(module).__name__.lower())
    built = Importer(g, gm).run()
    g.softmax_loss(built[out])
    _warn_of_frozen(module)
    return g


def _warn_of_frozen(module) -> None:
    """Warn where some parameters are frozen: snlite trains every one, so a plan counts a gradient and
    a momentum buffer for each, which a fine-tuning run that freezes them does not hold."""
    frozen = [(n, p.numel() * p.element_size()) for n, p in module.named_parameters() if not p.requires_grad]
    if frozen:
        nbytes = sum(b for _, b in frozen)
        names = ", ".join(n for n, _ in frozen[:3]) + (", ..." if len(frozen) > 3 else "")
        warnings.warn(f"{type(module).__name__} has {len(frozen)} frozen parameter tensors ({names}; "
                      f"{nbytes:,d} bytes, requires_grad=False): snlite trains every parameter, so its plans "
                      f"hold their gradients and momentum too, up to {2 * nbytes:,d} bytes more than a run "
                      "that freezes them", FrozenParameters, stacklevel=3)


def check_source(source: str) -> None:
    """ValueError unless ``source`` is ``torchvision:NAME`` or ``path/to/file.py:NAME`` with the
    file there: what the command line checks before any work, without importing torch."""
    where, _, attr = source.rpartition(":")
    if not (where and attr.isidentifier()):
        raise ValueError(f"{source!r}: expected torchvision:NAME (e.g. torchvision:resnet18) or "
                         "path/to/file.py:NAME (a torch.nn.Module class, or a function building a Graph)")
    if where != "torchvision" and not os.path.isfile(where):
        raise ValueError(f"{source!r}: expected torchvision:NAME or path/to/file.py:NAME, and there is "
                         f"no file {where!r}")
    if where != "torchvision" and not where.endswith(".py"):
        raise ValueError(f"{source!r}: {where} is a file, but not a Python one: name a .py file "
                         "(path/to/file.py:NAME)")


class UnknownModule(ValueError):
    """A NET that names no module: torchvision has no model of that name, or the file no such class
    (the command line's usage error, exit status 2, as for a name the zoo lacks)."""


def load_module(source: str, kwargs: dict | None = None):
    """The ``torch.nn.Module`` a command line names: ``torchvision:NAME`` (a model of
    ``torchvision.models``, e.g. ``torchvision:resnet18``) or ``path/to/file.py:CLASS`` (a class of
    that file), constructed with ``kwargs`` (none: its defaults)."""
    check_source(source)
    where, _, attr = source.rpartition(":")
    kwargs = dict(kwargs or {})
    if where == "torchvision":
        models = import_torchvision().models
        known = models.list_models(models)
        if attr not in known:
            near = difflib.get_close_matches(attr, known, n=3)
            hint = f"did you mean {', '.join(near)}?" if near else f"it has {', '.join(known)}"
            raise UnknownModule(f"{source!r}: torchvision has no model {attr!r}; {hint}")
        return _construct(lambda **kw: models.get_model(attr, **kw), f"torchvision.models.{attr}", kwargs)
    return module_of(file_object(source), source, kwargs)


def file_object(source: str):
    """What ``path/to/file.py:NAME`` names: the file run as Python runs it (the modules beside it
    import), then its ``NAME``: a ``torch.nn.Module`` class (:func:`module_of`) or a function that
    builds an snlite Graph (the command line's ``snlite.cli_common.builder``). Needs no torch."""
    check_source(source)
    where, _, attr = source.rpartition(":")
    spec = importlib.util.spec_from_file_location(f"snlite_user_model_{abs(hash(where))}", where)
    code = importlib.util.module_from_spec(spec)
    with _first_on_path(os.path.dirname(os.path.abspath(where))):  # its own modules import, as `python file`
        try:
            spec.loader.exec_module(code)
        except Exception as e:  # noqa: BLE001 - whatever the user's file raises, said in one line
            raise ValueError(f"{where} failed to run: {type(e).__name__}: {e}") from None
        except SystemExit as e:  # a script's exit, run on import: not snlite's exit status
            raise ValueError(f"{where} called sys.exit({e.code!r}) as it was imported; put what runs it "
                             "under if __name__ == '__main__':") from None
    if not hasattr(code, attr):
        own = [n for n, v in vars(code).items()
               if callable(v) and getattr(v, "__module__", "") == code.__name__]
        near = difflib.get_close_matches(attr, own, n=1)
        raise UnknownModule(f"{source!r}: {where} defines no {attr!r}"
                            + (f"; did you mean {near[0]}?" if near else f"; it defines {', '.join(own)}"
                               if own else ""))
    return getattr(code, attr)


def module_of(cls, source: str, kwargs: dict | None = None):
    """``cls(**kwargs)``, where ``cls`` (what ``source`` names) is a ``torch.nn.Module`` class."""
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise UnknownModule(f"{source!r} is a {type(cls).__name__}, not a torch.nn.Module subclass nor a "
                            "function that builds an snlite Graph from the batch")
    return _construct(cls, source.rpartition(":")[2], dict(kwargs or {}))


@contextlib.contextmanager
def _first_on_path(folder: str):
    """``folder`` first on ``sys.path`` inside the block (a model file's folder: the modules beside it
    import, as when Python runs the file), as it was after."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def _construct(make, what: str, kwargs: dict):
    """``make(**kwargs)``; a constructor that refuses its arguments, or raises, said in one line."""
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    try:
        return make(**kwargs)
    except TypeError as e:
        raise ValueError(f"{what}({args}) failed: {e}; give its constructor's arguments with --torch-args, "
                         "a JSON object") from None
    except Exception as e:  # noqa: BLE001 - whatever the user's constructor raises, said in one line
        raise ValueError(f"{what}({args}) failed: {type(e).__name__}: {e}") from None


def _trace(module):
    import torch
    from torch.fx.proxy import TraceError

    if not isinstance(module, torch.nn.Module):
        made = f": give one, {module.__name__}(...)" if isinstance(module, type) else ""
        raise ValueError(f"from_torch expects a torch.nn.Module, got {type(module).__name__} "
                         f"{getattr(module, '__name__', '')}{made}".rstrip())
    bad = sorted({str(p.dtype) for p in module.state_dict().values() if p.is_floating_point()}
                 - {"torch.float32"})
    if bad:
        raise TorchImportError(f"{type(module).__name__} holds {', '.join(bad)} tensors; snlite trains in "
                               "float32")
    try:
        tracer = torch.fx.Tracer(autowrap_functions=_kept_whole())  # symbolic_trace, with these kept whole
        graph = tracer.trace(module)
        return torch.fx.GraphModule(tracer.root, graph, type(module).__name__)
    except TraceError as e:
        raise TorchImportError(
            f"torch.fx could not trace {type(module).__name__}: its forward branches or loops on the values "
            f"of a tensor (fx: {e}). snlite plans one static graph before anything runs, the same layers on "
            "tensors of the same shapes every iteration, so it cannot follow a forward whose path depends on "
            "the data. Make the branch depend on a Python value (a constructor argument, self.training) "
            "or import the static part of the model") from None


def _kept_whole() -> tuple:
    """Functions fx should record as one call rather than trace into, because their bodies compute with
    tensor sizes (which a trace cannot follow) to do what one snlite layer does: ShuffleNet's
    ``channel_shuffle``, where torchvision is loaded (a torchvision model is being imported)."""
    shufflenet = sys.modules.get("torchvision.models.shufflenetv2")
    return (shufflenet.channel_shuffle,) if shufflenet is not None else ()


def import_torchvision():
    """``torchvision``, imported; its classification models are pure Python and need none of its C ops.

    A torchvision built for CUDA (the package registry's default) cannot load its C extension next to
    a CPU-only torch, and torchvision 0.28's ``__init__`` then fails registering a shape function for
    its ``nms`` operator ("operator torchvision::nms does not exist"). Where that extension did not
    load, the two operators it registers unguarded (``nms``, ``qnms``: detection, which snlite never
    calls) are declared first, without a kernel, so the import gets through; calling them still raises.
    A torchvision built for the CPU (download.pytorch.org/whl/cpu) loads its extension and is left alone."""
    import torch

    if importlib.util.find_spec("torchvision") is None:
        raise ImportError("torchvision is not installed: pip install -e \".[torch]\"")
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise
    lib = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # a Library undefines its operators when it is collected
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]  # the half-finished first import
    import torchvision
    return torchvision


_KEEP = []


def _output(gm):
    node = next(n for n in gm.graph.nodes if n.op == "output")
    value = node.args[0]
    meta = getattr(value, "meta", {}).get("tensor_meta")
    if hasattr(meta, "shape"):
        return value
    several = value if isinstance(value, (tuple, list, dict)) else meta  # or a named tuple (GoogLeNet's)
    if not isinstance(several, (tuple, list, dict)):
        raise refuse(node, f"the model returns {type(value).__name__}, not one tensor of logits")
    kind = getattr(value, "target", None) or next(k for k in (dict, tuple, list) if isinstance(value, k))
    raise refuse(node, f"the model returns {kind.__name__} of {len(several)} outputs, not one tensor of "
                       "logits: snlite puts one softmax_loss on one output, so construct the model without "
                       "the others (torchvision's googlenet and inception_v3 in training: aux_logits=False, "
                       "on the command line --torch-args '{\"aux_logits\": false}')")


def torch_params(module) -> dict:
    """``module``'s state_dict as float32 NumPy arrays, what :meth:`snlite.train.Model.set_params`
    takes (it also takes the state_dict itself); its integer buffers are left out: the batch counters
    ``num_batches_tracked`` (snlite's batch normalization updates with a fixed momentum and never reads
    them) and Swin's ``relative_position_index`` (snlite computes it from the window)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in module.state_dict().items()
            if v.is_floating_point()}
