"""What the planning commands (plan, compare, maxbatch, maxdepth, optimal) share: the help texts of
their common arguments, the network a command names, plain text tables, JSON output and plots, and
the files other tools' viewers open (plan's and train's --chrome-trace and --memory-snapshot).
Every ``cli_*`` command module imports from here; this module imports none of them."""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
import shlex
import sys

import numpy as np

from snlite import chrome_trace, files, measure, memory_snapshot, models, plot, timing, torch_import
from snlite.cli_args import OUTPUT_FILES, CliError, UsageError, check_output_file
from snlite.errors import BudgetError
from snlite.graph import Graph

NET_HELP = ("a network of the model zoo (snlite.models.get_model): lenet, alexnet, vgg16, resnet50, "
            "resnet101, resnet152, resnetNNN, cifar_resnetNN, inception_v4, densenet121; or a PyTorch "
            "module (needs torch): torchvision:NAME (e.g. torchvision:resnet18) or path/to/file.py:CLASS; or "
            "path/to/file.py:FUNCTION, a function of the batch that returns an snlite Graph")
TORCH_BATCH = 32  # the batch of a PyTorch module without --batch
TORCH_INPUT = (3, 224, 224)  # its input without --input
BATCH_HELP = "images per step (default: the model's, snlite.models.DEFAULT_BATCH)"
JSON_HELP = "write the numbers as JSON to FILE (- or no FILE: standard output, instead of the tables)"
GPU_HELP = (f"the GPU profile of the time model (snlite.timing.PROFILES: {', '.join(timing.PROFILES)}; "
            "default {default}): estimated step time, how busy each stream is, how much transfer time "
            "compute waits for")


# ---------------------------------------------------------------- --json [FILE]
def add_json_flag(parser) -> None:
    """``--json [FILE]``: the numbers as JSON, to FILE or (no FILE, or -) to standard output."""
    parser.add_argument("--json", nargs="?", const="-", type=_json_file, metavar="FILE", help=JSON_HELP)


def _json_file(value: str) -> str:
    """--json's FILE, unless it names a network: ``--json lenet`` put before NET takes NET as its file
    (argparse cannot tell), which would write a file named lenet and then miss NET."""
    key = value.lower()
    if ":" in value or key in models.MODELS or re.fullmatch(r"(cifar_)?resnet\d+", key):
        example = "net.json" if ":" in value else f"{value}.json"
        raise argparse.ArgumentTypeError(f"{value} names a network, not a file: put --json after NET, or "
                                         f"give it a file name (--json {example}) or - (standard output)")
    return value


# ---------------------------------------------------------------- the network a command names
def add_net_argument(parser, help: str = NET_HELP) -> None:
    """NET, and the two flags of a NET that is a PyTorch module."""
    parser.add_argument("net", metavar="NET", help=help)
    parser.add_argument("--input", type=_input_shape, default=None, metavar="CxHxW",
                        help="a PyTorch NET's input, one image (default 3x224x224), or its features for a "
                             "model on vectors (784)")
    parser.add_argument("--torch-args", type=_json_object, default=None, metavar="JSON",
                        help="a PyTorch NET's constructor arguments, a JSON object (default: none), "
                             "e.g. '{\"num_classes\": 10}'")


def builder(net: str, input_shape=None, torch_args=None, default_input=TORCH_INPUT):
    """``batch -> Graph`` for ``net``: a model of the zoo (None: the model's default batch); a
    PyTorch module (``torchvision:NAME``, ``file.py:CLASS``: constructed once, traced by
    :func:`snlite.torch_import.from_torch` at each batch; None: TORCH_BATCH; on ``input_shape``,
    None: ``default_input``); or ``file.py:FUNCTION``, a function of the batch that builds an snlite
    Graph (:func:`graph_function`)."""
    if ":" not in net:
        return lambda batch=None: models.get_model(net, batch)
    try:
        if net.startswith("torchvision:"):
            module = torch_import.load_module(net, torch_args)
        else:
            found = torch_import.file_object(net)
            if inspect.isfunction(found):
                return graph_function(net, found, input_shape, torch_args)
            module = torch_import.module_of(found, net, torch_args)
    except torch_import.UnknownModule as e:
        raise UsageError(str(e)) from None
    def build(batch=None):
        try:
            return torch_import.from_torch(module, input_shape or default_input, batch=batch or TORCH_BATCH,
                                           name=net)
        except (ValueError, *SAID_BY_THE_COMMAND):  # snlite's refusals (and its forward's ValueError)
            raise
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the module's own code failed: one line
            raise CliError(f"{net}: tracing its forward {_raised(e)} (snlite --traceback ... shows "
                           "where)") from e
    return build


SAID_BY_THE_COMMAND = (NotImplementedError, BudgetError)  # a student copy's stub, a budget: as they are


