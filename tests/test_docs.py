"""Documentation that cannot go stale: every example and every shown output in README.md, docs/*.md
and tutorials/README.md is produced here, and every relative link resolves.

What a fenced block is, by its language tag (an untagged block is an error: tag it):

- ``python``: an example. It runs as written (in a fresh namespace, in a temporary folder). A ``text``
  block after it, with no other block between, is what it prints.
- ``console``: commands after ``$ ``, each followed by the output it shows. ``snlite ARGS`` runs as
  ``snlite.cli.main(ARGS)``, ``python -m MODULE ARGS`` as ``MODULE.main(ARGS)``, in-process; the
  output compared is standard output, then standard error. A ``# comment`` after a command is dropped.
- ``bash``: commands to type, no output shown. Nothing runs: each ``snlite`` command must parse
  (snlite's own argument parser: no flag renamed or removed), each ``python -m`` module must exist,
  and each script named must exist; other programs (pip, pytest, ruff, git...) are listed.
- ``text``: the output of the python example above it, or a figure, marked ``<!-- figure -->``.

How a shown output is compared with what the code prints, line by line (trailing spaces aside):
a line holding only ``...`` skips any number of lines (none included); every other line must be
printed, in order, as shown. Numbers are compared exactly unless the block says otherwise in an HTML
comment right above it, ``<!-- check: OPTION, OPTION -->``:

- ``seconds``: numbers of wall-clock time (a number followed by ``s`` or ``img/s``) are masked;
- ``rel=R``, ``abs=A``: numbers written with a decimal point or an exponent, which come out of float32
  arithmetic and differ in their last bits between CPUs, may differ by R (relative) or A (absolute);
  integers (byte counts, steps, counts) are always compared exactly, and NaN only matches NaN;
- ``status=N``: the command's exit status (0 unless said);
- ``needs=MODULE``: skipped, with the reason, where an optional package is not installed.

A block shown but deliberately not run is marked ``<!-- not run: REASON -->``; a Markdown table that
a command prints is marked the same way. Each such block is a skipped test whose reason ``pytest -ra``
lists, so they are counted and named in every run. Deterministic outputs (the meta device, the time
model, counts) are what the docs show most; keep shown outputs to commands that run in a second or two
(small nets, the meta device), so this file stays within about 40 s of CPU.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import math
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
        "tutorials/README.md"]

NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)(?![\w.])")
SECONDS = re.compile(r"\s?(?:s|img/s)\b")
MARK = re.compile(r"^<!--\s*(not run|check|figure)\s*:?\s*(.*?)\s*-->\s*$")
SHELL_PROGRAMS = {"pip", "pytest", "ruff", "git", "cd", "jupytext", "jupyter", "python"}


@dataclasses.dataclass
class Block:
    file: str
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str = ""  # "not run: ...", "check: ...", "figure" or ""

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    def options(self) -> dict[str, str]:
        if not self.mark.startswith("check:"):
            return {}
        out = {}
        for opt in filter(None, (o.strip() for o in self.mark.removeprefix("check:").split(","))):
            key, _, value = opt.partition("=")
            out[key.strip()] = value.strip()
        return out


def parse(file: str) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced blocks of ``file``, each with the mark right above it (blank lines between allowed),
    and the marks that stand before something other than a fence (a Markdown table)."""
    lines = (ROOT / file).read_text().split("\n")
    blocks, loose, mark, i = [], [], None, 0
    while i < len(lines):
        line = lines[i]
        if m := MARK.match(line.strip()):
            mark = (i + 1, f"{m[1]}: {m[2]}" if m[2] else m[1])
        elif fence := re.match(r"^(\s*)```(\S*)\s*$", line):
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith("```"):
                end += 1
            if end == len(lines):
                raise ValueError(f"{file}:{i + 1}: a fenced block that never closes")
            body = [x.removeprefix(fence[1]) for x in lines[i + 1:end]]
            block = Block(file, i + 1, fence[2], "\n".join(body) + "\n", mark[1] if mark else "")
            blocks.append(block)
            mark, i = None, end
        elif line.strip() and mark:
            loose.append(mark)
            mark = None
        i += 1
    return blocks, loose


def all_blocks() -> list[Block]:
    return [b for f in DOCS for b in parse(f)[0]]


# ---- comparing a shown output with a printed one ----

