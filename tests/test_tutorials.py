"""Every tutorial runs as a notebook in a real Jupyter kernel, as a reader would; two also run as scripts.

A tutorial states what you should see with ``snlite.lesson.expect(claim, check)``: it prints the
claim and whether the run shows it, and a claim the run does not show stops the tutorial with an
error. So each run here must end normally, print as many checked claims as the file has
``expect(`` calls (at least), never print a claim that failed, and print its key lines. The
notebook is the file read by jupytext (its ``# %%`` cells) and executed cell by cell by nbclient
in an ipykernel kernel, whose plots must display inline (tests/test_tutorials_notebooks.py). The
script runs (a subprocess from the repository root) add what a notebook cannot show: plots saved
without a notebook to show them in (01), and a lesson that finishes without the optional extras
(07, with matplotlib and scikit-learn hidden). All run in quick mode (``SNLITE_TUTORIAL_QUICK=1``),
plots go to a temporary folder (``SNLITE_TUTORIAL_OUT``). The same code runs either way, so running
every tutorial twice bought nothing but a third of a minute of the suite.
"""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
NAMES = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
SHOWN = "-> yes: this run shows it"
NOT_SHOWN = "NO: this run does not show it"
CLAIM = "You should see:"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# tutorial -> lines (regular expressions) its output must contain, besides its checked claims
KEY_LINES = {
    "00_numba_cuda_simulator.py": [r"atomic_count\s+256 of 256 increments", r"v3\s+\S+\s+True"],
    "01_where_memory_goes.py": [r"forward:  a1 b2 c3 e4 d5 f6 g7 h8 i9 j10",
                                r"l_peak = [\d,.]+ MiB, at norm1"],
    "02_liveness.py": [r"10  CONV bwd\s+\{t0,t6,t8\}\s+\{t8,t9\}", r"liveness saves \d+%"],
    "03_tensor_pool.py": [r"alloc G4: FULL \(4 KB free, largest 2 KB, fragmentation 50%\)",
                          r"alloc G4: at 0 KB", r"pool\s+1\s+0\s+0"],
    "04_offload_prefetch_cache.py": [r"the plan's transfers add up to [\d,.]+ MiB: True",
                                     r"race on conv1, arena bytes .*: freed while another stream may "
                                     r"still read it",
                                     r"copy_out copy [\d,]+ bytes device -> host",
                                     r"300 MiB  [\d,.]+ MiB\n +100 MiB  none: not even the staged batch"],
    "05_recompute.py": [r"alexnet \(200\)\s+cost_aware\s+\d+"],
    "06_conv_workspace.py": [r"dynamic, unlimited, equals fastest: True",
                             r"estimated conv time never falls as the budget shrinks: True",
                             r"at most 2 launches per chunk \(target <= 2\): True",
                             r"fewest waves [\d.]+ \(.*\) \(target >= 2 on the H200\): True"],
    "07_end_to_end.py": [r"\d+ steps x 2 models in", r"superneurons\s+ResNet-\d+"],
    "08_how_far_from_optimal.py": [r"optimal plan: drop .*; peak [\d.]+ MiB.*optimal",
                                   r"cost-aware \(SuperNeurons\)\s+[\d.]+\s+[\d.]+%\s+[\d.]+\s+\+0\.0%"],
    "09_your_own_model.py": [r"resnet: 71 layers, 11,689,512 parameters",
                             r"superneurons\(\)\s+largest batch in 4 GiB:\s+\d+",
                             r"the fastest that fits: \S+"],
}

# the plots each tutorial saves (checked where matplotlib is installed)
PLOTS = {
    "01_where_memory_goes.py": ["01_alexnet_baseline.png"],
    "02_liveness.py": ["02_alexnet_liveness.png"],
    "03_tensor_pool.py": ["03_alexnet_raw_vs_pool.png"],
    "04_offload_prefetch_cache.py": ["04_alexnet_offload.png", "04_alexnet_cache_budget.png"],
    "05_recompute.py": ["05_alexnet_recompute_tradeoff.png"],
    "06_conv_workspace.py": ["06_alexnet_workspace.png"],
    "07_end_to_end.py": ["07_digits_train_step.png"],
    "08_how_far_from_optimal.py": ["08_alexnet_frontier.png"],
}

# tutorials that need an optional package (their notebook runs skip, saying so, where it is missing)
NEEDS = {"09_your_own_model.py": ("torch", "torchvision")}

