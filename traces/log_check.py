"""Find a non-finite float in an event before the writer writes it.

JSON has no NaN or infinity: msgspec writes them as ``null``, which the reader rejects (a float
field) or reads back as ``None`` (an ``Any`` field), so one such number makes a log unreadable.
``non_finite(event)`` is the cheap check the writer runs on every event: a finder per event type,
compiled once from msgspec's type info, that looks only at the fields that can hold a float
(two for a ``Step``), so a new float field anywhere is checked without a change here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

# a finder returns None when every float in the value is finite, else the path to the first bad
# one from the value (".field", "[index]", ... or "" for the value itself)
Finder = Callable[[Any], "str | None"]

_finders: dict[type, Finder | None] = {}


def non_finite(value: msgspec.Struct) -> str | None:
    """Dotted path of the first float in ``value`` that JSON can't hold (``""``: ``value`` itself)."""
    cls = type(value)
    try:
        finder = _finders[cls]
    except KeyError:
        finder = _finders[cls] = _compile(mi.type_info(cls))
    path = None if finder is None else finder(value)
    return None if path is None else path.removeprefix(".")


def _bad_number(v: Any) -> bool:
    """A float field's value that JSON can't hold as a number (ints are fine; a bool is not)."""
    if v.__class__ is float:
        return not math.isfinite(v)
    return v.__class__ is not int


def _compile(t: mi.Type) -> Finder | None:
    """A finder for values of msgspec type ``t``; None when ``t`` can't hold a float."""
    if isinstance(t, mi.FloatType):
        return lambda v: "" if _bad_number(v) else None
    if isinstance(t, mi.AnyType):
        return _walk
    if isinstance(t, mi.StructType):
        return _struct(t)
    if isinstance(t, mi.UnionType):
        return _union(t)
    if isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        item = _compile(t.item_type)
        return None if item is None else lambda v: _first(enumerate(v), item, "[{}]")
    if isinstance(t, mi.TupleType):
        items = [_compile(x) for x in t.item_types]
        if not any(items):
            return None
        return lambda v: next((f"[{i}]{r}" for i, (f, x) in enumerate(zip(items, v))
                               if f is not None and (r := f(x)) is not None), None)
    if isinstance(t, mi.DictType):
        value = _compile(t.value_type)
        return None if value is None else lambda v: _first(v.items(), value, ".{}")
    return None  # ints, strings, bools, None, ...: no float inside


def _struct(t: mi.StructType) -> Finder | None:
    floats = tuple(f.name for f in t.fields if isinstance(f.type, mi.FloatType))  # the common case, inlined
    others = [(f.name, finder) for f in t.fields
              if not isinstance(f.type, mi.FloatType) and (finder := _compile(f.type)) is not None]
    if not floats and not others:
        return None

    def find(v: Any) -> str | None:
        for name in floats:
            x = getattr(v, name)
            if x.__class__ is float:
                if x - x == 0.0:  # false for NaN and ±inf
                    continue
            elif x.__class__ is int:
                continue
            return f".{name}"
        for name, finder in others:
            r = finder(getattr(v, name))
            if r is not None:
                return f".{name}{r}"
        return None

    return find


def _union(t: mi.UnionType) -> Finder | None:
    by_class: dict[type, Finder] = {}
    number = other = None
    for member in t.types:
        if isinstance(member, mi.StructType):
            finder = _compile(member)
            if finder is not None:
                by_class[member.cls] = finder
        elif isinstance(member, mi.FloatType):
            number = _compile(member)
        elif not isinstance(member, mi.NoneType):
            other = _compile(member) or other
    if not by_class and number is None and other is None:
        return None

    def find(v: Any) -> str | None:
        if v is None:
            return None
        finder = by_class.get(v.__class__)
        if finder is not None:
            return finder(v)
        if number is not None and v.__class__ is float:
            return number(v)
        return other(v) if other is not None else None

    return find


def _first(pairs, finder: Finder, fmt: str) -> str | None:
    for key, x in pairs:
        r = finder(x)
        if r is not None:
            return fmt.format(key) + r
    return None


def _walk(v: Any) -> str | None:
    """An ``Any`` value: JSON-like data of any depth (only a Header's config and extra hold one)."""
    if v.__class__ is float:
        return None if math.isfinite(v) else ""
    if isinstance(v, dict):
        return _first(v.items(), _walk, ".{}")
    if isinstance(v, list | tuple | set | frozenset):
        return _first(enumerate(v), _walk, "[{}]")
    if isinstance(v, msgspec.Struct):
        return _first(msgspec.structs.asdict(v).items(), _walk, ".{}")
    return None
