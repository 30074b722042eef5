"""Central-difference gradient checks for the NumPy backward references.

References are dtype-generic, so the checks run them in float64 where central differences are
accurate. A failure names the argument and the first index that disagrees.
"""
from __future__ import annotations

import numpy as np


def numeric_grad(loss, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d loss() / d x by central differences, perturbing ``x`` in place (restored afterwards)."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = loss()
        flat[i] = old - eps
        down = loss()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return grad


def assert_grad_close(name: str, analytic: np.ndarray, numeric: np.ndarray, rtol=1e-5, atol=1e-6):
    """Fail with a message naming ``name`` and the first index outside tolerance."""
    assert analytic.shape == numeric.shape, f"{name}: gradient shape {analytic.shape} != {numeric.shape}"
    bad = ~np.isclose(analytic, numeric, rtol=rtol, atol=atol)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"gradient of {name} wrong at index {idx}: backward gives {analytic[idx]:.8g}, central "
            f"difference {numeric[idx]:.8g} ({int(bad.sum())} of {bad.size} entries differ)")


def check_backward(name: str, forward, backward_grads: dict, inputs: dict, upstream: np.ndarray, eps=1e-6,
                   rtol=1e-5, atol=1e-6):
    """Check every analytic gradient in ``backward_grads`` against central differences.

    ``forward()`` returns the output (reading the arrays in ``inputs`` as they are now);
    the loss is ``sum(forward() * upstream)``; ``backward_grads[arg]`` is d loss / d inputs[arg].
    """
    def loss():
        return float(np.sum(forward() * upstream))

    for arg, analytic in backward_grads.items():
        assert_grad_close(f"{name} w.r.t. {arg}", analytic, numeric_grad(loss, inputs[arg], eps), rtol, atol)


def rand64(rng, *shape):
    return rng.standard_normal(shape)
