"""docs/paper.md, the project's notes on the paper, is in the repository, and every reference to it resolves.

Code, docs, tutorials, tests and command output cite the notes as "docs/paper.md section N" (or a
Markdown link to one of its headings). This scans every file of the checkout (the files git tracks
and the untracked ones it does not ignore; without git, every file outside caches and build
folders) and fails on a section or a heading the notes do not have, and on any reference to a
notes file that does not exist in the repository.
"""
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTES = ROOT / "docs" / "paper.md"
SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis", "build", "dist",
             "bench-out", "paper-out", "out"}

SECTION_REF = re.compile(r"paper\.md[,:]?\s+sections?\s+(\d+)")  # "docs/paper.md section 4"
ANCHOR_REF = re.compile(r"paper\.md#([\w-]+)")  # a Markdown link to a heading
MISSING_NOTES = re.compile(r"\b[A-Z_]+\.md\b")  # an upper-case Markdown file name: it must be in the checkout
HEADING = re.compile(r"^## (\d+)\. (.+)$", re.M)


def checkout_files():
    """Relative paths of the checkout's files, as a fresh clone (or the student copy) has them."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
        return sorted({p for p in out.split("\0") if p and (ROOT / p).is_file()})
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            paths += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames]
        return sorted(paths)


def texts():
    for rel in checkout_files():
        try:
            yield rel, (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a figure or another binary file


def github_anchor(title: str) -> str:
    """The id GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def notes_sections():
    return {int(n): title for n, title in HEADING.findall(NOTES.read_text(encoding="utf-8"))}


def test_the_notes_are_in_the_repository_with_numbered_sections():
    assert NOTES.is_file(), "docs/paper.md is missing: code and docs cite it"
    numbers = sorted(notes_sections())
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 7, \
        f"docs/paper.md's '## N. Title' sections are {numbers}: number them 1, 2, ... without gaps"


def test_every_reference_to_the_notes_resolves():
    sections = notes_sections()
    anchors = {github_anchor(f"{n}. {t}") for n, t in sections.items()}
    bad, cited = [], set()
    names = {Path(rel).name for rel in checkout_files()}
    for rel, text in texts():
        for no, line in enumerate(text.splitlines(), 1):
            for m in MISSING_NOTES.finditer(line):
                if m.group(0) not in names:
                    bad.append(f"{rel}:{no}: cites {m.group(0)}, which is not in the repository (cite "
                               "docs/paper.md)")
        for m in SECTION_REF.finditer(text):
            n = int(m.group(1))
            cited.add(n)
            if n not in sections:
                no = text.count("\n", 0, m.start()) + 1
                bad.append(f"{rel}:{no}: cites docs/paper.md section {n}, which does not exist "
                           f"(sections 1-{max(sections)})")
        for m in ANCHOR_REF.finditer(text):
            if m.group(1) not in anchors:
                no = text.count("\n", 0, m.start()) + 1
                bad.append(f"{rel}:{no}: links to docs/paper.md#{m.group(1)}, which is no heading there")
    # the notes' own table of contents
    for m in re.finditer(r"\]\(#([\w-]+)\)", NOTES.read_text(encoding="utf-8")):
        if m.group(1) not in anchors:
            bad.append(f"docs/paper.md: links to #{m.group(1)}, which is no heading there")
    assert not bad, "dangling references to the paper's notes:\n" + "\n".join(bad)
    assert cited, "nothing cites docs/paper.md: is the scan looking at the right files?"


def test_the_scan_sees_code_docs_tutorials_and_tests():
    files = set(checkout_files())
    for rel in ("snlite/liveness.py", "README.md", "docs/INSTRUCTORS.md", "tutorials/01_where_memory_goes.py",
                "tests/test_liveness.py", "snlite/cli_plan.py"):
        assert rel in files, f"the reference scan misses {rel}"
