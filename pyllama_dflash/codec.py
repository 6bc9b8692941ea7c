"""The one codec of the dataclasses that cross a process boundary: a job file, a child's report.

A parent writes a job (``SearchJob``, ``ScenarioJob``, ``AcceptanceJob``, ...) as JSON and the child
reads it back into the same dataclass. :func:`encode` walks the fields; :func:`decode` reads them
back by the fields' annotations (``Path``, ``X | None``, ``tuple[X, ...]``, nested dataclasses), so
adding a field is one line in the dataclass and nothing here. A class with a file format of its own
(``Schedule``: versioned, validated) keeps it: its ``to_json`` and ``from_json`` are used as they are.
A field the dataclass does not have is refused by name, so a job file from another version of the
package fails at once rather than running with a default in its place; a missing one takes its default.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def encode(value: Any) -> Any:
    """``value`` as JSON-able data: a dataclass as a dict of its fields, a Path as a string, a tuple
    as a list; a class's own ``to_json`` first."""
    if _own_format(type(value)):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


def decode(cls: type[T], data: dict[str, Any]) -> T:
    """The dataclass ``cls`` from what :func:`encode` made of one; ValueError naming an unknown field."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(cls)
    return cls(**{name: _value(hints[name], v) for name, v in data.items()})


def _own_format(tp: type) -> bool:
    """A class that keeps a file format of its own: both halves defined on the class itself."""
    return "to_json" in vars(tp) and "from_json" in vars(tp)


def _value(tp: Any, v: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:  # which member a value is cannot be read from JSON alone
            raise TypeError(f"the codec reads X | None, not {tp}: give the class a format of its own")
        return _value(inner[0], v)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], x) for x in v)
        return tuple(_value(a, x) for a, x in zip(args, v, strict=True)) if args else tuple(v)
    if origin is list:
        return [_value(args[0], x) for x in v] if args else list(v)
    if tp is Path:
        return Path(v)
    if isinstance(tp, type) and _own_format(tp):
        return tp.from_json(v)  # type: ignore[attr-defined]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return decode(tp, v)
    return v


class Coded:
    """A dataclass that crosses a process boundary: its JSON form is the codec's, both ways."""

    def to_json(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        return decode(cls, data)
