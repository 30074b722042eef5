"""snlite: SuperNeurons' GPU memory management (liveness analysis, the unified tensor pool with
offload/prefetch and an LRU tensor cache, cost-aware recomputation, dynamic convolution workspace)
reimplemented in Python with Numba CUDA kernels, for teaching and measurement.

    import snlite
    g = snlite.Graph(input_shape=(8, 1, 28, 28), num_classes=10)
    ...
    model = snlite.Model(g, device="auto")

The names below are imported on first use (PEP 562): ``python -m snlite.assignments grade`` imports
this package before it starts pytest, and a student's half-written module (a syntax error in
``snlite/liveness.py``, say) must reach grade's summary as a failing assignment, not stop the
command with a traceback; it also spares that command Numba's import. ``from snlite import Graph``
and ``snlite.Graph`` work as with plain imports (``_WHERE`` says which module holds each name), and
so does every module: ``snlite.search.min_budget`` in a fresh notebook, whatever ran before.
"""
import importlib.util as _util
import pkgutil as _pkgutil
from importlib import import_module as _import_module

from snlite.version import __version__

_WHERE = {  # name -> the module that defines it
    "NonFiniteError": "snlite.anomaly", "MemoryConfig": "snlite.config", "BudgetError": "snlite.errors",
    "HostBudgetError": "snlite.errors", "ProgramError": "snlite.validate", "RaceError": "snlite.checker",
    "SnapshotError": "snlite.memory_snapshot", "Trace": "snlite.trace",
    "Graph": "snlite.graph", "Node": "snlite.graph", "Step": "snlite.steps", "TensorSpec": "snlite.steps",
    "place": "snlite.pipeline", "simulate": "snlite.pipeline", "Program": "snlite.program",
    "Scheduler": "snlite.scheduler", "Model": "snlite.train",
    "from_torch": "snlite.torch_import", "TorchImportError": "snlite.torch_import",
    **dict.fromkeys(("ALIGNMENT_BYTES", "CudaDevice", "Device", "HostDevice", "MetaArray", "MetaDevice",
                     "align_up", "get_device", "nbytes_of"), "snlite.device"),
}

__all__ = ["ALIGNMENT_BYTES", "BudgetError", "CudaDevice", "Device", "Graph", "HostBudgetError", "HostDevice",
           "MemoryConfig", "MetaArray", "MetaDevice", "Model", "Node", "NonFiniteError", "Program",
           "ProgramError", "RaceError", "Scheduler", "SnapshotError", "Step", "TensorSpec",
           "TorchImportError", "Trace", "align_up", "from_torch", "get_device", "models", "nbytes_of",
           "place", "simulate", "__version__"]


def __getattr__(name):
    if name in _WHERE:
        value = getattr(_import_module(_WHERE[name]), name)
    elif not name.startswith("_") and _util.find_spec(f"snlite.{name}") is not None:
        value = _import_module(f"snlite.{name}")  # a module of the package: snlite.search, snlite.timing
    else:
        raise AttributeError(f"module 'snlite' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    """What tab completion offers: the names above and every module of the package (imported on first
    use), not the helpers this file imports."""
    modules = {m.name for m in _pkgutil.iter_modules(__path__) if not m.name.startswith("_")}
    return sorted({*__all__, *modules, *(n for n in globals() if n.startswith("__"))})
