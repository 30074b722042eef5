"""The checks of what a user passes the graph builder, :class:`~snlite.train.Model`'s ``step`` and the
CLI's hyper-parameters, in PyTorch's types: an integer is an int (or a NumPy integer), never a bool or
a float such as 4.0; a pair is one integer or two; a number is finite, in its range, and, where it is
used in float32, still in that range there. Each returns the value checked or raises a ValueError that
names ``what`` was wrong and what is allowed. And :func:`known_fields`: a misspelled keyword of a
dataclass, named with the field it is closest to.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import sys

import numpy as np


def who(kind, name) -> str:
    """How an error names a layer being added: its kind, and its name where the user gave one."""
    return kind if name is None else f"{kind} {name!r}"


def is_int(v) -> bool:
    """An int or a NumPy integer, and not a bool (which Python counts as an int)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def boolean(v, what) -> bool:
    """``v`` if it is True or False (a NumPy bool too), else a ValueError naming ``what``: "no" and 0
    are not False here (a truthy string switched the anomaly checks on)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    raise ValueError(f"{what} must be True or False, got {v!r}")


def integer(v, what, minimum=1) -> int:
    """``v`` as an int >= ``minimum``; a float (4.5, or even 4.0), a bool or a string is an error,
    as in PyTorch, rather than something to truncate."""
    if not is_int(v) or v < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def int_pair(v, what, minimum=1) -> tuple[int, int]:
    """An int, or a pair of ints, each >= ``minimum``, as ``(h, w)``."""
    if is_int(v) and v >= minimum:  # one number, checked once
        return int(v), int(v)
    pair = tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(pair) != 2 or not all(is_int(p) and p >= minimum for p in pair):
        raise ValueError(f"{what} must be an integer >= {minimum} or a pair of them, got {v!r}")
    return int(pair[0]), int(pair[1])


def check_number(v, what, low=None, high=None, open_low=False, open_high=False, float32=False) -> float:
    """``v`` as a float if it is a finite real number (not a bool, not a string) in the given range,
    else a ValueError naming ``what``; the builder and :meth:`snlite.train.Model.step` use it.
    ``float32``: the number is used in float32 (SGD's hyper-parameters), so it must also be in the
    range there: 1e39 is inf in float32, 1e-50 is 0 and 0.99999999 is 1; and a number that is not 0
    must not become 0 there (``momentum=1e-50`` would turn momentum off without a word). The float
    returned is ``v`` itself either way (the device rounds it as before)."""
    def fits(x) -> bool:
        return math.isfinite(x) and (low is None or x > low or (x == low and not open_low)) \
            and (high is None or x < high or (x == high and not open_high))

    ok = (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
          and fits(v))
    if ok and not float32:
        return float(v)
    if low is not None and high is not None:
        rng = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    elif low is not None:
        rng = f"a finite number {'>' if open_low else '>='} {low:g}"
    else:
        rng = "a finite number"
    if not ok:
        raise ValueError(f"{what} must be {rng}, got {v!r}")
    with np.errstate(over="ignore", under="ignore"):
        v32 = float(np.float32(v))
    if not fits(v32) or (v32 == 0 and v != 0):
        raise ValueError(f"{what} must be {rng} in float32, the precision training runs in; got {v!r}, which "
                         f"float32 rounds to {v32!r}: use a number float32 holds in that range"
                         + (" (0 only if it is 0)" if v32 == 0 else ""))
    return float(v)


def pool_args(kind, name, kernel, stride, padding, ceil_mode) -> dict:
    what = who(kind, name)
    kernel = int_pair(kernel, f"{what}: kernel")
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise ValueError(f"{what}: ceil_mode must be True or False, got {ceil_mode!r}")
    # floor mode is left out of the attributes: a floor-mode layer stays as it always was
    return dict(kernel=kernel, stride=kernel if stride is None else int_pair(stride, f"{what}: stride"),
                padding=int_pair(padding, f"{what}: padding", 0),
                **({"ceil_mode": True} if ceil_mode else {}))


class UnknownField(TypeError, ValueError):
    """A keyword naming no field of a dataclass: a TypeError, as Python's own for an unexpected keyword,
    and a ValueError, as any other wrong value passed to it."""


def known_fields(cls):
    """A dataclass decorator (above ``@dataclass``): the generated ``__init__``, after a check that names
    a misspelled keyword with the field it is closest to and lists the fields (:class:`UnknownField`;
    Python's own error says only "unexpected keyword argument"). ``dataclasses.replace`` and every
    classmethod that builds one go through ``__init__``, so they are checked too."""
    init, fields = cls.__init__, tuple(f.name for f in dataclasses.fields(cls))

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        unknown = sorted(set(kwargs) - set(fields))
        if unknown:
            close = {u: difflib.get_close_matches(u, fields, n=1) for u in unknown}
            hints = "".join(f"; {u!r}: did you mean {c[0]!r}?" for u, c in close.items() if c)
            raise UnknownField(f"unknown {cls.__name__} field(s) {unknown}{hints}; fields: {list(fields)}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def users_level() -> int:
    """The ``stacklevel`` that makes a warning (warned by this function's caller) name the first line
    outside snlite: the user's ``simulate(...)`` or ``from_torch(...)``, not snlite's own call."""
    frame, level = sys._getframe(2), 2  # the caller of the function that warns
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("snlite."):
        frame, level = frame.f_back, level + 1
    return level
