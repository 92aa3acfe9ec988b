"""The log writer writes exactly what its reader reads back unchanged, for every event type.

Events are drawn with their declared field types and any values: NaN and ±infinity in every
float, ints past 64 bits, strings with lone surrogates, JSON values of any shape in a Header's
config and extra, prompts of both kinds, every block event. The oracle is msgspec itself: encode,
decode as the reader does, compare as JSON values. Whatever that round trip keeps, the writer
must accept and ``read_log`` must return equal; whatever it loses or rejects, the writer must
refuse with LogWriteError and write nothing.
"""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_case
from hypothesis import strategies as st

from traces.events import (
    SCHEMA_VERSION,
    Aborted,
    Admitted,
    Arrived,
    BlockAllocated,
    BlockCached,
    BlockFreed,
    Event,
    Finished,
    Header,
    Preempted,
    PrefixHit,
    Rejected,
    ReplicaDown,
    ReplicaUp,
    Reserved,
    Routed,
    Span,
    Step,
)
from traces.log import LogWriteError, LogWriter, read_log
from traces.params import InvalidRequest, SamplingParams
from traces.prompt import PromptIds, PromptSynthetic

NON_FINITE = (math.nan, math.inf, -math.inf)
ints = st.integers(-(2**70), 2**70)  # past int64 and uint64: msgspec writes and reads any int
floats = st.floats(allow_nan=False, allow_infinity=False) | st.floats() | st.sampled_from(NON_FINITE)
strs = st.text(max_size=6) | st.text(st.characters(exclude_categories=()), max_size=3)  # lone surrogates too
json_values = st.recursive(
    st.none() | st.booleans() | ints | floats | strs,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strs, inner, max_size=3),
    max_leaves=8,
)
json_objects = st.dictionaries(strs, json_values, max_size=4)

prompts = st.builds(PromptIds, st.lists(ints, max_size=5)) | st.builds(
    PromptSynthetic, num_tokens=st.integers(1, 2**40), seed=ints, unique_seed=ints,
    segment_ids=st.lists(ints, max_size=4), segment_len=st.integers(1, 2**20), vocab_size=st.integers(2, 2**20))


