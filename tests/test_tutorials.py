"""Every tutorial runs as a script (quick mode) and prints its key results; no tutorial needs matplotlib.

Each tutorial checks its own claims and prints them as ``... True``; these tests run it in a
subprocess from the repository root, as a reader would, and look for those lines. Plots go to a
temporary folder (SNLITE_TUTORIAL_OUT). The whole file takes about 40 s on a two-core machine.
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

# tutorial -> lines (regular expressions) its output must contain
KEY_LINES = {
    "00_numba_cuda_simulator.py": [r"matches NumPy exactly: True", r"same bits when run again: True",
                                   r"atomic_count\s+256 of 256 increments", r"v3\s+\S+\s+True"],
    "01_where_memory_goes.py": [r"same as PAPER\.md section 2: True", r"= the paper-count peak: True"],
    "02_liveness.py": [r"each step's out set is the next step's in set: True",
                       r"identical through the forward pass \(before the softmax\): True"],
    "03_tensor_pool.py": [r"alloc G4: FULL \(4 KB free, largest 2 KB, fragmentation 50%\)", r"alloc G4: at 0 KB",
                          r"pool\s+1\s+0\s+0"],
    "04_offload_prefetch_cache.py": [r"the plan's transfers add up to [\d,.]+ MiB: True",
                                     r"never falls as the budget shrinks: True; "
                                     r"nothing moves at the unlimited budget: True"],
    "05_recompute.py": [r"cost-aware: peak <= speed-centric's, re-runs \d+ between speed's \d+ and memory's \d+: True"],
    "06_conv_workspace.py": [r"dynamic, unlimited, equals fastest: True",
                             r"estimated conv time never falls as the budget shrinks: True",
                             r"at most 2 launches per chunk \(target <= 2\): True",
                             r"fewest waves [\d.]+ \(.*\) \(target >= 2 on the H200\): True"],
    "07_end_to_end.py": [r"losses identical: True; all \d+ weight and buffer tensors bit-identical: True",
                         r"this run on the host device: [\d,]+; equal: True", r"superneurons\s+ResNet-\d+"],
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
}

# a sitecustomize that makes some modules unimportable, as on a machine without them
HIDE = """
import sys


class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name in {names!r}:
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


def run_tutorial(name, out_dir, extra_path=None):
    env = dict(os.environ, SNLITE_TUTORIAL_QUICK="1", SNLITE_TUTORIAL_OUT=str(out_dir))
    if name.startswith("00") and os.environ.get("NUMBA_ENABLE_CUDASIM") != "0":
        env["NUMBA_ENABLE_CUDASIM"] = "1"  # the simulator, unless a real-GPU run was asked for
    paths = [str(p) for p in (extra_path, ROOT) if p] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    proc = subprocess.run([sys.executable, str(TUTORIALS / name)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{output[-4000:]}"
    return output


def test_every_tutorial_is_listed():
    on_disk = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
    assert on_disk == sorted(KEY_LINES), "a tutorial without key lines here, or one listed here that is gone"
    index = (TUTORIALS / "README.md").read_text()
    missing = [n for n in on_disk if n not in index]
    assert not missing, f"tutorials/README.md does not list {missing}"


@pytest.mark.parametrize("name", sorted(KEY_LINES))
def test_tutorial_runs_and_prints_its_results(name, tmp_path):
    output = run_tutorial(name, tmp_path)
    for pattern in KEY_LINES[name]:
        assert re.search(pattern, output), f"{name}: no line matching {pattern!r} in its output:\n{output[-4000:]}"
    if importlib.util.find_spec("matplotlib") is not None:
        for png in PLOTS.get(name, []):
            assert (tmp_path / png).stat().st_size > 0, f"{name} did not save {png}"


@pytest.mark.parametrize("hidden", ["matplotlib", "snlite.plot"], ids=["no-matplotlib", "no-snlite.plot"])
def test_a_tutorial_finishes_without_plotting(hidden, tmp_path):
    out = tmp_path / "out"
    output = run_tutorial("02_liveness.py", out, extra_path=hide(tmp_path, hidden))
    assert re.search(r"plot 02_alexnet_liveness\.png skipped.*pip install", output), output[-2000:]
    assert re.search(r"identical through the forward pass \(before the softmax\): True", output)
    assert not list(out.glob("*.png"))


def test_end_to_end_falls_back_to_synthetic_data_without_scikit_learn(tmp_path):
    output = run_tutorial("07_end_to_end.py", tmp_path / "out", extra_path=hide(tmp_path, "sklearn"))
    assert "using synthetic 8x8 images instead" in output
    assert re.search(KEY_LINES["07_end_to_end.py"][0], output), output[-2000:]
