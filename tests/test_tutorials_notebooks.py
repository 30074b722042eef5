"""Every tutorial as a notebook, in a real Jupyter kernel: the same file read by jupytext (its ``# %%``
cells) and executed cell by cell by nbclient in an ipykernel kernel; every claim checked and every plot
displayed inline. The rules, the key lines and the script runs are in tests/test_tutorials.py."""
import importlib.util

import pytest

from test_tutorials import HAS_MATPLOTLIB, NAMES, NEEDS, PLOTS, TUTORIALS, check_claims, tutorial_env


@pytest.mark.parametrize("name", NAMES)
def test_tutorial_as_a_notebook(name, tmp_path):
    jupytext = pytest.importorskip("jupytext",
                                   reason="the notebook runs need the test extra: pip install -e '.[test]'")
    nbclient = pytest.importorskip("nbclient",
                                   reason="the notebook runs need the test extra: pip install -e '.[test]'")
    pytest.importorskip("ipykernel", reason="the notebook runs need the test extra: pip install -e '.[test]'")
    missing = [m for m in NEEDS.get(name, ()) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{name} needs {', '.join(missing)}: pip install -e '.[torch]'")
    nb = jupytext.read(TUTORIALS / name)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code_cells) >= 3 and any(c.cell_type == "markdown" for c in nb.cells), \
        f"jupytext read {name} as {len(code_cells)} code cells: are its '# %%' markers intact?"
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(TUTORIALS)}})
    client.execute(env=tutorial_env(name, tmp_path))  # a cell that raises (a claim not shown) fails here
    outputs = [o for c in code_cells for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")
    check_claims(name, text)
    assert not [o for o in outputs if o["output_type"] == "execute_result"], \
        f"{name}: a cell ends in a bare value the notebook displays (a stray True?)"
    if HAS_MATPLOTLIB:
        shown = sum("image/png" in o.get("data", {}) for o in outputs if o["output_type"] == "display_data")
        assert shown == len(PLOTS.get(name, [])), \
            f"{name}: {shown} plots shown inline, expected {PLOTS.get(name)}"
        for png in PLOTS.get(name, []):
            assert (tmp_path / png).stat().st_size > 0, f"{name} did not save {png} from the notebook"
