"""Property: for any token sequence, split into add() calls anywhere, with any stop strings,
the concatenated stream == the final text == decode(all ids) truncated at the first stop."""

from __future__ import annotations

import functools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import smollm2_tokenizer
from tests.test_detokenizer import expected, stream

TEXT = st.lists(st.sampled_from(list("ab ,.\n") + list("你好世界日本") + ["😀", "🎉", "👨‍👩‍👧", "é"]),
               max_size=12).map("".join)


@functools.lru_cache(maxsize=1)
def partial_ids() -> list[int]:
    """Tokens that decode to an incomplete or invalid UTF-8 sequence on their own."""
    tok = smollm2_tokenizer.load()
    return [i for i in range(len(tok)) if tok.decode([i]).endswith("\ufffd")]


@st.composite
def cases(draw):
    tok = smollm2_tokenizer.load()
    ids: list[int] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["text", "random", "partial", "special"]))
        if kind == "text":
            ids += tok.encode(draw(TEXT))
        elif kind == "random":
            ids += draw(st.lists(st.integers(0, len(tok) - 1), max_size=4))
        elif kind == "partial":
            ids += draw(st.lists(st.sampled_from(partial_ids()), max_size=4))
        else:
            ids.append(tok.eos_token_id)
    positions = draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids)))
    splits = sorted(p for p in positions if p < len(ids))
    full = tok.decode(ids, skip_special_tokens=True)
    stops = []
    for _ in range(draw(st.integers(0, 3))):
        if full and draw(st.booleans()):  # a substring of the text: likely to match
            a = draw(st.integers(0, len(full) - 1))
            stops.append(full[a:a + draw(st.integers(1, 4))])
        else:
            stops.append(draw(st.text(alphabet="ab 你😀.", min_size=1, max_size=3)))
    return ids, splits, tuple(stops), draw(st.booleans()), draw(st.booleans())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_stream_equals_final_equals_truncated_decode(case):
    tok = smollm2_tokenizer.load()
    ids, splits, stops, include, keep_context = case
    deltas, d = stream(tok, ids, splits=splits, stop=stops, include_stop_str_in_output=include,
                       keep_context=keep_context)
    want, stopped = expected(tok, ids, stops, include)
    assert "".join(deltas) == d.text == want
    assert d.stopped == stopped