def _numbers_match(got: str, shown: str, opts: dict) -> bool:
    """One line: the same words (runs of spaces aside: a number's width moves the columns), the same
    integers, and each decimal within the tolerance; wall-clock numbers masked under ``seconds``."""
    def split(s):
        nums, rest = [], []
        pos = 0
        for m in NUMBER.finditer(s):
            rest.append(s[pos:m.start()])
            timed = "seconds" in opts and SECONDS.match(s, m.end())
            nums.append(None if timed else m[0])
            pos = m.end()
        rest.append(s[pos:])
        return nums, [" ".join(r.split()) for r in rest]

    (a, words_a), (b, words_b) = split(got), split(shown)
    if words_a != words_b or len(a) != len(b):
        return False
    rel, abs_ = float(opts.get("rel", 0)), float(opts.get("abs", 0))
    for x, y in zip(a, b):
        if x is None or y is None:
            if x is not None or y is not None:
                return False
            continue
        if x == y:
            continue
        integral = not re.search(r"[.e]|nan|inf", x + y)
        fx, fy = float(x.replace(",", "")), float(y.replace(",", ""))
        if integral or math.isnan(fx) or math.isnan(fy) \
                or not math.isclose(fx, fy, rel_tol=rel, abs_tol=abs_):
            return False
    return True


def line_matches(got: str, shown: str, opts: dict) -> bool:
    return got == shown or (bool(opts) and _numbers_match(got, shown, opts))


def assert_shows(got: str, shown: str, opts: dict, where: str) -> None:
    """``got`` (what ran) holds ``shown`` (what the doc shows): line by line, in order, ``...`` lines
    skipping any number of lines."""
    printed = [x.rstrip() for x in got.rstrip("\n").split("\n")] if got.strip() else []
    expected = [x.rstrip() for x in shown.rstrip("\n").split("\n")] if shown.strip() else []
    segments, current = [], []
    for x in expected:
        if x.strip() == "...":
            segments.append(current)
            current = []
        else:
            current.append(x)
    segments.append(current)  # segments[0] starts the output, segments[-1] ends it; ... between
    pos = 0
    for k, seg in enumerate(segments):
        anchored_start, anchored_end = k == 0, k == len(segments) - 1
        if anchored_end and not seg and k > 0:
            break  # the doc ends with ...: anything may follow
        starts = [pos] if anchored_start else range(pos, len(printed) - len(seg) + 1)
        found = None
        for s in starts:
            if all(s + j < len(printed) and line_matches(printed[s + j], seg[j], opts)
                   for j in range(len(seg))):
                if anchored_end and s + len(seg) != len(printed):
                    continue
                found = s
                break
        if found is None:  # say where the best partial match of this stretch stops
            def matched(s):
                return next((j for j in range(len(seg)) if s + j >= len(printed)
                             or not line_matches(printed[s + j], seg[j], opts)), len(seg))
            s = max(starts, key=matched, default=pos)
            j = matched(s)
            shown_line = seg[j] if j < len(seg) else "(the end of the output)"
            got_line = printed[s + j] if s + j < len(printed) else "(nothing)"
            if j == 0 and not anchored_start:  # nothing of it printed: the closest line after the last match
                got_line = max(printed[pos:] or ["(nothing)"],
                               key=lambda x: difflib.SequenceMatcher(None, x, shown_line).ratio())
            raise AssertionError(
                f"{where}: the doc shows a line this run does not print where shown "
                f"(options {opts or 'none'})"
                f"\n  shown:   {shown_line!r}\n  printed: {got_line!r}"
                "\nthe whole output:\n" + "\n".join(printed))
        pos = found + len(seg)


# ---- running ----

def _needs(opts: dict) -> None:
    if "needs" in opts:
        pytest.importorskip(opts["needs"], reason=f"{opts['needs']} is not installed (an optional extra)")


def run_command(command: str, capsys) -> tuple[int, str]:
    """``snlite ARGS`` or ``python -m MODULE ARGS``, in-process: (exit status, stdout + stderr)."""
    argv = shlex.split(command, comments=True)
    if argv[0] == "snlite":
        from snlite import cli

        main, args = cli.main, argv[1:]
    elif argv[:2] == ["python", "-m"]:
        main, args = importlib.import_module(argv[2]).main, argv[3:]
    else:
        raise AssertionError(f"a console block runs snlite or python -m only, not {command!r}")
    capsys.readouterr()
    try:
        status = main(args)
    except SystemExit as e:
        status = e.code
    out = capsys.readouterr()
    return status or 0, out.out + out.err


def console_commands(text: str) -> list[tuple[str, str]]:
    """(command, the output shown under it) for each ``$ `` line of a console block."""
    pairs = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            pairs.append((line[2:], []))
        else:
            assert pairs, f"a console block starts with a command line ($ ...), not {line!r}"
            pairs[-1][1].append(line)
    return [(c, "\n".join(out)) for c, out in pairs]


