"""Pieces every ``snlite`` subcommand shares: exit statuses, the one-line error, argument types,
the memory flags (one flag per MemoryConfig field, read in one place) and progress on stderr."""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import sys
import time

import numpy as np

from snlite import measure, models, plot, recompute, timing, torch_import
from snlite.config import CHOICES, MIN_BUDGET_BYTES, MIN_HOST_BUDGET_BYTES, MemoryConfig, no_effect
from snlite.checks import check_number
from snlite.files import EXIT_BROKEN_PIPE  # noqa: F401 (one of the statuses above)

# Exit statuses (docs/troubleshooting.md): 0 done; 1 any other error (one line on stderr); 2 a usage
# error (argparse: a wrong flag or value; UsageError: a name that names nothing); 3 the network
# does not fit its --budget; 130 interrupted (Ctrl-C); 141 the reader of standard output went away
# (snlite plan --json | head), said nothing.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class CliError(Exception):
    """A problem the user can fix, reported as one line."""


class UsageError(CliError):
    """A wrong value on the command line that argparse cannot see (an unknown network, GPU profile,
    --data kind or --recompute-keep layer): one line, exit 2 (EXIT_USAGE) like argparse's own."""


def check_names(args) -> None:
    """Refuse, before any work, a NET, ``--gpu`` or ``--data`` that names nothing known (UsageError)."""
    if getattr(args, "net", None) is not None:
        check_net(args.net)
        given = [f for f, d in (("--input", "input"), ("--torch-args", "torch_args"))
                 if getattr(args, d, None) is not None]
        if given and ":" not in args.net:
            raise UsageError(f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} for a PyTorch NET "
                             f"(torchvision:NAME or path/to/file.py:NAME); {args.net} is of snlite's zoo")
    if getattr(args, "gpu", None) is not None:
        try:
            timing.profile(args.gpu)
        except ValueError as e:
            raise UsageError(f"--gpu: {e}") from None


# every flag that names a file a command writes, and the folders it fills (created if missing)
OUTPUT_FILES = {"json": "--json", "plot": "--plot", "timeline": "--timeline",
                "chrome_trace": "--chrome-trace", "save_program": "--save-program", "save": "--save",
                "streams": "--streams", "memory_snapshot": "--memory-snapshot"}
OUTPUT_FOLDERS = {"out": "--out"}
PLOTS = ("plot", "timeline", "streams")  # the files drawn by snlite.plot: PNG, SVG or PDF by their suffix


def check_outputs(args) -> None:
    """Refuse, before any work, an output path that cannot be written (CliError, one line): a file
    in a folder that does not exist, is not a folder or cannot be written, or a name that is a
    folder; a plot without matplotlib; a folder (``--out``) that is a file, or under one that cannot
    be created."""
    writers: dict[str, str] = {}  # the file, resolved -> the flag that writes it
    read = _inputs(args)
    for dest, flag in OUTPUT_FILES.items():
        target = getattr(args, dest, None)
        if target is not None and target != "-":  # --json with no FILE (or -): standard output
            check_output_file(flag, target)
            if os.path.realpath(target) in read:
                raise UsageError(f"{flag} {target}: that is {read[os.path.realpath(target)]}, which this "
                                 "command reads; writing it would destroy it: give another file")
            first = writers.setdefault(os.path.realpath(target), flag)
            if first != flag:
                raise UsageError(f"{first} and {flag} would both write {target}: the second would overwrite "
                                 "the first; give each its own file")
            if dest in PLOTS:
                try:
                    plot.figure_format(target)
                    plot.require_matplotlib()  # not after the work, with the other files written
                except ValueError as e:
                    raise CliError(f"{flag} {e}") from None
                except plot.PlotUnavailable as e:
                    raise CliError(f"{flag}: {e}") from None
    for dest, flag in OUTPUT_FOLDERS.items():
        target = getattr(args, dest, None)
        if target is not None:
            check_output_folder(flag, target)


def _inputs(args) -> dict[str, str]:
    """The files the command reads (resolved path -> what it is): a NET's ``file.py``, ``--load``'s
    parameters, ``check``'s program."""
    read = {}
    net = getattr(args, "net", None)
    if isinstance(net, str) and ".py:" in net:
        read[os.path.realpath(net.rpartition(":")[0])] = f"the file of NET {net}"
    for dest, what in (("load", "the parameters --load starts from"), ("file", "the program to check")):
        if isinstance(getattr(args, dest, None), str):
            read[os.path.realpath(getattr(args, dest))] = what
    return read