@st.composite
def params(draw) -> SamplingParams:
    """Valid sampling params; sometimes one float forced non-finite past the constructor's check."""
    kw = draw(st.fixed_dictionaries({}, optional={
        "max_tokens": st.integers(1, 10**6), "temperature": st.floats(0, 5), "top_p": st.floats(0.01, 1),
        "top_k": st.integers(0, 100), "min_p": st.floats(0, 1), "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2), "repetition_penalty": st.floats(0.01, 5), "seed": st.none() | ints,
        "stop": st.lists(strs, max_size=2).map(tuple), "stop_token_ids": st.lists(st.integers(0, 2**40), max_size=2)
        .map(tuple), "ignore_eos": st.booleans(), "logprobs": st.none() | st.integers(0, 20),
        "include_stop_str_in_output": st.booleans(), "n": st.integers(1, 4)}))
    try:
        p = SamplingParams(**kw)
    except InvalidRequest:  # e.g. an empty or lone-surrogate stop string
        p = SamplingParams()
    if draw(st.integers(0, 4)) == 0:  # params built before the check, or patched: the writer still refuses
        name = draw(st.sampled_from(["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                     "repetition_penalty"]))
        msgspec.structs.force_setattr(p, name, draw(st.sampled_from(NON_FINITE)))
    return p


runs = st.lists(ints, max_size=6)
block_events = st.one_of(
    st.builds(BlockAllocated, ints, runs), st.builds(BlockFreed, ints), st.builds(BlockCached, ints, runs),
    st.builds(PrefixHit, ints, runs), st.builds(Reserved, ints, ints))

EVENTS = {
    "Header": st.builds(
        Header, schema_version=st.just(SCHEMA_VERSION) | ints, clock=strs, config=json_objects, model_identity=strs,
        block_size=ints, num_blocks=ints, seed=ints, eos_token_id=st.none() | ints,
        versions=st.dictionaries(strs, strs, max_size=3), extra=json_objects),
    "Arrived": st.builds(Arrived, time=floats, request_id=ints, prompt=prompts, params=params(), priority=ints,
                         cache_salt=st.none() | strs),
    "Admitted": st.builds(Admitted, time=floats, step=ints, request_id=ints, num_cached_tokens=ints,
                          num_reserved_blocks=ints),
    "Preempted": st.builds(Preempted, time=floats, step=ints, request_id=ints),
    "Step": st.builds(Step, step=ints, start=floats, end=floats,
                      spans=st.lists(st.builds(Span, ints, ints, ints, st.booleans()), max_size=4),
                      tokens=st.lists(st.lists(ints, max_size=3), max_size=3),
                      block_events=st.lists(block_events, max_size=4)),
    "Finished": st.builds(Finished, time=floats, request_id=ints, reason=strs, num_output_tokens=ints,
                          block_events=st.lists(block_events, max_size=3)),
    "Aborted": st.builds(Aborted, time=floats, request_id=ints, reason=strs,
                         block_events=st.lists(block_events, max_size=3)),
    "Rejected": st.builds(Rejected, time=floats, num_prompt_tokens=ints, params=params(), reason=strs,
                          priority=ints, prompt=st.none() | prompts),
    "Routed": st.builds(Routed, time=floats, index=ints, replica=ints, request_id=st.none() | ints),
    "ReplicaDown": st.builds(ReplicaDown, time=floats, replica=ints, reason=st.text(), restarting=st.booleans()),
    "ReplicaUp": st.builds(ReplicaUp, time=floats, replica=ints, log=st.none() | st.text()),
}
assert set(EVENTS) == {t.__name__ for t in Event.__args__}, "an event type without a strategy"

SENTINEL = Preempted(time=1.0, step=2, request_id=3)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("roundtrip")


def as_json(value: object) -> object:
    """What JSON can tell apart: tuples are lists, dict keys are strings."""
    return msgspec.to_builtins(value, str_keys=True)


def reads_back_equal(event: Event) -> bool:
    """The oracle: msgspec's own encode → decode (as the reader decodes) keeps the event."""
    try:
        line = msgspec.json.encode(event)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError):
        return False
    try:
        back = msgspec.json.decode(line, type=Event)
    except msgspec.DecodeError:
        return False
    if isinstance(back, Header) and back.schema_version != SCHEMA_VERSION:
        return False  # the reader refuses a log of another schema
    return as_json(back) == as_json(event)


@pytest.mark.parametrize("kind", list(EVENTS))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_writer_accepts_exactly_what_reads_back_equal(workdir, kind, data):
    event = data.draw(EVENTS[kind])
    path = workdir / f"{kind}.jsonl"
    with LogWriter(path) as w:
        try:
            w(event)
            accepted = True
        except LogWriteError as e:
            accepted = False
            assert str(path) in str(e) and kind in str(e)
        w(SENTINEL)  # a refused event leaves nothing behind: the next one is written whole
    back = list(read_log(path))
    note_case(f"{kind} {'accepted' if accepted else 'refused'}")  # both sides are drawn (--hypothesis-show-statistics)
    assert accepted == reads_back_equal(event), (event, back)
    if accepted:
        assert len(back) == 2 and as_json(back[0]) == as_json(event)
        if kind != "Header":  # typed all the way down: equal as Python values too
            assert back[0] == event
    else:
        assert back == [SENTINEL]


@pytest.mark.parametrize("kind", ["Arrived", "Step", "Finished", "Header"])
def test_each_kind_of_unreadable_value_is_refused_with_its_field(tmp_path, kind):
    p = SamplingParams()
    msgspec.structs.force_setattr(p, "repetition_penalty", math.inf)
    event, field = {
        "Arrived": (Arrived(time=0.0, request_id=0, prompt=PromptIds([1]), params=p), "params.repetition_penalty"),
        "Step": (Step(step=0, start=0.0, end=math.nan, spans=[], tokens=[]), "end"),
        "Finished": (Finished(time=0.0, request_id=0, reason="\ud800", num_output_tokens=0), "surrogates"),
        "Header": (Header(extra={"a": [1, {"b": -math.inf}]}), "extra.a[1].b"),
    }[kind]
    with LogWriter(tmp_path / "x.jsonl") as w, pytest.raises(LogWriteError, match=r"refusing.*" + field.replace(
            ".", r"\.").replace("[", r"\[").replace("]", r"\]")):
        w(event)
