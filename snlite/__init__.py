"""snlite: SuperNeurons' GPU memory management (liveness analysis, the unified tensor pool with
offload/prefetch and an LRU tensor cache, cost-aware recomputation, dynamic convolution workspace)
reimplemented in Python with Numba CUDA kernels, for teaching and measurement.

    import snlite
    g = snlite.Graph(input_shape=(8, 1, 28, 28), num_classes=10)
    ...
    model = snlite.Model(g, device="auto")
"""
from snlite import models
from snlite.anomaly import NonFiniteError
from snlite.config import MemoryConfig
from snlite.device import (ALIGNMENT_BYTES, CudaDevice, Device, HostDevice, MetaArray, MetaDevice, align_up,
                           get_device, nbytes_of)
from snlite.graph import Graph, Node, Step, TensorSpec
from snlite.errors import BudgetError
from snlite.pipeline import place, simulate
from snlite.program import Program
from snlite.scheduler import Scheduler
from snlite.train import Model
from snlite.version import __version__

__all__ = ["ALIGNMENT_BYTES", "BudgetError", "CudaDevice", "Device", "Graph", "HostDevice", "MemoryConfig",
           "MetaArray", "MetaDevice", "Model", "Node", "NonFiniteError", "Program", "Scheduler", "Step",
           "TensorSpec", "align_up", "get_device", "models", "nbytes_of", "place", "simulate", "__version__"]