def check_bash(block: Block) -> list[str]:
    """Each line of a bash block, checked without running it; returns the lines left to the shell."""
    from snlite import cli

    shell = []
    for line in block.text.splitlines():
        for part in re.split(r"&&|\|", line.split(" #")[0]):
            argv = shlex.split(part)
            while argv and re.match(r"^\w+=", argv[0]):  # VAR=value before a command
                argv.pop(0)
            if not argv:
                continue
            if argv[0] == "snlite":
                try:
                    cli.build_parser().parse_args(argv[1:])
                except SystemExit as e:
                    raise AssertionError(f"{block.id}: `{part.strip()}` does not parse "
                                         f"(exit {e.code})") from e
            elif argv[:2] == ["python", "-m"]:
                assert importlib.util.find_spec(argv[2]), f"{block.id}: no module {argv[2]}"
            elif argv[0] == "python":
                assert (ROOT / argv[1]).exists(), f"{block.id}: no script {argv[1]}"
            else:
                assert argv[0] in SHELL_PROGRAMS, \
                    f"{block.id}: unknown program {argv[0]!r} (add it to SHELL_PROGRAMS or mark the block)"
                shell.append(part.strip())
    return shell


@pytest.fixture
def cpu_only(monkeypatch, tmp_path):
    """The docs show the CPU's outputs: ``auto`` means the host device here even on a GPU machine;
    each example and command runs in its own empty folder."""
    from snlite import device

    monkeypatch.setattr(device, "real_gpu_available", lambda: False)
    monkeypatch.chdir(tmp_path)


BLOCKS = all_blocks()


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block: Block, capsys, cpu_only):
    """Run one block as its tag and mark say, and compare what it prints with what the doc shows."""
    if block.mark.startswith("not run"):
        pytest.skip(f"{block.id}: {block.mark}")
    opts = block.options()
    _needs(opts)
    if block.lang == "python":
        capsys.readouterr()
        exec(compile(block.text, block.id, "exec"), {"__name__": "docs_example"})
        printed = capsys.readouterr().out
        if (shown := output_of(block)) is not None:
            assert_shows(printed, shown.text, {**opts, **shown.options()}, block.id)
    elif block.lang == "console":
        for command, shown in console_commands(block.text):
            status, printed = run_command(command, capsys)
            assert status == int(opts.get("status", 0)), \
                f"{block.id}: `{command}` exited {status}, the doc says {opts.get('status', 0)}\n{printed}"
            assert_shows(printed, shown, opts, f"{block.id}: {command}")
    elif block.lang == "bash":
        check_bash(block)
    elif block.lang == "text":
        assert block.mark == "figure" or output_of_example_before(block), \
            f"{block.id}: a text block is the output of the python example right above it, or " \
            "marked <!-- figure -->"
    else:
        raise AssertionError(f"{block.id}: tag the block python, console, bash or text (not {block.lang!r})")


def output_of(block: Block) -> Block | None:
    """The text block that shows what python ``block`` prints: the next block of its file, if it is one."""
    same = [b for b in BLOCKS if b.file == block.file]
    k = same.index(block)
    after = same[k + 1] if k + 1 < len(same) else None
    return after if after and after.lang == "text" and after.mark != "figure" else None


def output_of_example_before(block: Block) -> bool:
    same = [b for b in BLOCKS if b.file == block.file]
    k = same.index(block)
    return k > 0 and same[k - 1].lang == "python" and output_of(same[k - 1]) is block


def test_loose_marks_stand_before_tables():
    """A mark that is not above a fenced block stands right above a Markdown table (which it names as
    not run); listed as skipped so that the count of what is not run includes them."""
    loose = [(f, line, mark) for f in DOCS for line, mark in parse(f)[1]]
    for f, line, mark in loose:
        text = (ROOT / f).read_text().split("\n")
        nxt = next(x for x in text[line:] if x.strip())
        assert nxt.startswith("|") and mark.startswith("not run"), f"{f}:{line}: {mark} stands before {nxt!r}"
    if loose:
        pytest.skip("tables not run: " + "; ".join(f"{f}:{line}: {mark}" for f, line, mark in loose))


# ---- the harness itself ----

def test_the_comparison_fails_on_a_changed_number_word_or_line():
    shown = "peak 185,344 bytes\n...\nloss 0.051 in 0.10 s"
    got = "peak 185,344 bytes\nanything\nmore\nloss 0.052 in 2.50 s"
    opts = {"abs": "0.0015", "seconds": ""}
    assert_shows(got, shown, opts, "t")
    for bad in ("peak 185,345 bytes\nloss 0.051 in 0.10 s",           # an integer: always exact
                "peak 185,344 bytes\nloss 0.054 in 0.10 s",           # beyond the tolerance
                "peak 185,344 bytes\ncost 0.051 in 0.10 s",           # a word
                "peak 185,344 bytes\nloss nan in 0.10 s",             # NaN only where NaN is shown
                "peak 185,344 bytes\nloss 0.051 in 0.10 s\nextra",    # a line after the last shown
                "loss 0.051 in 0.10 s"):                              # a shown line missing
        with pytest.raises(AssertionError):
            assert_shows(bad, shown, opts, "t")
    with pytest.raises(AssertionError):  # seconds masked only where the block says so
        assert_shows("took 2.5 s", "took 0.1 s", {}, "t")
    assert_shows("took 2.5 s", "took 0.1 s", {"seconds": ""}, "t")
    with pytest.raises(AssertionError):  # a time model's milliseconds are never masked
        assert_shows("step 142.06 ms", "step 122.18 ms", {"seconds": ""}, "t")


