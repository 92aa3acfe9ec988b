"""Request bodies -> prompt token ids, without blocking the event loop, refusing what cannot fit
before paying for it.

- On the loop, cheap checks only: the prompt's shape, the batch against the queue, and a lower
  bound on its token count (characters / the most characters one token covers; a chat's template
  markers per message, ``ChatSize``), so a 10 MB prompt is refused without
  being tokenized and 240,000 tiny messages without being templated. The counts (prompts, messages)
  are checked on the raw body too, before it is parsed (``precheck_*``): its members read as raw JSON
  spans, one scan that builds no object inside them, count 240,000 tiny chat messages (8 MB) in ~20 ms
  on a 2-core CPU, where ``json.loads`` builds them in ~85 ms.
- Tokenizing and chat templating run in a worker thread (``asyncio.to_thread``; HF tokenizers
  drop the GIL): /health answers while a big prompt is encoded. A large body's whole intake,
  templating included (Jinja holds the GIL), runs in an intake process instead (``*_now``,
  runtime/serving/server/intake.py).
- A prompt too long by itself names ``prompt`` (completions) or ``messages`` (chat); one that fits
  but not with its output budget names ``max_tokens`` (or ``max_completion_tokens``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, get_args

import msgspec
from msgspec import Raw

from runtime.serving.async_engine import AsyncLLMEngine
from runtime.serving.server.protocol import ChatCompletionRequest, FieldError, Role, message_text
from traces.params import InvalidRequest, SamplingParams

try:  # jinja2 comes with transformers' chat templates
    from jinja2 import TemplateError as _TemplateError
except ImportError:  # pragma: no cover
    _TemplateError = ValueError

_ONE_TOKEN = SamplingParams(max_tokens=1)


def max_chars_per_token(tokenizer: Any) -> int | None:
    """Most characters of text one token can stand for, or None if unknown. A vocabulary string is
    at least as long as the text it covers (byte-level BPE spells each byte as one character); a
    normalizer may shorten text first, so then allow twice that."""
    try:
        longest = max(map(len, tokenizer.get_vocab()), default=0)
    except (AttributeError, TypeError):
        return None
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    return longest * (1 if normalizer is None else 2) or None


ROLES: tuple[str, ...] = get_args(Role)


class ChatSize:
    """A lower bound on a chat prompt's tokens, known before its template is rendered, so that a request
    that cannot fit the context is refused for the price of counting (rendering 240,000 tiny messages
    takes the template tens of seconds).

    Each message costs its template markers at least. They are measured once per role, by rendering
    the template around one empty message of that role (``[user, R]`` less ``[user]``): the characters
    the markers add, and the added tokens among them (``<|im_start|>``…: the tokenizer splits those out
    before any merge, so they never share a token with text). A prompt then has at least

    - its added marker tokens, plus its content characters over the most characters one token covers;
    - all of its characters (markers and content) over that same figure,

    whichever is more. A role the template refuses, or a template that writes nothing per message,
    counts 0: the bound stays a bound, only weaker.
    """

    def __init__(self, tokenizer: Any, chars_per_token: int | None) -> None:
        self.chars_per_token = chars_per_token
        self.marker_tokens: dict[str, int] = {}
        self.marker_chars: dict[str, int] = {}
        added = set(getattr(tokenizer, "added_tokens_decoder", None) or ())
        base = _render(tokenizer, [])
        for role in ROLES:
            one = _render(tokenizer, [role])
            if base is None or one is None:
                tokens = chars = 0
            else:
                tokens = sum(t in added for t in one[1]) - sum(t in added for t in base[1])
                chars = len(one[0]) - len(base[0])
            self.marker_tokens[role], self.marker_chars[role] = max(tokens, 0), max(chars, 0)
        # what any message costs, whatever its role (the raw body's check, before roles are read)
        self.min_marker_tokens = min(self.marker_tokens.values())
        self.min_marker_chars = min(self.marker_chars.values())

    def _bound(self, marker_tokens: int, marker_chars: int, content_chars: int) -> int:
        cpt = self.chars_per_token
        if not cpt:
            return marker_tokens
        return max(marker_tokens + -(-content_chars // cpt), -(-(marker_chars + content_chars) // cpt))

    def at_least(self, num_messages: int) -> int:
        """Fewest tokens ``num_messages`` messages of any roles and contents make."""
        return self._bound(num_messages * self.min_marker_tokens, num_messages * self.min_marker_chars, 0)

    def of(self, messages: Iterable[tuple[str, int]]) -> int:
        """Fewest tokens messages of these (role, kept content characters) make."""
        tokens = chars = content = 0
        marker_tokens, marker_chars = self.marker_tokens, self.marker_chars
        for role, n in messages:
            tokens += marker_tokens[role]
            chars += marker_chars[role]
            content += n
        return self._bound(tokens, chars, content)


def _render(tokenizer: Any, roles: list[str]) -> tuple[str, list[int]] | None:
    """The template's text and ids for a user message then ``roles``, all empty; None if it refuses."""
    messages = [{"role": r, "content": ""} for r in ["user", *roles]]
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    except Exception:  # the template's raise_exception(), or no template at all
        return None
    return text, list(ids)


