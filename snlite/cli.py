"""The ``snlite`` command.

    snlite demo                                   # a tiny CNN on the CPU, in seconds
    snlite train lenet --data digits              # scikit-learn's 8x8 digits: 96-99% test accuracy in ~10 s
    snlite train lenet --data mnist:~/data/mnist --save lenet.npz
    snlite train lenet --data digits --load lenet.npz --epochs 1
    snlite train lenet --data digits --preset superneurons --budget 64MiB
    snlite plan alexnet --batch 200 --preset superneurons        # what the scheduler does, measured
    snlite plan alexnet --batch 200 --budget 1GiB               # too small: why, and what would fit
    snlite plan lenet --preset superneurons --program            # every alloc, copy, event, kernel launch
    snlite plan lenet --save-program p.json && snlite check p.json   # the race checker on a saved program
    snlite compare alexnet --batch 200                          # one row per strategy
    snlite optimal alexnet --batch 32 --count paper             # the exact plan vs the heuristics (scipy)
    snlite maxbatch alexnet --budget 12GiB                      # the paper's Table 5, simulated
    snlite maxdepth --batch 16 --budget 12GiB                   # the paper's Table 4, simulated
    snlite paper --out paper-out                                # every GPU-free experiment -> report.md
    snlite bench                                                # GPU kernels (if any), CPU planning

Every subcommand has ``--help``. Exit statuses: 0 done; 2 a usage error (a wrong flag or value,
from argparse, or a name that names nothing: an unknown network, ``--gpu``, ``--data`` kind or
``--recompute-keep`` layer, as one line listing the valid ones); 3 a network that does not fit
its ``--budget`` (``plan`` explains why and ranks what would fit); 1 anything else (a problem
with the data, a parameter file, an output path, the device, or a loss that is not finite), as
one line on stderr; 130 interrupted; 141 standard output closed
early (``snlite plan --json | head``), silently. ``snlite --traceback ...`` shows the full
traceback instead of the line. Planning commands (plan, compare, maxbatch, maxdepth) run the
scheduler on the meta device: no GPU, no data, seconds; the long ones show what they are probing
on stderr when it is a terminal (``--quiet``: never).
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import sys
import time
import warnings
import zipfile
import zlib

import numpy as np

from snlite import data, demo, files, models, plot, timing
from snlite.anomaly import NonFiniteError, describe
from snlite.cli_args import (EXIT_BROKEN_PIPE, EXIT_DOES_NOT_FIT, EXIT_ERROR, EXIT_INTERRUPTED,  # noqa: F401
                             EXIT_OK, EXIT_USAGE, CliError, UsageError, _at_most, _batch, _bytes, _float_in,
                             _positive_int, _seed, add_memory_flags, check_keep, check_names, check_outputs,
                             join_negative_values, memory_config, parse, warning_printer)
from snlite.cli_common import add_export_flags, add_net_argument, builder, check_exports, write_exports
from snlite.cli_compare import add_compare_command, cmd_compare
from snlite.cli_device import add_costs_command, add_launches_command, cmd_costs, cmd_launches
from snlite.cli_optimal import add_optimal_command, cmd_optimal
from snlite.cli_paper import add_bench_command, add_paper_command, cmd_bench, cmd_paper
from snlite.cli_plan import add_check_command, add_plan_command, cmd_check, cmd_plan
from snlite.cli_search import add_search_commands, cmd_maxbatch, cmd_maxdepth
from snlite.config import ConfigWarning
from snlite.device import DEVICE_NAMES
from snlite.errors import BudgetError
from snlite.arguments import param_problem
from snlite.train import Model
from snlite.version import __version__

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding snlite/
DATA_HELP = ("synthetic (generated: where is the blob), digits (scikit-learn's 8x8 digits), mnist:PATH (a "
             "directory with the four MNIST IDX files), cifar10:PATH (the CIFAR-10 binary batches)")
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 2048, 512


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snlite", description="SuperNeurons' GPU memory management, reimplemented for teaching. "
                                   "Start with: snlite demo")
    parser.add_argument("--traceback", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--version", action="version", version=f"snlite {__version__} (from {CHECKOUT})",
                        help="show the version, and the folder it runs from (an editable install runs its "
                             "checkout's code, wherever the command is typed)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # every command, in the order --help lists them
    add_demo_command(sub)  # demo (here)
    add_train_command(sub)  # train NET (here)
    add_plan_command(sub)  # plan NET, on the meta device like the planning commands below (cli_plan)
    add_check_command(sub)  # check FILE.json (cli_plan)
    add_compare_command(sub)  # compare NET (cli_compare)
    add_search_commands(sub)  # maxbatch NET, maxdepth (cli_search)
    add_optimal_command(sub)  # optimal NET (cli_optimal)
    add_paper_command(sub)  # paper (cli_paper)
    add_bench_command(sub)  # bench (cli_paper)
    add_launches_command(sub)  # launches NET (cli_device)
    add_costs_command(sub)  # costs NET (cli_device)
    parser.commands = sub.choices  # name -> its parser, to refuse a misspelled flag in its own usage
    return parser



def add_demo_command(sub) -> None:
    demo_cmd = sub.add_parser("demo", help="train a tiny CNN for a few steps and show its memory arena",
                              description="Build a tiny CNN, print its layers and the arena its tensors live "
                                          "in, then train it for a few steps on synthetic data. Needs no "
                                          "GPU.")
    demo_cmd.add_argument("--device", choices=DEVICE_NAMES, default="host",
                          help="where to run: host (NumPy, the default), cuda (a GPU, or the slow CUDA "
                               "simulator with NUMBA_ENABLE_CUDASIM=1: minutes even with --steps 2), meta "
                               "(the layout only), auto (cuda if a GPU is present)")
    demo_cmd.add_argument("--steps", type=_at_most(demo.MAX_STEPS, demo.WHY_MAX_STEPS), default=30,
                          help=f"training steps, at most {demo.MAX_STEPS:,d} (default 30)")
    demo_cmd.add_argument("--seed", type=_seed, default=0,
                          help="seed for the weights and the data (default 0)")


def add_train_command(sub) -> None:
    train = sub.add_parser("train", help="train a network from the model zoo on a data set",
                           description="Train NET with SGD, show progress, evaluate the test accuracy each "
                                       "epoch.")
    add_net_argument(train, help="a network of the model zoo (snlite.models): lenet (any image size), "
                                 "cifar_resnet20 (3x32x32), alexnet, vgg16, resnet50, ... (ImageNet sizes); "
                                 "or a PyTorch module (needs torch): torchvision:NAME or "
                                 "path/to/file.py:CLASS, on the data's images unless --input says otherwise; "
                                 "or path/to/file.py:FUNCTION, a function of the batch returning a Graph")
    train.add_argument("--data", default="digits", help=DATA_HELP + " (default digits)")
    train.add_argument("--batch", type=_batch, default=32, help="images per step (default 32)")
    train.add_argument("--epochs", type=_positive_int, default=6,
                       help="passes over the training set (default 6)")
    train.add_argument("--lr", type=_float_in(0.0, None, low_open=True, what="a learning rate > 0",
                                              float32=True),
                       default=0.05,
                       help="learning rate (default 0.05)")
    train.add_argument("--momentum", type=_float_in(0.0, 1.0, what="a momentum in [0, 1)", float32=True),
                       default=0.9,
                       help="SGD momentum (default 0.9)")
    train.add_argument("--weight-decay", type=_float_in(0.0, None, what="a weight decay >= 0", float32=True),
                       default=5e-4,
                       help="L2 weight decay (default 5e-4)")
    train.add_argument("--device", choices=DEVICE_NAMES, default="auto",
                       help="host (NumPy), cuda, or auto (cuda if a GPU is present, else host; the default)")
    train.add_argument("--seed", type=_seed, default=0,
                       help="seed for the weights, the split and the shuffling (0 to 2**32-1; default 0)")
    train.add_argument("--limit", type=_positive_int, default=None,
                       help="use at most this many training and test images (a quick run)")
    train.add_argument("--standardize", action="store_true",
                       help="shift and scale the images, training and test, by the training images' mean "
                            "and standard deviation (what a ViT or an MLP on raw pixels usually wants)")
    train.add_argument("--save", metavar="FILE.npz", help="write the trained parameters here")
    train.add_argument("--load", metavar="FILE.npz", help="start from the parameters in this file")
    train.add_argument("--anomaly", action="store_true",
                       help="after every step, re-run the forward pass on the host and check every layer's "
                            "output and every gradient for NaN and infinity (slow; without it the loss is "
                            "checked each step, and the layers only once a loss is not finite)")
    train.add_argument("--streams", metavar="FILE.png",
                       help="on a CUDA device, time the last step's kernels and copies per stream (compute, "
                            "copy_out, copy_in) and draw them (.png, .svg or .pdf; needs matplotlib)")
    add_export_flags(train, "one training step", measured=" (with --streams, also as measured)")
    add_memory_flags(train)


# ---------------------------------------------------------------- entry point
def main(argv=None) -> int:
    """The console script ``snlite`` (also ``python -m snlite.cli``); returns the exit status."""
    args = parse(build_parser(), join_negative_values(sys.argv[1:] if argv is None else list(argv)))
    try:
        check_names(args)
        check_outputs(args)  # every output path, before the work that would fill it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConfigWarning)  # memory_config printed these once, as flags
            warnings.showwarning = warning_printer(args.command, warnings.showwarning)
            return COMMANDS[args.command](args)
    except UsageError as e:
        if args.traceback:
            raise
        print(f"snlite {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("\nsnlite: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as cat does
        files.discard_stdout()
        return EXIT_BROKEN_PIPE
    except BudgetError as e:
        if args.traceback:
            raise
        print(f"snlite {args.command}: does not fit: {e}", file=sys.stderr)
        return EXIT_DOES_NOT_FIT
    except NotImplementedError as e:  # a stub of a student copy (python -m snlite.assignments)
        if args.traceback:
            raise
        k = re.match(r"Assignment (\d+)\b", str(e))
        how = f" (the student copy's stub; python -m snlite.assignments grade {k[1]} checks it)" if k else ""
        print(f"snlite {args.command}: error: not written yet: {e}{how}", file=sys.stderr)
        return EXIT_ERROR
    except (CliError, ValueError, OSError, ImportError, RuntimeError) as e:
        if args.traceback:
            raise
        if isinstance(e, OSError) and e.filename and e.strerror:  # not "[Errno 13] Permission denied: 'f'"
            e = f"{e.filename}: {e.strerror[0].lower()}{e.strerror[1:]}"
        print(f"snlite {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


def cmd_demo(args) -> int:
    demo.run(device=args.device, steps=args.steps, seed=args.seed)
    return 0


def cmd_train(args) -> int:
    train, test = load_data(args.data, args.seed)
    limited = args.limit is not None and args.limit < len(train)  # (a limit above the data cuts nothing)
    if args.limit:
        train, test = train.subset(slice(0, args.limit)), test.subset(slice(0, args.limit))
    scaled = ""
    if args.standardize:  # by the images trained on: after --limit
        scaled = f", standardized by their mean {train.x.mean():.4g} and std {train.x.std():.4g}"
        train, test = data.standardized(train, test)
    if args.batch > len(train):
        kept = f" --limit {args.limit} kept" if limited else ""
        raise CliError(f"--batch {args.batch} is larger than the {len(train)} training images{kept}")
    config = memory_config(args)
    graph = build_model(args.net, args.batch, train, args.input, args.torch_args)
    check_keep(graph, config)
    model = Model(graph, config, device=args.device, seed=args.seed, anomaly=args.anomaly)
    if not model.device.has_data:
        raise CliError(f"the {model.device.name} device holds no data, so it cannot train; "
                       "see a layout with: snlite demo --device meta")
    check_exports(args, config)
    if args.streams and model.device.name != "cuda":
        raise CliError("--streams times the CUDA streams: it needs --device cuda (a GPU, or the simulator)")
    if args.load:
        print(f"loaded {load_params(args.load, model)} parameter tensors from {args.load}")
    print(f"{args.net} on {model.device!r}: {len(train):,d} training and {len(test):,d} test images of "
          f"{train.shape} ({train.name.split('/')[0]}, {train.num_classes} classes){scaled}, "
          f"batch {args.batch}, "
          f"arena {_bytes(model.executor.arena.nbytes if model.executor.arena else 0)}, pinned "
          f"{_bytes(model.executor.slab.nbytes if model.executor.slab else 0)}, memory: {config.describe()}")
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.profile = bool(args.streams) and epoch == args.epochs  # profiled: the last epoch's steps
        run_epoch(model, train, args, epoch)
        acc = model.evaluate(test.x, test.labels)
        seconds = time.perf_counter() - start
        print(f"epoch {epoch}/{args.epochs}: test accuracy {acc:.2%}  ({seconds:.1f} s so far)")
    if args.streams:
        draw_streams(model, args)
    if args.chrome_trace or args.memory_snapshot:
        write_step_exports(model, args)
    if args.save:
        save_params(args.save, model.params)
        print(f"saved {len(model.state_names)} parameter tensors to {args.save}")
    return 0


# ---------------------------------------------------------------- pieces of `train`
def _gpu_of(model) -> str:
    """The time model's profile for ``model``'s device: its GPU where the profiles know it, else H200."""
    return timing.profile_for(getattr(model.device, "gpu_name", ""))


def write_step_exports(model, args) -> None:
    """``--chrome-trace`` and ``--memory-snapshot``: one training step of the model's program, on the
    time model (and, after --streams, as measured)."""
    gpu = _gpu_of(model)
    program = model.programs[model.step_mode]
    title = f"{args.net}, batch {args.batch}, {model.config.describe()}: one step, {gpu} profile (estimated)"
    write_exports(args, program, timing.estimate(program, model.graph, gpu), title, model.stream_events)


def draw_streams(model, args) -> None:
    """``--streams``: the last step's kernels and copies per CUDA stream, measured, drawn beside the
    GPU time model's estimate of the same forward and backward; how busy each stream was."""
    gpu = _gpu_of(model)
    modelled = timing.estimate(model.programs[model.step_mode], model.graph, gpu)
    try:
        plot.plot_streams(model.stream_events, args.streams, estimate=modelled.events(),
                          title=f"{args.net}: one training step per stream ({model.device!r}), measured, and "
                                f"the {gpu} model's estimate of its forward and backward")
    except plot.PlotUnavailable as e:
        raise CliError(str(e)) from None
    busy = {}
    for ev in model.stream_events:
        busy[ev["stream"]] = busy.get(ev["stream"], 0.0) + ev["end_ms"] - ev["start_ms"]
    print(f"streams of the last step drawn to {args.streams}: "
          + ", ".join(f"{k} busy {v:.2f} ms" for k, v in busy.items())
          + f"; the {gpu} model estimates the forward and backward at {modelled.step_ms:.2f} ms")


