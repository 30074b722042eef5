"""Test set-up: the CUDA simulator is on unless a real-GPU run is asked for.

This runs before numba is imported anywhere, which is what NUMBA_ENABLE_CUDASIM needs.
A real-GPU run: ``NUMBA_ENABLE_CUDASIM=0 pytest`` on a machine with an NVIDIA GPU; only then do
the ``gpu``-marked tests run (elsewhere they are skipped, with the reason shown by ``-ra``).
"""
import os

REAL_GPU_REQUESTED = os.environ.get("NUMBA_ENABLE_CUDASIM") == "0"
if not REAL_GPU_REQUESTED:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402


def _cuda_mode() -> tuple[str, bool]:
    from numba import cuda

    if not REAL_GPU_REQUESTED:
        return "CUDA simulator (NUMBA_ENABLE_CUDASIM=1): kernels run as Python, streams are synchronous", False
    if cuda.is_available():
        dev = cuda.get_current_device()
        return f"real GPU: {dev.name.decode() if isinstance(dev.name, bytes) else dev.name}", True
    return "NUMBA_ENABLE_CUDASIM=0 but no CUDA GPU found: CUDA tests will fail", False


def pytest_report_header(config):
    return f"snlite kernels run on: {_cuda_mode()[0]}"


def pytest_collection_modifyitems(config, items):
    if _cuda_mode()[1]:
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU: run NUMBA_ENABLE_CUDASIM=0 pytest -m gpu on one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)