class NetValueError(CliError, ValueError):
    """A NET function raised ValueError (snlite refusing a graph, as a BatchNorm left one value per
    channel at batch 1): one line like any error of the user's code, and still a ValueError, so that
    ``maxbatch`` starts its search at batch 2 as it does for a torchvision NET (search.smallest_batch)."""


def _raised(e: BaseException) -> str:
    """What user code did, in a few words: ``raised KeyError: 'x'``, or ``called sys.exit(3)``."""
    return f"called sys.exit({e.code!r})" if isinstance(e, SystemExit) else f"raised {type(e).__name__}: {e}"


def graph_function(net: str, function, input_shape=None, kwargs=None):
    """``batch -> Graph`` for ``file.py:FUNCTION``: ``FUNCTION(batch, **kwargs)`` (``--torch-args``),
    or ``FUNCTION(**kwargs)`` without ``--batch`` (its own default), which must return an snlite
    :class:`~snlite.graph.Graph` of that batch. It builds its own input: ``--input`` is refused."""
    if input_shape is not None:
        raise UsageError(f"--input is a PyTorch NET's; {net} builds its Graph, input included: leave it out")
    kwargs = dict(kwargs or {})

    def build(batch=None):
        args = () if batch is None else (batch,)
        shown = [str(batch)] * bool(args) + ["**--torch-args"] * bool(kwargs)
        call = f"{function.__name__}({', '.join(shown)})"
        try:
            inspect.signature(function).bind(*args, **kwargs)
        except TypeError as e:
            raise UsageError(f"{net}: {call} failed: {e}; a NET that is a function takes the batch first "
                             f"(def {function.__name__}(batch=8): ...) and returns an snlite Graph") from None
        try:
            g = function(*args, **kwargs)
        except SAID_BY_THE_COMMAND:
            raise
        except ValueError as e:  # a refusal (snlite's: a BatchNorm at batch 1): a search tries batch 2
            raise NetValueError(f"{net}: {call} {_raised(e)} (snlite --traceback ... shows where)") from e
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's code, not snlite's: one line
            raise CliError(f"{net}: {call} {_raised(e)} (snlite --traceback ... shows where)") from e
        if not isinstance(g, Graph):
            raise UsageError(f"{net}: {call} returned {type(g).__name__}, not an snlite Graph")
        if batch is not None and g.input_shape[0] != batch:
            raise UsageError(f"{net}: {call} returned a Graph of batch {g.input_shape[0]}: build its input "
                             "of the batch given")
        return g
    return build


def net_json(args) -> dict:
    """The NET of a command's ``--json``: its name and, for a PyTorch module, the input and constructor
    arguments it was built with (without them the numbers would not say what they are of)."""
    if ":" not in args.net:
        return {"net": args.net}
    return {"net": args.net, "input": list(getattr(args, "input", None) or TORCH_INPUT),
            "torch_args": getattr(args, "torch_args", None) or {}}


def net_words(args) -> str:
    """The NET of a command as a command line that follows it repeats it: its name, and a PyTorch
    NET's --input and --torch-args where given (without them the other command builds another
    network), quoted for the shell."""
    words = [args.net]
    if getattr(args, "input", None):
        words += ["--input", "x".join(map(str, args.input))]
    if getattr(args, "torch_args", None):
        words += ["--torch-args", json.dumps(args.torch_args)]
    return shlex.join(words)


def builder_of(args):
    """:func:`builder` for the command's NET and its --input and --torch-args."""
    return builder(args.net, getattr(args, "input", None), getattr(args, "torch_args", None))


def graph_of(args):
    """(builder, graph, batch) for ``args.net`` and ``args.batch`` (None: the model's default)."""
    build = builder_of(args)
    graph = build(args.batch)
    return build, graph, graph.input_shape[0]


def _input_shape(text: str) -> tuple[int, ...]:
    parts = text.lower().split("x")
    if len(parts) not in (1, 3) or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected CxHxW of positive integers (3x224x224), or the features "
                                         f"of a model on vectors (784), got {text!r}")
    return tuple(int(p) for p in parts)


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object ({{...}}), got {text!r}")
    return value


# ---------------------------------------------------------------- text
def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def text_table(head: list[str], rows: list[list], align: str | None = None) -> str:
    """A plain text table; ``align`` per column: < or > (default: first left, others right)."""
    align = align or "<" + ">" * (len(head) - 1)
    cells = [[str(c) for c in r] for r in [head] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(f"{c:{a}{w}}" for c, a, w in zip(r, align, widths)).rstrip() for r in cells)


KIND_HEAD = ["weights", "weight grads", "momentum", "on host", "the rest", "on host"]
KIND_NOTE = ("by kind, at each row's peak: the weights (with BatchNorm's buffers), their gradients and the "
             "optimizer state (momentum), on the device and waiting in pinned host memory; the rest is the "
             "batch, activations, their gradients, workspace and copies in flight (on the host: what the "
             "cache and offload parked there, at the host's peak)")