def load_data(spec: str, seed: int = 0):
    """(train, test) for a ``--data`` value."""
    kind, _, path = spec.partition(":")
    if kind == "synthetic" and not path:
        return (data.synthetic(SYNTHETIC_TRAIN, seed=seed), data.synthetic(SYNTHETIC_TEST, seed=seed + 1))
    if kind == "digits" and not path:
        return data.digits(seed=seed)
    if kind in ("mnist", "cifar10") and path:
        return getattr(data, kind)(os.path.expanduser(path))
    raise UsageError(f"--data {spec!r}: expected one of {DATA_HELP}")


def build_model(net: str, batch: int, train, input_shape=None, torch_args=None):
    """The graph of ``net`` at ``batch``, sized for ``train``'s images and classes: a network of the
    model zoo, or a PyTorch module (on ``train``'s images unless ``input_shape`` says otherwise)."""
    if ":" in net:
        graph = builder(net, input_shape, torch_args, default_input=train.shape)(batch)
        if graph.input_shape[1:] != train.shape:
            given = "--input " if input_shape else f"{net} takes images of "
            raise CliError(f"{given}{'x'.join(map(str, graph.input_shape[1:]))}, but --data "
                           f"{train.name.split('/')[0]} has images of {'x'.join(map(str, train.shape))}")
        if graph.num_classes != train.num_classes:
            raise CliError(f"{net} has {graph.num_classes} classes but --data {train.name.split('/')[0]} has "
                           f"{train.num_classes}; build it with them, e.g. --torch-args "
                           f"'{{\"num_classes\": {train.num_classes}}}'")
        return graph
    builder_of_zoo = models.MODELS.get(net.lower())
    if builder_of_zoo is not None and "input_shape" in inspect.signature(builder_of_zoo).parameters:  # lenet
        return models.get_model(net, batch, input_shape=train.shape, num_classes=train.num_classes)
    graph = models.get_model(net, batch, num_classes=train.num_classes)
    if graph.input_shape[1:] != train.shape:
        raise CliError(f"{net} takes images of {graph.input_shape[1:]}, but --data "
                       f"{train.name.split('/')[0]} has {train.shape}")
    return graph


