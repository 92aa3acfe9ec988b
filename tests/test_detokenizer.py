"""runtime/serving/detokenizer.py with SmolLM2's real byte-level BPE tokenizer."""

from __future__ import annotations

import pytest

from runtime.serving.detokenizer import IncrementalDetokenizer, is_concatenative
from tests import smollm2_tokenizer

MIXED = "Hello 你好世界! Emoji: 😀🎉 family 👨‍👩‍👧 and café 日本語のテキスト."


@pytest.fixture(scope="module")
def tok():
    return smollm2_tokenizer.load()


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def expected(tok, ids, stop=(), include=False):
    """decode(all ids) truncated at the stop string that ends first (then starts first)."""
    full = decode(tok, ids)
    best = None
    for s in stop:
        i = full.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
            best = (i + len(s), i, s)
    if best is None:
        return full, False
    return (full[:best[0]] if include else full[:best[1]]), True


def stream(tok, ids, splits=None, finish=True, keep_context=False, **kw):
    """Feed ids in chunks (one token each by default); return (deltas, detokenizer).

    ``keep_context`` forces the window that keeps emitted tokens as context (the path of
    non-byte-level tokenizers) on this byte-level tokenizer, to test it too.
    """
    d = IncrementalDetokenizer(tok, [1, 2, 3], **kw)
    d._keep_context = d._keep_context or keep_context
    bounds = [0, *(splits if splits is not None else range(1, len(ids))), len(ids)]
    deltas = []
    for a, b in zip(bounds, bounds[1:]):
        delta = d.add(ids[a:b])
        deltas.append(delta.text)
        if delta.stopped:
            break
    else:
        if finish:
            deltas.append(d.finish().text)
    return deltas, d


def test_byte_level_tokenizer_is_detected(tok):
    assert is_concatenative(tok)


@pytest.mark.parametrize("keep_context", [False, True])
def test_cjk_and_emoji_stream_equals_decode(tok, keep_context):
    ids = tok.encode(MIXED)
    assert len(ids) > len(MIXED.split())  # characters span several tokens
    deltas, d = stream(tok, ids, keep_context=keep_context)
    assert "".join(deltas) == d.text == decode(tok, ids) == MIXED
    assert not any("\ufffd" in x for x in deltas)  # partial characters were held back


def test_partial_character_is_held_until_complete(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1 and decode(tok, ids[:1]).endswith("\ufffd")
    d = IncrementalDetokenizer(tok)
    assert d.add(ids[:1]).text == ""
    assert d.add(ids[1:]).text == "😀"


def test_finish_releases_an_incomplete_character_as_decode_does(tok):
    ids = tok.encode("ok 😀")[:-1]
    deltas, d = stream(tok, ids)
    assert d.text == decode(tok, ids) and d.text.endswith("\ufffd")
    assert not d.stopped and d.finished


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(tok, include):
    text = "The quick brown fox jumps over the lazy dog"
    ids = tok.encode(text)
    stop = ("fox jum",)
    deltas, d = stream(tok, ids, stop=stop, include_stop_str_in_output=include)
    want = "The quick brown fox jum" if include else "The quick brown "
    assert "".join(deltas) == d.text == want
    assert d.stopped and d.stop_str == "fox jum"
    assert d.add(tok.encode(" more")).text == ""  # nothing after a stop


def test_stop_prefix_is_held_then_released(tok):
    ids = tok.encode("Hello world peace")
    deltas, d = stream(tok, ids, stop=("world!",))
    # " world" could start "world!": it is not emitted with its own token, only once " peace" rules it out
    world = next(i for i, x in enumerate(deltas) if "world" in x)
    assert world == len(deltas) - 2 and deltas[world].endswith("world peace")
    assert d.text == "Hello world peace" and not d.stopped


def test_finish_releases_a_held_stop_prefix(tok):
    ids = tok.encode("say wor")
    deltas, d = stream(tok, ids, stop=("world",), finish=False)
    assert "".join(deltas) == "say "
    assert d.finish().text == "wor" and d.text == "say wor"


def test_first_ending_stop_wins(tok):
    ids = tok.encode("abcdef ghi")
    assert stream(tok, ids, stop=("cdef", "bcd"))[1].text == "a"  # "bcd" ends first
    assert stream(tok, ids, stop=("abcd", "bcd"))[1].text == ""  # same end: the earlier start
    _, d = stream(tok, ids, splits=[], stop=("cdef", "bcd"), include_stop_str_in_output=True)
    assert d.text == "abcd" and d.stop_str == "bcd"


def test_stop_at_start_and_end(tok):
    ids = tok.encode("STOP then text")
    assert stream(tok, ids, stop=("STOP",))[1].text == ""
    ids = tok.encode("text then END")
    deltas, d = stream(tok, ids, stop=("END",), include_stop_str_in_output=True)
    assert d.text == "text then END" and d.stopped


def test_special_tokens(tok):
    ids = tok.encode("Hi there") + [tok.eos_token_id] + tok.encode(" after")
    assert stream(tok, ids)[1].text == "Hi there after"
    _, d = stream(tok, ids, skip_special_tokens=False)
    assert d.text == "Hi there<|im_end|> after"
    _, d = stream(tok, ids, skip_special_tokens=False, stop=("<|im_end|>",))
    assert d.text == "Hi there" and d.stopped


@pytest.mark.parametrize("keep_context", [False, True])
def test_work_per_token_is_bounded(tok, keep_context):
    ids = tok.encode((MIXED + " ") * 20) + [tok.eos_token_id] * 50 + tok.encode(MIXED)
    d = IncrementalDetokenizer(tok, stop=("zzz",))
    d._keep_context = keep_context
    sizes = []
    inner = d._decode
    d._decode = lambda w: sizes.append(len(w)) or inner(w)
    for t in ids:
        d.add([t])
    d.finish()
    assert max(sizes) <= 6  # a small window, never the whole sequence
    assert d.text == decode(tok, ids)


def test_many_tokens_per_add(tok):
    ids = tok.encode(MIXED)
    for splits in ([], [3], [1, 2, 10, 11, 12], list(range(2, len(ids), 3))):
        deltas, d = stream(tok, ids, splits=splits)
        assert "".join(deltas) == MIXED