def kind_cells(trace) -> list[str]:
    """The :data:`KIND_HEAD` cells of ``trace`` (Trace.by_kind), or dashes without one."""
    if trace is None:
        return ["-"] * len(KIND_HEAD)
    k = trace.by_kind()
    return [measure.format_size(k["weights"][0]), measure.format_size(k["weight gradients"][0]),
            measure.format_size(k["optimizer state"][0]), measure.format_size(k["optimizer state"][1]),
            measure.format_size(k["activations, gradients, batch, workspace"][0]),
            measure.format_size(k["activations, gradients, batch, workspace"][1])]


def kind_table(rows) -> str:
    """One line per (label, trace): what its peak holds, by kind (:func:`kind_cells`)."""
    return text_table(["strategy"] + KIND_HEAD, [[label] + kind_cells(t) for label, t in rows])


# ---------------------------------------------------------------- files: JSON and plots
def tell(args, line: str) -> None:
    """Say what was written where: on standard output, or on standard error where standard output is
    the JSON (``--json`` or ``--json -``), which must stay JSON alone."""
    print(line, file=sys.stderr if getattr(args, "json", None) == "-" else sys.stdout)


def write_json(target: str, data) -> None:
    """``data`` as indented JSON to the file ``target`` (- : standard output), said where."""
    text = json.dumps(data, indent=1, default=jsonable)
    if target == "-":
        print(text)
        return
    check_output_file("--json", target)  # checked before the work too (check_outputs), but a folder may go
    files.write_text(target, text + "\n")
    print(f"JSON written to {target}")


def jsonable(v):
    """What :func:`json.dumps` cannot write itself: a dataclass as a dict, a non-finite float as null,
    anything else as its string."""
    if dataclasses.is_dataclass(v):
        return dataclasses.asdict(v)
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return str(v)


DRAWN = {"plot_timeline": "memory timeline", "plot_tradeoff": "trade-off", "plot_streams": "timeline"}


def draw(args, dest: str, kind: str, data, **kwargs) -> None:
    """``snlite.plot.<kind>(data, path, **kwargs)`` (plot_timeline, plot_tradeoff, plot_streams) to
    the file of the flag ``dest`` names (args.plot, args.timeline), and say so; without matplotlib, a
    one-line CliError that says how to install it (check_outputs said so before the work)."""
    path = getattr(args, dest)
    try:
        getattr(plot, kind)(data, path, **kwargs)
    except plot.PlotUnavailable as e:
        raise CliError(f"{OUTPUT_FILES[dest]}: {e}") from None
    tell(args, f"{DRAWN[kind]} drawn to {path}")


# ---------------------------------------------------------------- files for other tools' viewers
def add_export_flags(parser, what: str, measured: str = "") -> None:
    """``--chrome-trace`` and ``--memory-snapshot`` for ``what`` ("the iteration", "one training
    step"); ``measured``: what the trace adds when the command also measured the step."""
    parser.add_argument("--chrome-trace", metavar="FILE.json",
                        help=f"write {what} as the GPU time model estimates it{measured} in the Chrome trace "
                             "event format: a track per stream, a slice per kernel and copy, a counter of "
                             "device memory (open it in ui.perfetto.dev or chrome://tracing)")
    parser.add_argument("--memory-snapshot", metavar="FILE.pickle",
                        help=f"write the device memory of {what} (every alloc and free in the arena, in "
                             "order) as a PyTorch memory snapshot: open it at pytorch.org/memory_viz")


def check_exports(args, config) -> None:
    """Refuse, before any work, an export the configuration cannot give (CliError, one line)."""
    if args.memory_snapshot:
        try:
            memory_snapshot.check_allocator(config.allocator)
        except memory_snapshot.SnapshotError as e:
            raise CliError(f"--memory-snapshot: {e}") from None


def write_exports(args, program, timeline, title: str, measured=None) -> None:
    """Write the files ``--chrome-trace`` and ``--memory-snapshot`` ask for, and say where."""
    if args.chrome_trace:
        trace = chrome_trace.chrome_trace(timeline, title, chrome_trace.held_bytes(program), measured)
        chrome_trace.write(args.chrome_trace, trace)
        tell(args, f"timeline written to {args.chrome_trace} (the Chrome trace event format: open it in "
                   "ui.perfetto.dev or chrome://tracing)")
    if args.memory_snapshot:
        memory_snapshot.write(args.memory_snapshot, memory_snapshot.snapshot(program))
        tell(args, f"memory snapshot written to {args.memory_snapshot} (PyTorch's format: open it at "
                   "pytorch.org/memory_viz)")
