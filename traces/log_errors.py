"""The error a malformed log raises (its reader, ``fold`` and the Step codec share it)."""

from __future__ import annotations


class LogError(ValueError):
    """A log file is malformed; the message names the file and line."""