def run_epoch(model, train, args, epoch: int) -> None:
    """One pass over ``train`` with a progress line: loss, accuracy, images/s, arena bytes."""
    total = train.num_batches(args.batch)
    bar = Progress(f"epoch {epoch}/{args.epochs}", total)
    loss_sum = correct = seen = 0
    start = time.perf_counter()
    batches = train.batches(args.batch, shuffle=True, seed=args.seed * 1000 + epoch)
    for i, (x, labels) in enumerate(batches, 1):
        try:
            loss, logits = model.step(x, labels, lr=args.lr, momentum=args.momentum,
                                      weight_decay=args.weight_decay, return_logits=True)
        except NonFiniteError as e:
            bar.close()
            raise CliError(f"epoch {epoch}, step {i}: {e}") from None
        loss_sum += loss
        correct += int((logits.argmax(axis=1) == labels).sum())
        seen += len(labels)
        rate = seen / max(time.perf_counter() - start, 1e-9)
        bar.update(i, f"loss {loss_sum / i:.4f}  acc {correct / seen:.2%}  {rate:,.0f} img/s  "
                      f"peak device memory {_bytes(model.trace.peak_bytes)}")
    bar.close()


class Progress:
    """A one-line text progress bar, redrawn with ``\\r`` (at most 10 times a second). Where the
    output is not a terminal, only the final line is written."""

    def __init__(self, label: str, total: int, stream=None, width: int = 20):
        self.label, self.total, self.width = label, max(total, 1), width
        self.stream = stream or sys.stdout
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last_draw, self.line = 0.0, ""

    def update(self, done: int, text: str) -> None:
        filled = self.width * done // self.total
        self.line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total}  {text}"
        now = time.perf_counter()
        if self.live and (now - self.last_draw > 0.1 or done == self.total):
            self.stream.write("\r" + self.line + "\033[K")
            self.stream.flush()
            self.last_draw = now

    def close(self) -> None:
        self.stream.write(("\r" + self.line + "\033[K\n") if self.live else self.line + "\n")
        self.stream.flush()


