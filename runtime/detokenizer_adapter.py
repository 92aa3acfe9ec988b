"""``make_detokenizer(tokenizer, prompt_ids, params)``: the per-request text stream of LLM.generate.

Uses runtime/detokenizer.py when it is present; until then a plain fallback that re-decodes the
whole output each step (fine offline), holds back an incomplete UTF-8 tail and finds stop
strings in the text. Both answer ``add(ids) -> TextDelta(text, stopped)`` and ``flush()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from runtime.request import SamplingParams


class TextDelta(NamedTuple):
    text: str
    stopped: bool


class _NoText:
    """Models without a tokenizer: token ids only."""

    def add(self, ids: list[int]) -> TextDelta:
        return TextDelta("", False)

    def flush(self) -> TextDelta:
        return TextDelta("", False)


class _PlainDetokenizer:
    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.stop = params.stop
        self.keep_stop = params.include_stop_str_in_output
        self.ids: list[int] = []
        self.sent = 0  # characters already emitted
        self.stopped = False

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def add(self, ids: list[int]) -> TextDelta:
        if self.stopped:
            return TextDelta("", True)
        self.ids.extend(ids)
        text = self._text()
        for s in self.stop:
            at = text.find(s, max(0, self.sent - len(s) + 1))
            if at >= 0:
                end = at + len(s) if self.keep_stop else at
                self.stopped = True
                out, self.sent = text[self.sent:end], end
                return TextDelta(out, True)
        hold = max((len(s) - 1 for s in self.stop), default=0)  # a stop string may still complete
        safe = len(text.rstrip("\ufffd")) - hold
        if safe <= self.sent:
            return TextDelta("", False)
        out, self.sent = text[self.sent:safe], safe
        return TextDelta(out, False)

    def flush(self) -> TextDelta:
        if self.stopped:
            return TextDelta("", True)
        text = self._text()
        out, self.sent = text[self.sent:], len(text)
        return TextDelta(out, False)


def make_detokenizer(tokenizer: Any | None, prompt_ids: list[int], params: SamplingParams) -> Any:
    if tokenizer is None:
        return _NoText()
    return _PlainDetokenizer(tokenizer, params)
