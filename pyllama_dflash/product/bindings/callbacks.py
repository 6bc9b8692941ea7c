"""The one decorator for every function C calls back into (cffi ``extern "Python"``).

An exception must never cross into C: cffi would print it and hand C a zero it did not choose.
:func:`native_callback` defines the extern, catches everything, gives the exception to
``on_error`` (which records it for the caller to re-raise once C has returned) and returns
``error_result`` to C instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def native_callback(
    ffi: Any, name: str, *, error_result: Any = None, on_error: Callable[..., None] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Define the extern "Python" function ``name`` of ffi as the decorated function.

    ``on_error(exc, *args)`` gets an exception the function raised (with the same arguments C
    passed); whatever it raises itself is dropped as well.
    """

    def define(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def guarded(*args: Any) -> Any:
            try:
                return fn(*args)
            except BaseException as exc:
                if on_error is not None:
                    try:
                        on_error(exc, *args)
                    except BaseException:
                        pass
                return error_result

        ffi.def_extern(name=name)(guarded)
        return guarded

    return define