def check_output_file(flag: str, target: str) -> None:
    """CliError unless a file can be written at ``target`` (a folder that exists and is writable)."""
    if not target.strip():
        raise CliError(f"{flag} {target!r}: an empty file name; give the file to write")
    path = os.path.abspath(os.path.expanduser(target))
    if os.path.isdir(path):
        example = {"--json": "out.json", "--chrome-trace": "trace.json", "--save-program": "program.json",
                   "--memory-snapshot": "snapshot.pickle", "--save": "params.npz"}.get(flag, "out.png")
        raise CliError(f"{flag} {target}: is a folder; give a file name in it, e.g. "
                       f"{os.path.join(target, example)}")
    folder = os.path.dirname(path)
    if not os.path.exists(folder):
        raise CliError(f"{flag} {target}: its folder does not exist (create "
                       f"{os.path.dirname(target) or '.'} first)")
    if not os.path.isdir(folder):
        raise CliError(f"{flag} {target}: {os.path.dirname(target)} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {target}: its folder is not writable")


def check_output_folder(flag: str, target: str) -> None:
    """CliError unless ``target`` is a writable folder or can be created as one."""
    if not target.strip():
        raise CliError(f"{flag} {target!r}: an empty folder name; give one, e.g. {flag} out")
    path = os.path.abspath(os.path.expanduser(target))
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"{flag} {target}: exists and is not a folder")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise CliError(f"{flag} {target}: {existing} is a file, so the folder cannot be created")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {target}: {existing} is not writable")


def check_net(name: str) -> None:
    """UsageError unless ``name`` is a network of the model zoo (snlite.models.get_model), without
    building it."""
    if ":" in name:  # a PyTorch module or a Graph function (torchvision:NAME, file.py:NAME): form, file
        try:
            torch_import.check_source(name)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return
    if name.endswith(".json"):  # a saved program, or plan's JSON
        raise UsageError(f"{name!r} is a file, not a network: a program saved by plan --save-program is "
                         f"checked with snlite check {name}; NET is a model of the zoo or a file.py:NAME")
    if name.endswith(".py") or name == "torchvision":  # a PyTorch NET without the part after the colon
        raise UsageError(f"{name!r}: a NET from a file names what in it too: path/to/file.py:NAME (a "
                         "torch.nn.Module class, or a function of the batch that builds a Graph), or "
                         "torchvision:NAME (e.g. torchvision:resnet18)")
    key = name.lower()
    m = re.fullmatch(r"(cifar_resnet|resnet)(\d+)", key)
    try:
        if m and m[1] == "resnet":
            models.resnet_blocks(int(m[2]))
        elif m and not (int(m[2]) >= 8 and (int(m[2]) - 2) % 6 == 0):
            models.cifar_resnet(int(m[2]))  # raises, naming the nearest valid depths
        elif not m and key not in models.MODELS:
            models.get_model(name)  # raises, listing the known names
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_keep(graph, config) -> None:
    """UsageError unless every --recompute-keep name is a cheap layer of ``graph``."""
    if not config.recompute_keep:
        return
    try:
        recompute.check_keep(graph, config.recompute_keep)
    except ValueError as e:
        raise UsageError(f"--recompute-keep: {e}") from None


# ---------------------------------------------------------------- progress on stderr
class Status:
    """What a long command is doing, as one line on stderr redrawn in place: ``snlite maxdepth:
    superneurons: probe 3, depth 2,819 (939 units) [strategy 5/5]  (31 s)``. Silent with
    ``--quiet`` and wherever stderr is not a terminal (a pipe, a log file, CI), as git and pip are;
    :meth:`clear` wipes the line before results are printed."""

    def __init__(self, command: str, quiet: bool = False, stream=None):
        self.command, self.stream = command, stream or sys.stderr
        self.live = not quiet and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start, self.shown = time.perf_counter(), False

    def __call__(self, text: str) -> None:
        if self.live:
            head, tail = f"{self.command}: ", f"  ({time.perf_counter() - self.start:,.0f} s)"
            # the room on one line (a wrapped line would not redraw)
            room = shutil.get_terminal_size().columns - 1 - len(head) - len(tail)
            if len(text) > room:
                text = text[:max(room - 3, 0)] + "..."
            self.stream.write(f"\r{head}{text}{tail}\033[K")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


def add_quiet_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress line on stderr (it is shown only on a terminal anyway)")


# ---------------------------------------------------------------- argument types
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _at_most(limit: int, why: str):
    """An argparse type: a positive integer of at most ``limit`` (``why`` says why there is one)."""
    def parse(text: str) -> int:
        value = _positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"expected at most {limit:,d}, got {value:,d}: {why}")
        return value
    return parse


