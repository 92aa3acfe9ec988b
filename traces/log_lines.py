"""The complete lines of a log file (gzip when its name ends in .gz), even when it was cut off.

A writer killed mid-write leaves a file that ends inside a line, and a gzip file without its
end-of-stream marker (``gzip`` then raises EOFError and the lines already decompressed are
lost). ``LogLines`` decompresses with zlib itself, yields every line that ends in a newline, and
keeps what follows the last newline in ``tail`` for the reader to judge.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 18
GZIP = 16 + zlib.MAX_WBITS  # zlib's window bits for a gzip wrapper (header, CRC, size)


class LogLines:
    """Iterate the newline-terminated lines of ``path`` (without the newline).

    When the iteration ends, ``tail`` holds the bytes after the last newline (a cut-off line,
    or a last line written without one) and ``stream_cut`` says whether a gzip stream ended
    before its end-of-stream marker. A corrupt gzip stream raises ``zlib.error``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tail = b""
        self.stream_cut = False

    def __iter__(self) -> Iterator[bytes]:
        pending = b""
        chunks = self._gzip_chunks() if self.path.suffix == ".gz" else self._chunks()
        for chunk in chunks:
            lines = (pending + chunk if pending else chunk).split(b"\n")
            pending = lines.pop()
            yield from lines
        self.tail = pending

    def _chunks(self) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def _gzip_chunks(self) -> Iterator[bytes]:
        d = zlib.decompressobj(GZIP)
        fed = False  # bytes went into the current member
        with open(self.path, "rb") as f:
            while raw := f.read(CHUNK):
                while raw:
                    fed = True
                    out = d.decompress(raw)
                    if out:
                        yield out
                    raw = b""
                    if d.eof:  # a member ended; what follows is the next one (gzip allows several)
                        raw, d, fed = d.unused_data, zlib.decompressobj(GZIP), False
        out = d.flush()
        if out:
            yield out
        self.stream_cut = fed and not d.eof


def first_line(path: str | Path) -> bytes:
    """The first line of a file, newline-terminated or not (b"" for an empty file)."""
    lines = LogLines(path)
    for line in lines:
        return line
    return lines.tail