# tutorials whose script run hides optional extras, as on a machine without them (their notebook run has them)
WITHOUT_EXTRAS = {"07_end_to_end.py": ("matplotlib", "sklearn")}

# a sitecustomize that makes some modules unimportable, as on a machine without them
HIDE = """
import sys


class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by tests/test_tutorials.py)")
        return None


sys.meta_path.insert(0, _Hide())
"""


def hide(tmp_path, *names):
    """A folder to put first on PYTHONPATH, whose sitecustomize makes ``names`` unimportable."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE.format(names=set(names)))
    return site


def real_gpu():
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "0"


def tutorial_env(name, out_dir, extra_path=None):
    env = dict(os.environ, SNLITE_TUTORIAL_QUICK="1", SNLITE_TUTORIAL_OUT=str(out_dir))
    if name.startswith("00") and not real_gpu():
        env["NUMBA_ENABLE_CUDASIM"] = "1"  # the simulator, unless a real-GPU run was asked for
    paths = [str(p) for p in (extra_path, ROOT) if p] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def run_script(name, out_dir, extra_path=None):
    proc = subprocess.run([sys.executable, str(TUTORIALS / name)], cwd=ROOT, capture_output=True, text=True,
                          env=tutorial_env(name, out_dir, extra_path), timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{output[-4000:]}"
    return output


def check_claims(name, output):
    """Every claim printed was shown, and every ``expect(`` of the file printed one."""
    assert NOT_SHOWN not in output, f"{name} makes a claim its run does not show:\n{output[-4000:]}"
    claims = output.count(CLAIM)
    assert output.count(SHOWN) == claims, f"{name}: a claim printed without its check line:\n{output[-4000:]}"
    in_source = len(re.findall(r"^\s*expect\(", (TUTORIALS / name).read_text(), flags=re.M))
    if not (name.startswith("00") and real_gpu()):  # 00 skips its simulator-only claims on a GPU
        assert claims >= in_source, f"{name}: {in_source} expect() calls in the file, {claims} claims printed"
    assert claims >= 3, f"{name} checks only {claims} claims"
    for pattern in KEY_LINES[name]:
        assert re.search(pattern, output), \
            f"{name}: no line matching {pattern!r} in its output:\n{output[-4000:]}"


def test_every_tutorial_is_listed():
    assert NAMES == sorted(KEY_LINES), "a tutorial without key lines here, or one listed here that is gone"
    assert set(WITHOUT_EXTRAS) <= set(SCRIPT_RUNS) <= set(NAMES)
    index = (TUTORIALS / "README.md").read_text()
    missing = [n for n in NAMES if n not in index]
    assert not missing, f"tutorials/README.md does not list {missing}"


def test_each_tutorial_states_the_time_the_readme_lists():
    """Both are one measurement (python -m snlite.bench tutorials): a header said 15 s where the README
    said 6 s."""
    readme = (TUTORIALS / "README.md").read_text()
    listed = dict(re.findall(r"^\| \[`(\d\d_\w+\.py)`\].*\| ~([\d.]+) s \|$", readme, re.M))
    assert sorted(listed) == NAMES
    for name in NAMES:
        stated = re.search(r"About ([\d.]+) s\b", (TUTORIALS / name).read_text())
        assert stated is None or stated[1] == listed[name], \
            f"{name} says about {stated[1]} s, tutorials/README.md ~{listed[name]} s"


SCRIPT_RUNS = ("01_where_memory_goes.py", "07_end_to_end.py")  # see the module docstring


@pytest.mark.parametrize("name", SCRIPT_RUNS)
def test_tutorial_as_a_script(name, tmp_path):
    hidden = WITHOUT_EXTRAS.get(name, ())
    output = run_script(name, tmp_path / "out", extra_path=hide(tmp_path, *hidden) if hidden else None)
    check_claims(name, output)
    for png in PLOTS.get(name, []):
        if HAS_MATPLOTLIB and "matplotlib" not in hidden:
            assert (tmp_path / "out" / png).stat().st_size > 0, f"{name} did not save {png}"
        else:
            assert re.search(rf"plot {re.escape(png)} skipped.*pip install", output), output[-2000:]
            assert not (tmp_path / "out" / png).exists()
    if "sklearn" in hidden:
        assert "using synthetic 8x8 images instead" in output
