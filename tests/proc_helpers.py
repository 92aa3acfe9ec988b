"""Processes and /metrics as the server tests read them (nothing here imports the openai client, which
the GPU machine may lack)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from runtime.serving.process_name import ENGINE


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def named_children(pid: int, name: str) -> list[int]:
    """``pid``'s children that gave themselves ``name`` (runtime/serving/process_name.py)."""
    return [c for c in children(pid) if _read(f"/proc/{c}/comm").strip() == name]


def engine_child(pid: int, timeout: float = 60.0) -> int:
    """The spawned engine, once it has named itself (not multiprocessing's resource tracker, the
    other front ends or the intake workers, which name themselves too)."""
    deadline = time.monotonic() + timeout
    while not (engines := named_children(pid, ENGINE)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(engines) == 1, engines
    return engines[0]


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited (only its parent has not looked yet)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of /metrics."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict, name: str, **labels) -> float:
    matches = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def total(samples: dict, name: str, **labels) -> float:
    """The sum of a metric's samples with these labels (0 before the first one)."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))
