"""A log's prompts rewritten as a trace of real traffic keeps them (``minivllm log redact``).

A served log records each prompt's token ids unless the server ran with ``--trace-prompts
hashes|none``; redacting rewrites an ids log as if it had: ``hashes`` keeps each prompt's length
and one id per full KV block (equal leading ids ↔ equal prefixes, so a re-simulation still sees the
prefix-cache hits), ``none`` its length alone. Everything else is kept as it is, and the new file is
read back and checked event for event before the command succeeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import msgspec

from traces.events import TRACE_PROMPTS_KEY, Arrived, Header, Rejected, recorded_prompts
from traces.log import LogError, LogWriter, read_log
from traces.prompt import Prompt, PromptIds

# (request_id, prompt, params, cache_salt) -> what the log keeps of the prompt
Recorder = Callable[[int, Prompt, object, "str | None"], Prompt]


@dataclass(frozen=True)
class Redacted:
    mode: str
    events: int
    prompts: int  # Arrived prompts rewritten
    old_bytes: int
    new_bytes: int


def redact_log(src: str | Path, dst: str | Path, mode: str, recorder_for: Callable[[Header], Recorder], *,
               if_exists: str = "error") -> Redacted:
    """Write ``src`` to ``dst`` with its prompts as ``mode`` keeps them; ``recorder_for(header)`` gives
    the engine's rule for one prompt (the block hashes depend on the engine's model and cache)."""
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise ValueError(f"{dst}: the redacted log must be another file than the original")
    events = read_log(src)
    header = next(events)
    if not isinstance(header, Header):
        raise LogError(f"{src}: the first event is not a Header")
    held = recorded_prompts(header)
    if held != "ids":
        raise ValueError(f"{src}: its prompts are {held} already; only a log of token ids can be redacted")
    record = recorder_for(header)
    prompts = 0

    def rewrite(event):
        nonlocal prompts
        if isinstance(event, Arrived) and isinstance(event.prompt, PromptIds):
            prompts += 1
            return msgspec.structs.replace(
                event, prompt=record(event.request_id, event.prompt, event.params, event.cache_salt))
        if isinstance(event, Rejected) and isinstance(event.prompt, PromptIds):
            return msgspec.structs.replace(event, prompt=None)  # as a redacting engine logs a refusal
        return event

    new_header = msgspec.structs.replace(header, extra={**header.extra, TRACE_PROMPTS_KEY: mode})
    with LogWriter(dst, if_exists=if_exists) as out:
        out(new_header)
        for event in events:
            out(rewrite(event))
        count = out.count
    originals = read_log(src)
    next(originals)
    written = read_log(dst)
    if next(written) != new_header:
        raise LogError(f"{dst}: its header reads back otherwise (report this as a bug)")
    prompts_seen = prompts
    prompts = 0
    for i, (a, b) in enumerate(zip_longest(originals, written)):
        if a is None or b is None or rewrite(a) != b:
            raise LogError(f"{dst}: event {i + 2} reads back as {b!r} (report this as a bug)")
    return Redacted(mode, count, prompts_seen, src.stat().st_size, dst.stat().st_size)
