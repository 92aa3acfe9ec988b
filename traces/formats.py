"""Workload formats by name: how to recognise a file and how to read it into a ``Workload``.

    FORMATS["azure"].read(path, seed=0, skip_bad_rows=False) -> Workload

``detect_format`` asks each format in registration order whether a file's first line is its own;
``load_workload`` reads a file in its format, then slices and scales it. A new trace format is one
module in ``traces/importers/`` (``detect`` + a reader) and one ``register`` call below.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from traces.importers import azure, log, mooncake
from traces.log_lines import first_line
from traces.workload import Workload, WorkloadError


@dataclass(frozen=True, slots=True)
class WorkloadFormat:
    name: str
    description: str
    detect: Callable[[Path, str], bool]  # (path, first line) -> is it this format
    read: Callable[..., Workload]  # (path, *, seed, skip_bad_rows) -> Workload


FORMATS: dict[str, WorkloadFormat] = {}


def register(fmt: WorkloadFormat) -> None:
    if fmt.name in FORMATS or fmt.name == "auto":
        raise ValueError(f"workload format {fmt.name!r} is already registered")
    FORMATS[fmt.name] = fmt


register(WorkloadFormat("log", "a minivllm event log or saved workload (JSONL, .gz ok)", log.detect,
                        lambda path, *, seed=0, skip_bad_rows=False: log.read_log_workload(path)))
register(WorkloadFormat("azure", "Azure LLM inference trace 2023 (CSV)", azure.detect, azure.read_azure_csv))
register(WorkloadFormat("mooncake", "Mooncake trace (JSONL with hash_ids)", mooncake.detect,
                        mooncake.read_mooncake_jsonl))


def _first_line(path: Path) -> str:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except EOFError:  # a gzip file cut off inside its first line (a killed writer): what there is
        return first_line(path).decode("utf-8", errors="replace").strip()


def detect_format(path: str | Path) -> str:
    """The name of the registered format ``path`` is in; a WorkloadError naming the file if none."""
    path = Path(path)
    first = _first_line(path)
    if not first:
        raise WorkloadError(f"{path}:1: empty file")
    for fmt in FORMATS.values():
        if fmt.detect(path, first):
            return fmt.name
    raise WorkloadError(f"{path}:1: not a known workload format: expected "
                        + "; ".join(f"{f.name} ({f.description})" for f in FORMATS.values()))


def load_workload(
    path: str | Path,
    *,
    fmt: str = "auto",
    limit: int | None = None,
    time_window: tuple[float, float] | None = None,
    rate_scale: float = 1.0,
    input_scale: float = 1.0,
    output_scale: float = 1.0,
    skip_bad_rows: bool = False,
    seed: int = 0,
) -> Workload:
    """Read a workload in any registered format; then slice and scale it.

    Order of the options: time window (on the file's own clock), then first ``limit`` requests,
    then rate and length scaling.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such workload file")
    name = detect_format(path) if fmt == "auto" else fmt
    if name not in FORMATS:
        raise WorkloadError(f"{path}: unknown workload format {name!r} (auto, {', '.join(FORMATS)})")
    wl = FORMATS[name].read(path, seed=seed, skip_bad_rows=skip_bad_rows)
    if time_window is not None:
        wl = wl.window(*time_window)
    if limit is not None:
        wl = wl.head(limit)
    if rate_scale != 1.0:
        wl = wl.scale_rate(rate_scale)
    if input_scale != 1.0 or output_scale != 1.0:
        wl = wl.scale_lengths(input_scale, output_scale)
    return wl
