"""The planner's many small objects, made cheaply: ``@record``, a frozen dataclass with slots whose
``__init__`` costs less, and :func:`without_cycle_collection` for the passes that make them.

The planner makes about a million small records for a deep network (route steps, ops, instructions,
trace rows). A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__``
(the only way past its own ``__setattr__``, which refuses), and that call is most of the record's
cost. :func:`record` keeps the dataclass exactly as it is (fields, defaults, equality, ``repr``,
``dataclasses.replace``, :class:`~dataclasses.FrozenInstanceError` on assignment) and only gives it
an ``__init__`` that stores each field through its slot's own setter, which is about three times
faster::

    @record
    class Free:
        tensor: str
        stream: str = "compute"
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc


def record(cls):
    """``dataclass(frozen=True, slots=True)(cls)``, its ``__init__`` storing each field straight into
    its slot (a micro-optimisation: object.__setattr__ per field is most of a frozen record's cost)."""
    cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or any(f.default_factory is not dataclasses.MISSING for f in fields):
        raise TypeError(f"@record {cls.__name__}: no __post_init__ or default_factory (use @dataclass)")
    names = [f.name for f in fields]
    params = ", ".join(n if f.default is dataclasses.MISSING else f"{n}=_default_{n}"
                       for n, f in zip(names, fields))
    body = "".join(f"    _set_{n}(self, {n})\n" for n in names) or "    pass\n"
    scope = {f"_set_{n}": cls.__dict__[n].__set__ for n in names}  # each slot's own setter
    scope |= {f"_default_{f.name}": f.default for f in fields if f.default is not dataclasses.MISSING}
    exec(f"def __init__(self, {params}):\n{body}", scope)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls


@contextlib.contextmanager
def without_cycle_collection():
    """Python's cycle collector off for a pass that makes hundreds of thousands of small objects and
    no reference cycles: it would rescan them again and again (a fifth of the time on deep nets).
    Reference counting still frees everything; the collector's previous state comes back after.
    As the collector comes back on, every object it tracks (what the pass made and still holds, say a
    program of 300,000 instructions) goes to its oldest generation unscanned (``gc.freeze`` then
    ``gc.unfreeze``), unless the program froze objects of its own: the passes leave no reference cycle
    (tests/test_records.py), so there is nothing among them for a collection to free."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if gc.get_freeze_count() == 0:  # a micro-optimisation: the youngest generation's next
                gc.freeze()  # collection would scan all the pass made, a tenth of a search's time,
                gc.unfreeze()  # to free nothing
            gc.enable()