def _check_text(text: str, param: str) -> None:
    """JSON escapes can smuggle in lone surrogates, which no tokenizer can encode."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise FieldError(param, "must be valid Unicode text (no lone surrogates)") from None


class Prompts:
    def __init__(self, tokenizer: Any, engine: AsyncLLMEngine) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.engine = engine
        self.max_model_len = engine.config.scheduler.max_model_len
        self.chars_per_token = max_chars_per_token(tokenizer)
        self.chat_size = ChatSize(tokenizer, self.chars_per_token)

    # --- the raw body, before the body model validates each of its items ----------------------------

    def precheck_completion(self, body: dict[str, Raw]) -> None:
        prompt = raw_items(body.get("prompt"))
        if prompt and memoryview(prompt[0])[:1] in (b'"', b"["):  # a batch of texts or of id lists
            n = raw_value(body.get("n"))
            self._check_batch(len(prompt), n if type(n) is int and n > 0 else 1)

    def precheck_chat(self, body: dict[str, Raw]) -> None:
        messages = raw_items(body.get("messages"))
        if messages is not None:
            self._check_length(self.chat_size.at_least(len(messages)), "messages", f"{len(messages)} messages")

    # --- completions ------------------------------------------------------------------------------

    async def completion(self, prompt: str | list, n: int) -> list[list[int]]:
        texts, ids = self._completion_items(prompt, n)
        if texts is not None:
            return await asyncio.to_thread(self._encode_all, texts)
        return self._check_ids(ids)  # min/max run at C speed: no worker thread needed

    def completion_now(self, prompt: str | list, n: int) -> list[list[int]]:
        """``completion`` on this thread (an intake worker's)."""
        texts, ids = self._completion_items(prompt, n)
        return self._encode_all(texts) if texts is not None else self._check_ids(ids)

    def _completion_items(self, prompt: str | list, n: int) -> tuple[list[str] | None, list[list[int]] | None]:
        # the request model validated ``prompt`` as one of str | list[str] | list[int] | list[list[int]]:
        # a list's first item tells which (no pass over a 40k-token prompt here)
        if isinstance(prompt, str):
            texts, ids = [prompt], None
        elif prompt and isinstance(prompt[0], str):
            texts, ids = list(prompt), None
        elif prompt and isinstance(prompt[0], int):
            texts, ids = None, [prompt]
        else:
            texts, ids = None, [list(p) for p in prompt]
        items = texts if texts is not None else ids
        if not items or any(len(p) == 0 for p in items):
            raise FieldError("prompt", "must not be empty")
        self._check_batch(len(items), n)
        if texts is not None:
            for text in texts:
                self._check_length(self._lower_bound(len(text)), "prompt", f"{len(text)} characters")
        else:
            for p in ids:
                self._check_length(len(p), "prompt", "")
        return texts, ids

    def _encode_all(self, texts: list[str]) -> list[list[int]]:
        out = []
        for text in texts:
            _check_text(text, "prompt")
            out.append(list(self.tokenizer(text)["input_ids"]))
        return out

    def _check_ids(self, prompts: list[list[int]]) -> list[list[int]]:
        for p in prompts:
            if min(p) < 0 or max(p) >= self.vocab_size:  # no token id in the message: it is prompt content
                raise FieldError("prompt", f"a token id is outside the vocabulary [0, {self.vocab_size})")
        return prompts

    # --- chat -------------------------------------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest) -> list[int]:
        return await asyncio.to_thread(self._template, self._chat_messages(req))

    def chat_now(self, req: ChatCompletionRequest) -> list[int]:
        """``chat`` on this thread (an intake worker's)."""
        return self._template(self._chat_messages(req))

    def _chat_messages(self, req: ChatCompletionRequest) -> list[dict]:
        self._check_batch(1, req.n)
        messages = [{"role": m.role, "content": message_text(m, i)} for i, m in enumerate(req.messages)]
        # the template may drop earlier assistant text (reasoning); every message's markers, and every
        # other message's text, are kept
        kept = [(m["role"], 0 if m["role"] == "assistant" else len(m["content"])) for m in messages]
        self._check_length(self.chat_size.of(kept), "messages",
                           f"{len(messages)} messages, {sum(n for _, n in kept)} characters of content,")
        return messages

    def _template(self, messages: list[dict]) -> list[int]:
        for i, m in enumerate(messages):
            _check_text(m["content"], f"messages[{i}].content")
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except _TemplateError as e:  # the template's own raise_exception(): its text, not the prompt's
            raise FieldError("messages", f"rejected by the model's chat template: {e}") from None
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    # --- limits -----------------------------------------------------------------------------------

    def _check_batch(self, num_prompts: int, n: int) -> None:
        if num_prompts * n > self.engine.max_pending:
            raise FieldError("prompt" if num_prompts > 1 else "n",
                             f"{num_prompts} prompt(s) x n={n} requests exceed the server's queue "
                             f"(max_pending={self.engine.max_pending})")

    def _lower_bound(self, chars: int) -> int:
        """Fewest tokens ``chars`` characters can make (0 if the tokenizer doesn't tell)."""
        return -(-chars // self.chars_per_token) if self.chars_per_token else 0

    def _check_length(self, num_tokens: int, param: str, basis: str) -> None:
        """Refuse a prompt of (at least) ``num_tokens`` that could never run, whatever max_tokens."""
        try:
            self.engine.validate(max(num_tokens, 1), _ONE_TOKEN)
        except InvalidRequest as e:
            raise FieldError(param, f"too long: {basis} make at least {num_tokens} tokens ({e})" if basis
                             else str(e)) from None

    def fit(self, prompt: Sequence[int], params: SamplingParams, param: str, budget_param: str,
            budget_given: bool) -> SamplingParams:
        """``params`` for this prompt: checked against the context and the KV pool; an unset
        max_tokens (default 16) shrinks to what the context leaves, as vLLM's unset one does."""
        n = len(prompt)
        self._check_length(n, param, "")
        room = self.max_model_len - n
        if not budget_given and params.max_tokens > room:
            params = msgspec.structs.replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
        if n + params.max_tokens > self.max_model_len:
            raise FieldError(budget_param, f"the prompt ({n} tokens) + {budget_param} ({params.max_tokens}) "
                                           f"exceeds the model's context length (max_model_len={self.max_model_len})")
        try:
            self.engine.validate(n, params)
        except InvalidRequest as e:
            raise FieldError(budget_param, str(e)) from None
        return params


# --- the raw body ----------------------------------------------------------------------------------

_MEMBERS = msgspec.json.Decoder(dict[str, Raw])
_ITEMS = msgspec.json.Decoder(list[Raw])
_VALUE = msgspec.json.Decoder()


def raw_members(data: bytes) -> dict[str, Raw] | None:
    """The top-level members of a JSON object as raw JSON (the last of a repeated key, as
    ``json.loads``); None if ``data`` is not one: the full parse then says why."""
    try:
        return _MEMBERS.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None


def members_of(body: dict) -> dict[str, Raw] | None:
    """``raw_members`` of a body ``json.loads`` read and msgspec does not (a byte-order mark, NaN):
    its members written out again; None if they cannot be."""
    try:
        return {k: Raw(msgspec.json.encode(v)) for k, v in body.items()}
    except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
        return None


def raw_items(raw: Raw | None) -> list[Raw] | None:
    """The items of a JSON array as raw JSON; None if ``raw`` is absent or not an array."""
    if raw is None or memoryview(raw)[:1] != b"[":
        return None
    return _ITEMS.decode(raw)


def raw_value(raw: Raw | None) -> Any:
    """A small member's value (a number, a flag); None if absent or unreadable."""
    if raw is None:
        return None
    try:
        return _VALUE.decode(raw)
    except msgspec.DecodeError:  # (a number past float range): the body model says what is wrong
        return None
