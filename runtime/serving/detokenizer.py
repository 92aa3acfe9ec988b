"""Incremental detokenizer with stop strings: what a stream emits is never taken back.

Usage (one per request)::

    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids, stop=params.stop,
                                   include_stop_str_in_output=params.include_stop_str_in_output)
    for new_ids in ...:                         # the token ids committed in each step
        delta = detok.add(new_ids)              # DetokenizerDelta(text, stopped)
        stream(delta.text)
        if delta.stopped:                       # a stop string matched: the request is done
            break
    else:
        stream(detok.finish().text)             # finished for another reason: flush what was held
    detok.text                                  # == the concatenated deltas

In the engine a request with stop strings hands its detokenizer to the core as a ``StopWatch``:
the commit adds each step's tokens and ends the request in the step a stop string completed in,
its tokens cut there (runtime/engine/request.py ``TextStop``); the output processor then takes
that step's text from the watch instead of decoding the tokens again.

Guarantees
* ``detok.text`` == concatenation of all delta texts == ``tokenizer.decode(output_ids,
  skip_special_tokens=..., clean_up_tokenization_spaces=False)`` truncated before the first stop
  string (after it with ``include_stop_str_in_output``), where "first" is the match that ENDS
  first in the text (then the longest), i.e. what a character-by-character check would find.
  This holds for tokenizers whose decode is prefix-stable at character boundaries, as
  byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen) is. The output is decoded on its own, without
  prompt context, so that it equals ``decode(output_ids)``; ``prompt_token_ids`` is accepted for
  API symmetry and not used.
* UTF-8 safe: a decode that ends in "\\ufffd" (a character whose bytes are split over tokens) is
  held back until the character completes; ``finish()`` releases it as it decodes.
* Stop strings are matched in the decoded text even when they span tokens. While a suffix of the
  text could be the start of a stop string it is held back, so nothing emitted is ever retracted.
  Text after a stop is dropped; further ``add`` calls return empty deltas.
* Bounded work per token: each token decodes a small window of pending tokens (an incomplete
  character is at most 4 byte tokens). Byte-level decoders restart the window empty after each
  emitted piece (~1.5 µs per token with SmolLM2's tokenizer; ~3 µs with stop strings); other
  decoders keep the last emitted token(s) as context and slice off their text, like vLLM's
  ``detokenize_incrementally``. Tokens that decode to nothing (skipped special tokens) are
  dropped from the window. Only a run of tokens that each end in invalid UTF-8 keeps the window
  growing, for as long as the run lasts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REPLACEMENT = "\ufffd"


def is_concatenative(tokenizer: Any) -> bool:
    """True when decode(a + b) == decode(a) + decode(b) at character boundaries: a fast
    tokenizer whose decoder is plain ByteLevel (GPT-2, SmolLM2, Llama 3, Qwen)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"