MAX_BATCH_ARG = 1 << 20  # images per step a command takes: past this, one launch outgrows CUDA's grid


def _batch(text: str) -> int:
    """A batch size: a positive integer of at most :data:`MAX_BATCH_ARG` (1,048,576). Larger batches
    need kernel launches wider than CUDA's grids (AlexNet's im2col already at this one) and plans
    that take minutes; no GPU holds one anyway."""
    value = _positive_int(text)
    if value > MAX_BATCH_ARG:
        raise argparse.ArgumentTypeError(f"expected a batch of at most {MAX_BATCH_ARG:,d} images, got "
                                         f"{value:,d}")
    return value


def _float_in(low, high, low_open=False, what="a number", float32=False):
    """An argparse type: a finite number in [low, high) (low excluded with ``low_open``); with
    ``float32``, in that range in float32 too (SGD's hyper-parameters: 1e39 is inf there, 1e-50 is 0,
    0.99999999 is 1), checked by :func:`snlite.checks.check_number`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if (not np.isfinite(value) or value < low or (low_open and value == low)
                or (high is not None and value >= high)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        if float32:
            try:
                check_number(value, f"expected {what}; the value", low, high, open_low=low_open,
                             open_high=high is not None, float32=True)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        return value
    return parse


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, {2**32 - 1}], got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        return measure.parse_size(text, exact=True)  # a fraction of a byte is refused, not dropped
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _size_at_least(least: int, what: str, why: str):
    """An argparse type: a size of at least ``least`` bytes (``what`` and ``why`` name it in the error)."""
    def parse(text: str) -> int:
        nbytes = _size(text)
        if nbytes < least:
            raise argparse.ArgumentTypeError(f"{what} must be at least {least:,d} bytes ({why}), got "
                                             f"{text!r} ({nbytes:,d} bytes)")
        return nbytes
    return parse


_budget = _size_at_least(MIN_BUDGET_BYTES, "a budget", "1KiB, one block of the pool")
_host_budget = _size_at_least(MIN_HOST_BUDGET_BYTES, "a host budget", "one slot of the pinned slab")


# flags whose value may look negative; argparse would take "-5GiB" for a flag and say only
# "expected one argument", so such a value is joined to its flag ("--budget=-5GiB") and refused
# by the flag's own check, which says what is wrong
VALUE_FLAGS = ("--budget", "--host-budget", "--seed", "--lr", "--momentum", "--weight-decay", "--batch",
               "--epochs", "--limit", "--steps", "--top", "--max-batch", "--max-units", "--units")


def join_negative_values(argv: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(argv):
        if argv[i] in VALUE_FLAGS and i + 1 < len(argv) and re.match(r"-[0-9.]", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


# ---------------------------------------------------------------- the memory flags (one place)
MEMORY_FLAGS = ("liveness", "offload", "cache", "recompute", "workspace", "allocator", "fit", "count",
                "schedule", "update_in_backward", "optimizer_state", "recompute_keep", "evict")


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected layer names separated by commas, got {text!r}")
    return names


def add_memory_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`MemoryConfig` field, plus ``--preset``; see :func:`memory_config`."""
    g = parser.add_argument_group("memory configuration (snlite.MemoryConfig; a flag overrides --preset, "
                                  "wherever it appears)")
    g.add_argument("--preset", choices=("baseline", "superneurons"), default="baseline", type=str.lower,
                   help="start from MemoryConfig.baseline() (nothing on, the default) or .superneurons() "
                        "(liveness, offload, cache, cost_aware recompute, dynamic workspace, update in "
                        "backward, schedule H200, optimizer_state auto)")
    for name, what in (("liveness", "free each tensor after its last use"),
                       ("offload", "copy CONV outputs to pinned host memory and back"),
                       ("cache", "LRU tensor cache: move data only when an allocation would fail"),
                       ("update-in-backward", "each layer's SGD step right after its last backward step, its "
                                              "weight gradient freed there")):
        g.add_argument(f"--{name}", action=argparse.BooleanOptionalAction, default=None, help=what,
                       dest=name.replace("-", "_"))
    helps = {"recompute": "drop cheap layers' outputs, rebuild them in backward",
             "workspace": "convolution workspace: none (direct), fastest, dynamic (fastest that fits now)",
             "allocator": "pool (one arena, the paper's) or raw (one allocation per tensor)",
             "fit": "the pool's free-block search (first, best), or offline: every offset chosen after "
                    "the walk, knowing every lifetime",
             "count": "what the trace's peak counts: all (everything on the device) or paper (activations + "
                      "gradients)",
             "optimizer_state": "where SGD's momentum lives between updates: device, host (pinned, "
                                "prefetched before each update and copied back after), auto (host only where "
                                "the device cannot hold it)",
             "evict": "which tensor the cache moves out when an allocation would fail: lru (the paper's), "
                      "largest, belady (next use furthest away)",
             "schedule": "when copies run: paper (the paper's op-based points) or a GPU (the profiles "
                         "of snlite.timing): releases and prefetches moved in time so copies hide behind "
                         "compute on that GPU (snlite.overlap)"}
    for name, text in helps.items():
        spelled = {c.lower(): c for c in CHOICES[name]}  # --schedule h100, as --gpu h100
        g.add_argument(f"--{name.replace('_', '-')}", choices=CHOICES[name], default=None, help=text,
                       dest=name, type=lambda v, spelled=spelled: spelled.get(v.lower(), v))
    g.add_argument("--recompute-keep", type=_names, metavar="LAYER,...", default=None, dest="recompute_keep",
                   help="cheap layers recomputation keeps, as checkpoints (e.g. the ones too slow to re-run "
                        "on your device: snlite.recompute.expensive_layers)")
    g.add_argument("--budget", type=_budget, metavar="SIZE", default=None,
                   help="device memory budget, e.g. 12GiB, 1.5GB, 500MB, 4096 (default: unlimited)")
    g.add_argument("--host-budget", type=_host_budget, metavar="SIZE", default=None,
                   help="pinned host memory budget (offloaded tensors, the staged batch, results; default: "
                        "unlimited)")


