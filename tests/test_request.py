from array import array

import pytest

from runtime.engine.request import Request, RequestStatus
from traces.params import InvalidRequest, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-300}, "repetition_penalty"),  # 0 in float32
        ({"repetition_penalty": 1e308}, "repetition_penalty"),  # inf in float32
        ({"temperature": 1e39}, "temperature"),
        ({"top_k": 2**31}, "top_k"),  # int32 on the device
        ({"stop": ("x",) * 33}, "stop"),
        ({"stop": ("x" * 257,)}, "stop"),
        ({"stop_token_ids": (2**31,)}, "stop_token_ids"),
        ({"logprobs": 50}, "logprobs"),
        ({"stop": ("",)}, "stop"),
        ({"stop_token_ids": (-3,)}, "stop_token_ids"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequest, match=field):
        SamplingParams(**kwargs)


def make(params, prompt=(1, 2, 3), max_model_len=100, eos=0):
    return Request(0, array("i", prompt), params, 0.0, max_model_len, eos_token_id=eos)


def feed(req, tokens):
    reason = None
    for t in tokens:
        req.token_ids.append(t)
        reason = req.check_stop(t)
        if reason:
            break
    return reason


def test_eos_stops_unless_ignored_or_below_min_tokens():
    assert feed(make(SamplingParams(max_tokens=10)), [5, 0]) == "stop"
    req = make(SamplingParams(max_tokens=10, ignore_eos=True))
    assert feed(req, [0, 0, 0]) is None and req.num_output_tokens == 3
    req = make(SamplingParams(max_tokens=10, min_tokens=3))
    assert feed(req, [0, 0, 0]) == "stop" and req.num_output_tokens == 3


def test_stop_token_ids_max_tokens_and_max_model_len():
    assert feed(make(SamplingParams(max_tokens=10, stop_token_ids=(9,))), [4, 9]) == "stop"
    req = make(SamplingParams(max_tokens=2))
    assert feed(req, [4, 5, 6]) == "length" and req.num_output_tokens == 2
    req = make(SamplingParams(max_tokens=50), max_model_len=5)
    assert feed(req, [4, 5, 6]) == "length" and req.num_tokens == 5


def test_status_and_token_accounting():
    req = make(SamplingParams())
    assert req.status is RequestStatus.WAITING and not req.status.done
    # what LLM outputs report for a request aborted before it was ever admitted
    assert (req.num_cached_tokens, req.num_preemptions, req.finish_reason, req.priority) == (0, 0, None, 0)
    assert (req.num_prompt_tokens, req.num_tokens, req.num_remaining_tokens) == (3, 3, 3)
    req.num_computed_tokens = 3
    req.token_ids.append(7)
    assert req.num_remaining_tokens == 1 and req.output_token_ids == [7]
    assert req.prompt_token_ids == [1, 2, 3]
    assert RequestStatus.ABORTED.done and RequestStatus.FINISHED.done


@pytest.mark.parametrize(
    ("kwargs", "eos", "matters"),
    [
        ({}, None, False),  # only length limits: known in advance
        ({"ignore_eos": True}, 0, False),
        ({}, 0, True),  # may stop on eos
        ({"stop_token_ids": (9,)}, None, True),
        ({"stop": ("x",)}, None, True),  # a stop string (the detokenizer ends the request)
        ({"repetition_penalty": 1.2}, None, True),  # penalties read the history
        ({"frequency_penalty": 0.5}, None, True),
        ({"presence_penalty": 0.5}, None, True),
    ],
)
def test_next_token_matters_when_its_value_can_change_what_happens_next(kwargs, eos, matters):
    """Overlapped steps (StepLoop) plan the next step before this token is known: only allowed when
    its value can't end the request or feed the sampler."""
    req = make(SamplingParams(max_tokens=10, **kwargs), eos=eos)
    assert req.next_token_matters() is matters


@pytest.mark.parametrize("stop", [{"stop_token_ids": (9,)}, {}])
def test_a_stop_token_matters_from_the_min_tokens_th_output_on(stop):
    req = make(SamplingParams(max_tokens=10, min_tokens=3, **stop), eos=0)
    seen = []
    for token in range(5):  # the next token is output 1, 2, 3, 4, 5
        seen.append(req.next_token_matters())
        req.token_ids.append(5 + token)
    assert seen == [False, False, True, True, True]


@pytest.mark.parametrize(("params", "eos", "stops_on_token", "may_matter"), [
    (SamplingParams(), None, False, False),  # no eos token, no stops: only the length ends it
    (SamplingParams(), 2, True, True),
    (SamplingParams(ignore_eos=True), 2, False, False),
    (SamplingParams(ignore_eos=True, stop_token_ids=(5,)), 2, True, True),
    (SamplingParams(ignore_eos=True, stop=("x",)), 2, False, True),  # a stop string: the detokenizer's
    (SamplingParams(ignore_eos=True, repetition_penalty=1.2), 2, False, True),
    (SamplingParams(ignore_eos=True, frequency_penalty=0.5), 2, False, True),
    (SamplingParams(ignore_eos=True, presence_penalty=0.5), 2, False, True),
])
def test_which_token_values_can_matter(params, eos, stops_on_token, may_matter):
    """``stops_on_token``: a sampled value can end the request; ``token_may_matter``: a value can
    change anything after it (a stop, a stop string, a penalty). Each alone is enough."""
    req = Request(0, array("i", [1, 2, 3]), params, 0.0, 64, eos_token_id=eos)
    assert (req.stops_on_token, req.token_may_matter) == (stops_on_token, may_matter)
