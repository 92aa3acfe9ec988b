"""What a log writer does when its file already exists: rotate it, refuse, or overwrite it.

Rotation keeps the name's format suffix, so readers and format detection still recognise the
file: ``live.jsonl`` → ``live.1.jsonl``, ``live.jsonl.gz`` → ``live.1.jsonl.gz``. The number is
one past the highest rotation there, so the numbers keep the order the logs were written in, and
the move is a hard link (which fails rather than replace a file) so an older rotation is never
overwritten, even by a second writer starting at the same moment.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

IF_EXISTS = ("rotate", "error", "overwrite")


def split_name(path: Path) -> tuple[str, str]:
    """(stem, format suffix): ``live.jsonl.gz`` → ("live", ".jsonl.gz"), ``run.v2.jsonl`` → ("run.v2", ".jsonl")."""
    keep = 2 if path.suffix == ".gz" else 1
    suffix = "".join(path.suffixes[-keep:])
    if suffix and len(suffix) < len(path.name):
        return path.name[: -len(suffix)], suffix
    return path.name, ""


def beside(path: str | Path, tag: str) -> Path:
    """A log named after ``path``, ``tag`` before its format suffix: (``run.jsonl.gz``, "replica0") →
    ``run.replica0.jsonl.gz``."""
    path = Path(path)
    stem, suffix = split_name(path)
    return path.with_name(f"{stem}.{tag}{suffix}")


def rotation_path(path: Path, n: int) -> Path:
    return beside(path, str(n))


def next_rotation(path: Path) -> int:
    """One past the highest rotation number of ``path`` in its folder (1 when there is none)."""
    stem, suffix = split_name(path)
    pattern = re.compile(re.escape(stem) + r"\.(\d+)" + re.escape(suffix))
    numbers = [int(m.group(1)) for p in path.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    return max(numbers, default=0) + 1


def rotate(path: Path) -> Path:
    """Move the file at ``path`` to its next rotation name; return that name."""
    n = next_rotation(path)
    while True:
        target = rotation_path(path, n)
        try:
            os.link(path, target)  # raises FileExistsError rather than replace a file
        except FileExistsError:
            n += 1
            continue
        except OSError:  # a filesystem without hard links: check, then rename
            if target.exists():
                n += 1
                continue
            os.rename(path, target)
            return target
        os.unlink(path)
        return target


def open_mode(path: Path, if_exists: str) -> tuple[str, Path | None]:
    """Make room for a new log at ``path``: the mode to open it in ("w" or "x") and where an
    existing log was rotated to. Only a regular file counts as a log (``/dev/null`` is written)."""
    if if_exists not in IF_EXISTS:
        raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS)}; got {if_exists!r}")
    if if_exists == "overwrite" or (path.exists() and not path.is_file()):
        return "w", None
    if if_exists == "rotate" and path.is_file():
        return "x", rotate(path)
    return "x", None  # "x" fails if a log appeared meanwhile: the caller decides again