def memory_config(args) -> MemoryConfig:
    """The MemoryConfig the flags of :func:`add_memory_flags` ask for; a combination that works
    but wastes what it turns on gets a one-line warning on stderr."""
    base = MemoryConfig.superneurons() if args.preset == "superneurons" else MemoryConfig.baseline()
    changes = {n: getattr(args, n) for n in MEMORY_FLAGS if getattr(args, n) is not None}
    if args.budget is not None:
        changes["budget_bytes"] = args.budget
    if args.host_budget is not None:
        changes["host_budget_bytes"] = args.host_budget
    config = base.replace(**changes)
    for text in config_warnings(config):
        print(f"snlite {args.command}: warning: {text}", file=sys.stderr)
    return config


def _as_flag(field: str, value=None) -> str:
    """A setting as the command line writes it: ``--fit best``, ``--cache``, or the bare flag (None)."""
    flag = "--" + field.replace("_", "-")
    return flag if value is None or value is True else f"{flag} {value}"


def config_warnings(config: MemoryConfig) -> list[str]:
    """What is odd about ``config``: the settings that change nothing (:func:`snlite.config.no_effect`),
    and offload, the cache or recomputation without liveness analysis, which they work on top of
    (docs/paper.md sections 3-5): without it every tensor that is no longer needed stays on the
    device until the iteration ends."""
    out = no_effect(config, _as_flag)
    on = [f for f, used in (("--offload", config.offload), ("--cache", config.cache),
                            (f"--recompute {config.recompute}", config.recompute != "off")) if used]
    if config.liveness or not on:
        return out
    named = on[0] if len(on) == 1 else ", ".join(on[:-1]) + " and " + on[-1]
    dead = " and the cache copies dead tensors to the host" if config.cache else ""
    save = "they save" if len(on) > 1 else "it saves"
    out.append(f"{named} without liveness analysis: tensors nobody will read again stay on the device until "
               f"the iteration ends, so {save} less{dead}; add --liveness")
    return out


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024


def parse(parser, argv) -> argparse.Namespace:
    """``argv`` parsed; an unknown flag is refused in its command's usage, with the nearest of its flags
    (argparse's own refusal shows the top-level usage and guesses nothing)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = parser.commands[args.command]
        flags = [f for action in command._actions for f in action.option_strings]
        near = [m for u in unknown if u.startswith("--")
                for m in difflib.get_close_matches(u.split("=", 1)[0], flags, n=1)]
        top = [u for u in unknown if u in ("--traceback", "--version")]  # snlite's own, before the command
        command.error(f"unrecognized arguments: {' '.join(unknown)}"
                      + (f" ({top[0]} goes before the command: snlite {top[0]} {args.command} ...)" if top
                         else f" (did you mean {', '.join(near)}?)" if near else ""))
    return args


def warning_printer(command: str, show):
    """``warnings.showwarning`` for a command: snlite's own warnings (a frozen parameter of a PyTorch
    NET) as one line of the command's, like its other warnings; anyone else's as Python shows them."""
    def printer(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, torch_import.FrozenParameters):
            print(f"snlite {command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)
    return printer
