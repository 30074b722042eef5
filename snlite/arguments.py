"""What a user hands :class:`~snlite.train.Model`, checked where it comes in: a batch of the graph's
shape and of numbers, one integer label in [0, classes) per sample, parameters that are float32 and
finite. Each check returns the value converted (float32 samples, int32 labels) or raises a
ValueError that says what was wrong and what would fix it; nothing is cast silently.
"""
from __future__ import annotations

import numpy as np

from snlite import anomaly


def param_problem(graph, name: str, a: np.ndarray) -> str | None:
    """What is wrong with ``a`` (an array of numbers) as the parameter ``name`` of ``graph``, or None:
    it must be float32 (another dtype is refused, never cast: float64 may overflow or round, int32 or
    bool is likely the wrong array), finite, and a BatchNorm ``running_var`` >= 0 (a negative variance
    makes ``predict`` NaN). ``set_params`` and ``snlite train --load`` share it."""
    if a.dtype != np.float32:
        return (f"{name} has dtype {a.dtype}, but parameters are float32: convert it first, "
                f"value.astype(np.float32)")
    bad = anomaly.describe(a)
    if bad:
        return f"{name} is not finite: {bad}"
    layer, _, local = name.rpartition(".")
    kind = getattr(graph.layers.get(layer), "kind", None)
    if local == "running_var" and kind == "batchnorm" and (a < 0).any():
        i = np.unravel_index(int(np.argmax(a < 0)), a.shape)
        return (f"{name} is a BatchNorm variance, which cannot be negative: {int((a < 0).sum()):,d} of "
                f"{a.size:,d} values are (the first at {tuple(map(int, i))}: {a[i].item()!r})")
    return None


def numbers(x, who: str) -> np.ndarray:
    """``x`` as a float32 array; a ValueError if it is not an array of numbers."""
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"{who}: the input is not an array of numbers ({e})") from None
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{who}: the input must hold numbers, got dtype {a.dtype}")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: reported by the checks
        return np.ascontiguousarray(a, dtype=np.float32)


def samples(graph, x, who: str, empty_ok: bool = False) -> np.ndarray:
    """Samples of the graph's sample shape, as float32: at least one unless ``empty_ok``."""
    a = numbers(x, who)
    shape = graph.input_shape[1:]
    if a.shape[1:] != shape or a.ndim != len(graph.input_shape):
        raise ValueError(f"{who}: expected samples of shape (any, {', '.join(map(str, shape))}), got "
                         f"shape {a.shape}")
    if not len(a) and not empty_ok:
        raise ValueError(f"{who}: got no samples (shape {a.shape}); pass at least one sample of "
                         f"shape {shape}")
    return a


def padded(chunk, n, shape) -> np.ndarray:
    """``chunk`` (fewer than ``n`` samples at the end of a dataset) padded with zeros to a batch of ``n``."""
    batch = np.zeros((n,) + shape, np.float32)
    batch[:len(chunk)] = chunk
    return batch


def class_labels(labels, n: int, k: int, who: str) -> np.ndarray:
    """``n`` class indices in [0, k) as int32: integer-valued (2.0 is class 2; 2.7, NaN, True or a
    string is an error, never truncated), one per sample."""
    want = f"{who}: labels must be {n} integers in [0, {k}) (class indices, one per sample)"
    try:
        a = np.asarray(labels)
    except ValueError as e:
        raise ValueError(f"{want}; got something that is not an array ({e})") from None
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{want}; got dtype {a.dtype}")
    if isinstance(labels, (list, tuple)):  # NumPy makes [0, True] integers: True would train as class 1
        i = next((i for i, v in enumerate(labels) if isinstance(v, (bool, np.bool_))), None)
        if i is not None:
            raise ValueError(f"{want}; labels[{i}] is {labels[i]!r}")
    if a.shape != (n,):
        raise ValueError(f"{want}; got shape {a.shape}")
    bad = (a < 0) | (a >= k)
    if a.dtype.kind == "f":
        bad |= ~np.isfinite(a) | (a != np.round(a))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{want}; labels[{i}] is {a[i].item()!r}")
    return a.astype(np.int32)


def training_batch(graph, x, labels) -> tuple[np.ndarray, np.ndarray]:
    """(x as float32, labels as int32) if ``x`` is one batch of the graph's shape and ``labels`` one
    valid class index per sample; else a ValueError saying what is wrong."""
    x = numbers(x, "input batch")
    if x.ndim and not len(x):
        raise ValueError(f"input batch is empty (shape {x.shape}); a training step takes one batch of the "
                         f"graph's {graph.input_shape}")
    if x.shape != graph.input_shape:
        raise ValueError(f"input batch has shape {x.shape}, the graph expects {graph.input_shape}")
    return x, class_labels(labels, graph.input_shape[0], graph.num_classes, "training batch")