@dataclass(slots=True)  # not frozen: a frozen __init__ costs ~1 µs per token here
class DetokenizerDelta:
    text: str  # new text to stream (may be "")
    stopped: bool  # a stop string matched; the request should finish with reason "stop"


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int] | None = None,
        stop: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the fast path of tokenizer.decode without its Python wrapper
            self._decode = lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
        else:
            self._decode = lambda ids: tokenizer.decode(
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
        # byte-level BPE decodes by concatenation: a window can restart empty at every emitted
        # point; other decoders (SentencePiece) keep the last emitted token(s) as context
        self._keep_context = not is_concatenative(tokenizer)
        self.stop = tuple(stop)
        self._stop_prefixes = {s[:k] for s in self.stop for k in range(1, len(s))}  # proper ones
        self._max_prefix = max((len(s) - 1 for s in self.stop), default=0)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.token_ids: list[int] = []  # every output token added
        self.stopped = False
        self.stop_str: str | None = None  # the stop string that matched
        self.finished = False
        # decoding window: _window[:_read] is already decoded into _prefix_text (context only)
        self._window: list[int] = []
        self._read = 0
        self._prefix_text = ""
        # text: _chunks were emitted; _pending was decoded but held (it may start a stop string)
        self._chunks: list[str] = []
        self._pending = ""

    @property
    def text(self) -> str:
        """Everything emitted so far (the final text once stopped or finished)."""
        if len(self._chunks) > 1:
            self._chunks[:] = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def add(self, token_ids: Sequence[int]) -> DetokenizerDelta:
        """Add newly committed output tokens; returns the text that became final."""
        if self.stopped or self.finished:
            return DetokenizerDelta("", self.stopped)
        out = ""
        for t in token_ids:
            self.token_ids.append(t)
            new = self._decode_next(t)
            if new:
                out += self._release(new, final=False)
                if self.stopped:
                    break
        return DetokenizerDelta(out, self.stopped)

    def finish(self) -> DetokenizerDelta:
        """The request ended without a stop string: flush held text (partial characters decode
        to "\\ufffd", as tokenizer.decode would give them)."""
        if self.stopped or self.finished:
            return DetokenizerDelta("", self.stopped)
        tail = self._decode(self._window)[len(self._prefix_text):] if self._read < len(self._window) else ""
        text = self._release(tail, final=True)
        self.finished = True
        return DetokenizerDelta(text, self.stopped)

    # --- decoding --------------------------------------------------------------------------

    def _decode_next(self, token_id: int) -> str:
        """Append one token to the window; return the text it completes ("" while held)."""
        self._window.append(token_id)
        full = self._decode(self._window)
        if full.endswith(REPLACEMENT):
            return ""  # a character is still incomplete
        if len(full) <= len(self._prefix_text):
            if full == self._prefix_text and self._read == len(self._window) - 1:
                self._window.pop()  # decodes to nothing (a skipped special token): drop it
            return ""
        new = full[len(self._prefix_text):]
        if self._keep_context:
            # restart after the last emitted point, keeping the just-emitted tokens as context
            # (they fix the leading space of the next token on SentencePiece tokenizers)
            self._window = self._window[self._read:]
            self._read = len(self._window)
            self._prefix_text = self._decode(self._window)
        else:
            self._window, self._read, self._prefix_text = [], 0, ""
        return new

    # --- stop strings ------------------------------------------------------------------------

    def _release(self, new: str, final: bool) -> str:
        """Add decoded text; return the part that is now safe to emit."""
        if not self.stop:
            if new:
                self._chunks.append(new)
            return new
        buf = self._pending + new
        match = self._find_stop(buf, len(self._pending))
        if match is not None:
            start, s = match
            self.stopped, self.stop_str = True, s
            emit = buf[: start + len(s)] if self.include_stop_str_in_output else buf[:start]
            self._pending = ""
        else:
            keep = 0 if final else self._stop_prefix_len(buf)
            emit, self._pending = buf[: len(buf) - keep], buf[len(buf) - keep:]
        if emit:
            self._chunks.append(emit)
        return emit

    def _find_stop(self, buf: str, checked: int) -> tuple[int, str] | None:
        """The match that ends first (then starts first) among those ending past ``checked``:
        ``buf[:checked]`` was searched before and holds no whole stop string."""
        best: tuple[int, int, str] | None = None
        for s in self.stop:
            i = buf.find(s, max(0, checked - len(s) + 1))
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        return None if best is None else (best[1], best[2])

    def _stop_prefix_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop string."""
        for i in range(max(0, len(buf) - self._max_prefix), len(buf)):  # longest first
            if buf[i:] in self._stop_prefixes:
                return len(buf) - i
        return 0


def make_detokenizer(tokenizer: Any, prompt_token_ids: Sequence[int], params: Any) -> IncrementalDetokenizer:
    """The detokenizer of one request, with its ``SamplingParams``' stop strings."""
    return IncrementalDetokenizer(tokenizer, prompt_token_ids, stop=params.stop,
                                  include_stop_str_in_output=params.include_stop_str_in_output)


class StopWatch:
    """A request's detokenizer as the engine's commit uses it (``TextStop``): ``add`` decodes the
    step's tokens and says how many of them the text keeps when a stop string completed; ``take``
    hands that step's delta to the output processor."""

    __slots__ = ("detokenizer", "_delta")

    def __init__(self, detokenizer: IncrementalDetokenizer) -> None:
        self.detokenizer = detokenizer
        self._delta: DetokenizerDelta | None = None

    def add(self, token_ids: list[int]) -> int | None:
        before = len(self.detokenizer.token_ids)
        self._delta = delta = self.detokenizer.add(token_ids)
        return len(self.detokenizer.token_ids) - before if delta.stopped else None

    def take(self) -> DetokenizerDelta:
        """The delta of the tokens the last commit added (once)."""
        delta, self._delta = self._delta, None
        if delta is None:
            raise RuntimeError("no tokens were added to this request's text since its last delta")
        return delta


def step_text(detok: IncrementalDetokenizer, watch: StopWatch | None, new_token_ids: Sequence[int],
              finish_reason: str | None) -> str:
    """One step of a request's text: the watch's delta (the commit decoded it), or the detokenizer's
    of these tokens; a request that ends for another reason than a stop string also releases what
    the detokenizer held back."""
    delta = watch.take() if watch is not None else detok.add(new_token_ids)
    if finish_reason is not None and not delta.stopped:
        return delta.text + detok.finish().text
    return delta.text
