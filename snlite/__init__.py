"""snlite: SuperNeurons' GPU memory management (liveness analysis, the unified tensor pool with
offload/prefetch and an LRU tensor cache, cost-aware recomputation, dynamic convolution workspace)
reimplemented in Python with Numba CUDA kernels, for teaching and measurement.

Importing snlite imports nothing heavy: numba is loaded when a device is first used.
"""
from snlite.device import (ALIGNMENT_BYTES, CudaDevice, Device, HostDevice, MetaArray, MetaDevice, align_up,
                           get_device, nbytes_of)

__version__ = "0.1.0"

__all__ = ["ALIGNMENT_BYTES", "CudaDevice", "Device", "HostDevice", "MetaArray", "MetaDevice", "align_up",
           "get_device", "nbytes_of", "__version__"]