def save_params(file: str, params: dict) -> None:
    """Write ``params`` to ``file`` (.npz), refusing any that is not finite (nothing is written then).
    An interrupted save never leaves a half-written file (:mod:`snlite.files`)."""
    for name, value in params.items():
        bad = describe(value)
        if bad:
            raise CliError(f"--save {file}: {name} is not finite ({bad}); nothing was written (training "
                           "diverged: try a lower --lr)")
    with files.replacing(file, "wb") as f:  # whole or not at all
        np.savez(f, **params)


def read_params(file: str) -> dict[str, np.ndarray]:
    """The arrays of the .npz file ``file``, by name; a CliError saying what the file is otherwise
    (missing, empty, a .npy, not a zip archive, truncated or damaged)."""
    path = os.path.expanduser(file)
    bad = f"--load {file}: not a readable .npz parameter file"
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except FileNotFoundError:
        raise CliError(f"--load {file}: no such file") from None
    except OSError as e:
        raise CliError(f"--load {file}: cannot read it ({e.strerror or e})") from None
    if not head:
        raise CliError(f"{bad}: the file is empty")
    if head == b"\x93NUMPY":
        raise CliError(f"{bad}: it is a .npy file (one array without a name); --save writes a .npz of named "
                       f"tensors (np.savez)")
    if not head.startswith(b"PK"):
        raise CliError(f"{bad}: it is not a zip archive, which a .npz is")
    try:
        with np.load(path, allow_pickle=False) as f:
            return {name: f[name] for name in f.files}
    except ValueError as e:
        if "allow_pickle" in str(e):  # an intact archive of Python objects, which loading would run
            raise CliError(f"{bad}: it holds Python objects (arrays of dtype object), which snlite does not "
                           "unpickle; --save writes float32 arrays (np.savez)") from None
        raise CliError(f"{bad}: the archive is truncated or damaged (ValueError: {e})") from None
    except (zipfile.BadZipFile, EOFError, zlib.error, OSError, KeyError) as e:
        raise CliError(f"{bad}: the archive is truncated or damaged ({type(e).__name__}: {e})") from None


