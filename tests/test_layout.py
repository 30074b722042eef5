"""The architecture the docs describe, checked on the source: imports flow one way (no cycle
between snlite's modules, kernels never import snlite), imports sit at the top of a module except
those of optional packages, and no module grows past what one sitting can read."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# packages of the extras (or none): they may be absent, so they are imported where they are used
OPTIONAL = ("scipy", "matplotlib", "torch", "torchvision", "sklearn", "threadpoolctl", "IPython", "cupy")
MAX_LINES = 450
MAX_PLACEMENT_LINES = 400


def modules(package: str) -> dict[str, ast.Module]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def imports(tree: ast.Module, known) -> list[tuple[str, bool]]:
    """(imported module, whether the import sits inside a function) for each import of ``tree``."""
    out = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                for a in child.names:  # `from snlite import placement` imports the module snlite.placement
                    sub = f"{child.module}.{a.name}"
                    out.append((sub if sub in known else child.module, inner))
            visit(child, inner)

    visit(tree, False)
    return out


def edges(package: str) -> dict[str, set[str]]:
    mods = modules(package)
    return {m: {i for i, _ in imports(t, mods) if i in mods and i != m} for m, t in mods.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a depth-first search), or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = "done"
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_in_snlite():
    graph = edges("snlite")
    inward = sorted(m for m, deps in graph.items() if "snlite" in deps and m != "snlite")
    assert not inward, f"{inward} import the package snlite (which imports everything); " \
        "import the module instead"
    cycle = find_cycle({m: deps for m, deps in graph.items() if m != "snlite"})
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_kernels_never_import_snlite():
    mods = modules("kernels")
    bad = sorted(m for m, t in mods.items() for i, _ in imports(t, mods) if i.split(".")[0] == "snlite")
    assert not bad, f"{bad} import snlite: kernels sit below it"


def test_imports_inside_functions_are_only_of_optional_packages():
    mods = modules("snlite")
    bad = sorted(f"{m} imports {i}" for m, t in mods.items() for i, nested in imports(t, mods)
                 if nested and i.split(".")[0] not in OPTIONAL)
    assert not bad, "imports inside functions (move them to the top of the module):\n" + "\n".join(bad)


def test_only_the_cuda_device_and_the_gpu_script_import_numba_cuda():
    """docs/architecture.md says so: every other module runs where numba.cuda would fail to import."""
    def cuda_imports(tree):
        return any(isinstance(n, ast.Import) and any(a.name.startswith("numba.cuda") for a in n.names)
                   or isinstance(n, ast.ImportFrom) and n.module and (n.module.startswith("numba.cuda") or
                                                                      n.module == "numba" and
                                                                      any(a.name == "cuda" for a in n.names))
                   for n in ast.walk(tree))

    assert sorted(m for m, t in modules("snlite").items() if cuda_imports(t)) == \
        ["snlite.device_cuda", "snlite.gpucheck"]
    assert "`device_cuda.py`: the CUDA device, with `gpucheck.py` (the GPU script) the only modules of " \
        "snlite that import `numba.cuda`" in (ROOT / "docs" / "architecture.md").read_text()


def test_no_module_is_too_long_to_read():
    lengths = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "snlite").rglob("*.py")}
    assert lengths["placement.py"] <= MAX_PLACEMENT_LINES, lengths["placement.py"]
    long = {n: k for n, k in lengths.items() if k > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_reading_order_names_real_files_with_their_sizes():
    """The README lists the core in reading order with line counts: each file exists and its count
    is within 15 lines of the truth, and placement.py is on the list."""
    import re

    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| \d+ \| `([^`]+)` \| (\d+) \|", text, flags=re.M)
    assert len(rows) >= 15 and any(path.endswith("placement.py") for path, _ in rows)
    for path, stated in rows:
        actual = len((ROOT / path).read_text().splitlines())
        assert abs(actual - int(stated)) <= 15, \
            f"{path}: the README says {stated} lines, it has {actual}"


def test_the_reading_order_is_the_import_order():
    """A core file imports only core files listed before it (or modules off the list), so a student
    reading in order never meets a name from further on."""
    import re

    text = (ROOT / "README.md").read_text()
    order = ["snlite." + p.removeprefix("snlite/").removesuffix(".py")
             for p in re.findall(r"^\| \d+ \| `([^`]+)` \|", text, flags=re.M)]
    graph = edges("snlite")
    late = [f"{m} imports {d}" for i, m in enumerate(order) for d in sorted(graph[m])
            if d in order and order.index(d) > i]
    assert not late, "the README's reading order has a module before what it imports: " + "; ".join(late)


def test_every_public_name_and_every_module_is_an_attribute_of_a_fresh_snlite():
    """``snlite.search.min_budget`` (as docs/results.md writes it) raised AttributeError in a fresh
    notebook, and worked once something had imported snlite.search: the package imports its modules,
    like the names of ``__all__``, on first use."""
    import subprocess
    import sys

    script = ("import snlite, sys\n"
              "missing = [n for n in snlite.__all__ + sys.argv[1:] if getattr(snlite, n, None) is None]\n"
              "assert not hasattr(snlite, 'no_such_module'), 'a name that is nothing'\n"
              "print(missing)")
    proc = subprocess.run([sys.executable, "-c", script, "search", "timing", "checker", "budget"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]
