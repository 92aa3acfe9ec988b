"""Logprobs as OpenAI shapes them, for a text whose characters are split over tokens ("你" is two
SmolLM2 tokens): each token's own bytes, its text as the stream decodes it, completions'
``text_offset``, the same in a stream as in a whole answer; chat's ``top_logprobs`` rule;
``GET /v1/models/{id}``. The engine answers with a script: the tokens of ``TEXT``, each with one
alternative."""

from __future__ import annotations

import httpx
import openai
import pytest

from runtime.engine.config import CacheConfig, EngineConfig, SchedulerConfig
from runtime.engine.core import EngineCore
from runtime.engine.types import StepResult
from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.llm_engine import LLMEngine
from runtime.serving.server.app import create_app
from runtime.serving.server.launch import ServerThread
from runtime.serving.server.token_text import ChoiceTokens, TokenBytes

TEXT = "Hi 你好, 世界 🙂 there, ça va?"
ALTERNATIVE = 34  # "2": a whole character


class Scripted:
    """Output token i is ``script[i]``, with logprob -0.25 and ALTERNATIVE at -2."""

    def __init__(self, script: list[int]) -> None:
        self.script = script

    def execute(self, plan, requests):
        toks, lps = [], []
        for s in plan.spans:
            if s.sample:
                req = requests[s.request_id]
                t = self.script[(s.start + s.num_tokens - req.num_prompt_tokens) % len(self.script)]
                toks.append([t])
                lps.append([{t: -0.25, ALTERNATIVE: -2.0}])
        return StepResult(toks, 0.001, lps)


@pytest.fixture(scope="module")
def script(smollm2_tokenizer):
    return smollm2_tokenizer(TEXT)["input_ids"]


@pytest.fixture(scope="module")
def served(smollm2_tokenizer, script):
    cfg = EngineConfig(cache=CacheConfig(block_size=16, num_blocks=64),
                       scheduler=SchedulerConfig(max_num_batched_tokens=256, max_model_len=256))
    engine = LLMEngine.from_core(EngineCore(cfg, eos_token_id=None), Scripted(script), smollm2_tokenizer)
    front = AsyncLLMEngine(engine)
    front.start()
    try:
        with ServerThread(create_app(front, smollm2_tokenizer, "org/model")) as http:
            yield http.url, openai.OpenAI(base_url=http.url + "/v1", api_key="unused", max_retries=0)
    finally:
        front.shutdown()


def test_token_bytes_join_into_the_text_and_texts_add_up(smollm2_tokenizer, script):
    tokens = ChoiceTokens(TokenBytes(smollm2_tokenizer))
    assert [smollm2_tokenizer.decode([t]) for t in script].count("\ufffd") >= 6  # decoded alone: broken
    out = [tokens.add(t) for t in script]
    assert b"".join(data for _, data, _ in out) == TEXT.encode()
    texts = [text for text, _, _ in out]
    assert "".join(t for t in texts if not t.startswith("bytes:")) == TEXT
    assert texts[2:4] == ["bytes:\\xe4\\xbd", "你"]  # the first half shows its bytes; the second completes it
    assert [offset for _, _, offset in out] == [len("".join(t for t in texts[:i] if not t.startswith("bytes:")))
                                                for i in range(len(texts))]


def _completion_logprobs(client, stream: bool, n: int) -> tuple[str, dict]:
    args = dict(model="org/model", prompt="x", max_tokens=n, logprobs=1)
    if not stream:
        c = client.completions.create(**args).choices[0]
        return c.text, c.logprobs.model_dump()
    text, merged = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(stream=True, **args):
        c = chunk.choices[0]
        text += c.text
        if c.logprobs is not None:
            for key in merged:
                merged[key] += getattr(c.logprobs, key)
    return text, merged


@pytest.mark.parametrize("stream", [False, True])
def test_completion_offsets_and_tokens(served, script, stream):
    _, client = served
    text, lp = _completion_logprobs(client, stream, len(script))
    assert text == TEXT
    shown = [t for t in lp["tokens"] if not t.startswith("bytes:")]
    assert "".join(shown) == TEXT
    assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] == len(TEXT) - 1  # "?" is the last character
    for i, t in enumerate(lp["tokens"][:-1]):
        step = 0 if t.startswith("bytes:") else len(t)
        assert lp["text_offset"][i + 1] == lp["text_offset"][i] + step
    assert lp["token_logprobs"] == [-0.25] * len(script)
    # the alternative in the sampled token's place ("\ufffd2" after half a character: that half is broken)
    assert all([v for k, v in top.items() if k in ("2", "\ufffd2")] == [-2.0] for top in lp["top_logprobs"])
    assert sum("\ufffd2" in top for top in lp["top_logprobs"]) == 6  # after each partial character


def test_stream_and_whole_answer_agree(served, script):
    _, client = served
    assert _completion_logprobs(client, True, len(script))[1] == _completion_logprobs(client, False, len(script))[1]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_bytes_join_into_the_content(served, script, stream):
    _, client = served
    args = dict(model="org/model", messages=[{"role": "user", "content": "x"}], max_tokens=len(script),
                logprobs=True, top_logprobs=2)
    if stream:
        content, entries = "", []
        for chunk in client.chat.completions.create(stream=True, **args):
            for c in chunk.choices:
                content += c.delta.content or ""
                entries += c.logprobs.content if c.logprobs is not None else []
    else:
        choice = client.chat.completions.create(**args).choices[0]
        content, entries = choice.message.content, choice.logprobs.content
    assert content == TEXT
    assert bytes(b for e in entries for b in e.bytes) == TEXT.encode()
    assert all(e.top_logprobs[0].bytes == e.bytes and e.top_logprobs[1].bytes == [50] for e in entries)  # "2"


@pytest.mark.parametrize("logprobs", [None, False])
def test_chat_top_logprobs_needs_logprobs_true(served, logprobs):
    _, client = served
    extra = {} if logprobs is None else {"logprobs": logprobs}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="org/model", messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       top_logprobs=2, **extra)
    assert err.value.body["param"] == "top_logprobs"


def test_models_retrieve(served):
    url, client = served
    assert client.models.retrieve("org/model").id == "org/model"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-5")
    assert err.value.body == {"message": "no such model; this server serves 'org/model'",
                              "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == "org/model"