MAX_NOT_RUN = 8  # blocks and tables shown but not run: keep them few, and say in each why


def test_few_blocks_are_not_run():
    not_run = [b.id for b in BLOCKS if b.mark.startswith("not run")]
    not_run += [f"{f}:{line}" for f in DOCS for line, mark in parse(f)[1] if mark.startswith("not run")]
    assert len(not_run) <= MAX_NOT_RUN, f"{len(not_run)} blocks are not run: {not_run}; show a smaller " \
        "example that runs in a second or two instead"


def test_every_block_is_one_the_harness_knows():
    assert len(BLOCKS) >= 20
    kinds = {b.lang for b in BLOCKS}
    assert kinds <= {"python", "console", "bash", "text"}, kinds


# ---- links ----

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but - and _), spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen, out = {}, set()
    for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def test_every_relative_link_resolves():
    bad = []
    for f in DOCS:
        text = re.sub(r"```.*?```", "", (ROOT / f).read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, anchor = target.partition("#")
            dest = (ROOT / f).parent / path if path else ROOT / f
            if not dest.exists():
                bad.append(f"{f}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{f}: {target} (no such heading)")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_slug_is_githubs():
    assert slug("When something goes wrong: NaN, errors, exit statuses") == \
        "when-something-goes-wrong-nan-errors-exit-statuses"
    assert slug("4. The Unified Tensor Pool: offload, prefetch and the tensor cache") == \
        "4-the-unified-tensor-pool-offload-prefetch-and-the-tensor-cache"


# ---- what CI runs is what the README says ----

def test_ci_runs_the_readme_commands():
    """.ci/run runs the README's two commands exactly as written there."""
    readme = [b.text.strip() for b in parse("README.md")[0] if b.lang == "bash"][:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert len(readme) == 2 and all(cmd in ci.splitlines() for cmd in readme), (readme, ci)


def test_the_memory_config_table_names_every_field():
    """docs/memory-config.md's table has one row per MemoryConfig field, with its choices."""
    from snlite.config import CHOICES, MemoryConfig

    text = (ROOT / "docs" / "memory-config.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, flags=re.M))
    fields = {f.name for f in dataclasses.fields(MemoryConfig)}
    missing, extra = sorted(fields - set(rows)), sorted(set(rows) - fields)
    assert not missing, f"docs/memory-config.md's table has no row for {missing}"
    assert not extra, f"docs/memory-config.md's table has rows for no field: {extra}"
    for name, choices in CHOICES.items():
        for c in choices:
            assert f"`{c}`" in rows[name], f"{name}: {c} is missing from its row"


def test_every_layer_kind_is_in_the_layer_list_and_has_its_builder():
    """docs/training.md's list of layers names every kind of LAYER_TYPES (the data layer aside), each
    a Graph method of that name (docs/new-layer.md, step 6): gelu_tanh was added with nothing to say
    the list missed it, and the transformers' six kinds were never in it."""
    from snlite.graph import Graph
    from snlite.layers import LAYER_TYPES

    text = (ROOT / "docs" / "training.md").read_text()
    listed = set(re.findall(r"`(\w+)`", text.split("## Layers\n", 1)[1].strip().split("\n\n")[0]))
    kinds = set(LAYER_TYPES) - {"data"}
    assert not kinds - listed, f"docs/training.md's layer list misses {sorted(kinds - listed)}"
    assert all(callable(getattr(Graph, kind, None)) for kind in kinds)


def test_every_module_is_on_the_map():
    """Each module of snlite/ and kernels/ is in the README's reading order or on the map of
    docs/architecture.md."""
    named = set(re.findall(r"`(?:snlite/)?(\w+\.py)`", (ROOT / "README.md").read_text()))
    named |= set(re.findall(r"`(\w+\.py)`", (ROOT / "docs" / "architecture.md").read_text()))
    missing = sorted(p.relative_to(ROOT).as_posix() for package in ("snlite", "kernels")
                     for p in (ROOT / package).glob("*.py")
                     if p.name != "__init__.py" and p.name not in named)
    assert not missing, f"not on the map (docs/architecture.md): {missing}"
