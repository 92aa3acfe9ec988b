"""What a completions ``prompt`` may be (runtime/serving/server/protocol.py): text, texts, token ids
or lists of them, strictly as OpenAI's schema says: a token id is an int, never a whole float or a
boolean (a 40k-token prompt costs the event loop one pass over its ints)."""

from __future__ import annotations

import pydantic
import pytest

from runtime.serving.server.protocol import CompletionRequest


@pytest.mark.parametrize("prompt,parsed", [
    ("hi", "hi"),
    (["a", "b"], ["a", "b"]),
    (["1", "2"], ["1", "2"]),  # two texts, not two token ids
    ([5, 6], [5, 6]),
    ([[1, 2], [3]], [[1, 2], [3]]),
    ([], []),  # (found empty later, with a 400 naming the prompt: tests/test_server_errors.py)
])
def test_prompt_kinds(prompt, parsed):
    got = CompletionRequest.model_validate({"prompt": prompt}).prompt
    assert got == parsed and type(got) is type(parsed)
    if isinstance(got, list):
        assert [type(x) for x in got] == [type(x) for x in parsed]


@pytest.mark.parametrize("prompt", [[1, "a"], [1.5], [1.0, 2], [True, 2], [[1], "a"], {"a": 1}, None, 3])
def test_other_prompts_are_refused_naming_the_field(prompt):
    with pytest.raises(pydantic.ValidationError) as exc:
        CompletionRequest.model_validate({"prompt": prompt})
    assert all(e["loc"][0] == "prompt" for e in exc.value.errors())


def test_a_long_token_prompt_comes_back_as_plain_ints():
    ids = list(range(40_000))
    got = CompletionRequest.model_validate({"prompt": ids}).prompt
    assert got == ids and all(type(x) is int for x in got)