def load_params(file: str, model) -> int:
    """Set ``model``'s parameters from a .npz file written by ``--save``; returns how many tensors.
    Every name, shape, dtype and value is checked before anything is written, and a refusal names
    the tensor: float32 only (another dtype is refused, not cast), finite, a BatchNorm running_var
    >= 0 (:func:`snlite.train.param_problem`, as ``Model.set_params``)."""
    params = read_params(file)
    for name, value in params.items():
        if value.dtype.kind not in "biuf":
            raise CliError(f"--load {file}: {name} holds {value.dtype}, not numbers")
        bad = describe(value) if value.dtype == np.float32 else None
        if bad:
            raise CliError(f"--load {file}: {name} is not finite ({bad}); refusing to train from it")
        problem = param_problem(model.graph, name, value)
        if problem:
            raise CliError(f"--load {file}: {problem}; refusing to train from it")
    try:
        model.set_params(params)
    except ValueError as e:
        raise CliError(f"--load {file} does not fit this network: {e}") from None
    return len(params)


COMMANDS = {"demo": cmd_demo, "train": cmd_train, "plan": cmd_plan, "check": cmd_check,
            "compare": cmd_compare, "maxbatch": cmd_maxbatch, "maxdepth": cmd_maxdepth,
            "optimal": cmd_optimal, "paper": cmd_paper, "bench": cmd_bench, "launches": cmd_launches,
            "costs": cmd_costs}


if __name__ == "__main__":
    sys.exit(main())
