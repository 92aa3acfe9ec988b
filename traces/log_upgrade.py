"""A log rewritten in today's schema (``minivllm log upgrade OLD NEW``).

The reader already converts an older log as it reads it (traces/events_v1.py); this writes the
converted events out, then reads the new file back and checks it holds the very events the old one
reads as, so a log is never replaced by a different one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from traces.log import LogError, LogWriter, read_log


@dataclass(frozen=True)
class Upgraded:
    from_version: int
    to_version: int
    events: int
    old_bytes: int
    new_bytes: int


def upgrade_log(src: str | Path, dst: str | Path, *, if_exists: str = "error") -> Upgraded:
    """Write ``src`` (any schema this minivllm reads) to ``dst`` in today's schema; check it."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ValueError(f"{dst}: the new log must be another file than the old one")
    reader = read_log(src)
    with LogWriter(dst, if_exists=if_exists) as out:
        for event in reader:
            out(event)
        count = out.count
    for i, (a, b) in enumerate(zip_longest(read_log(src), read_log(dst))):
        if a != b:
            raise LogError(f"{dst}: event {i + 1} reads back as {b!r}, not {a!r} (report this as a bug)")
    header = next(read_log(dst))
    return Upgraded(reader.file_schema_version, header.schema_version, count,  # type: ignore[union-attr]
                    src.stat().st_size, dst.stat().st_size)
