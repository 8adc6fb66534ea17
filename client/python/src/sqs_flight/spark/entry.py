"""What Spark calls, with short tracebacks.

Spark shows a Python error as ``Failed to create Python data source
instance: Traceback ...`` followed by the frames and, last, the message: an
error of ours names the fix in that message, so the frames that lead to it
only push it down the screen. :class:`SparkEntryPoints` raises an
:class:`SqsFlightError` from every method Spark calls without them. Which
methods those are is read from the PySpark base classes, so a new entry
point is covered as soon as it is defined.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Set

from ..client import SqsFlightError


class SparkEntryPoints:
    """A base, beside PySpark's own, whose subclasses' overrides of a public
    method of a PySpark base class raise :class:`SqsFlightError` with no
    traceback of ours."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        called = _spark_methods(cls)
        for name, value in list(vars(cls).items()):
            if name in called and inspect.isfunction(value):
                setattr(cls, name, _short_traceback(value))


def _spark_methods(cls: type) -> Set[str]:
    """The public methods the PySpark classes among ``cls``'s bases define."""
    return {
        name
        for base in cls.__mro__
        if base.__module__.startswith("pyspark.")
        for name in vars(base)
        if not name.startswith("_")
    }


def _short_traceback(method: Any) -> Any:
    """``method``, raising an :class:`SqsFlightError` with no traceback of ours."""

    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                yield from method(*args, **kwargs)
            except SqsFlightError as error:
                raise error.with_traceback(None) from None

        return generator

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except SqsFlightError as error:
            raise error.with_traceback(None) from None

    return call
