"""OpenAI-compatible request bodies (pydantic) and their mapping onto SamplingParams.

Unknown fields are rejected (HTTP 400 naming the field) rather than silently ignored, at every
level (``stream_options``, a message, a content part), except the ones OpenAI clients send
routinely and that change nothing here (``user``, a message's ``name``…). Types are OpenAI's, with
no coercion: a boolean is not a number, a string is not an integer or a boolean, a float is not
an integer (an integer is a number). Floats must be finite (JSON has no NaN or Infinity, but
Python's parser lets them through) and integers fit 64 bits (the log and the sampler hold them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from traces.params import (
    INT32_MAX,
    LOGPROBS_MAX,
    PENALTY_MAX,
    REPETITION_PENALTY_MAX,
    REPETITION_PENALTY_MIN,
    STOP_STRING_CHARS_MAX,
    STOP_STRINGS_MAX,
    InvalidRequest,
    SamplingParams,
)

Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
StopString = Annotated[str, Field(max_length=STOP_STRING_CHARS_MAX)]
StopList = Annotated[list[StopString], Field(max_length=STOP_STRINGS_MAX)]
Role = Literal["system", "user", "assistant", "tool", "developer"]  # a chat message's


class FieldError(InvalidRequest):
    """A bad request field; ``param`` names it as OpenAI's error body does (``messages[0].content``).
    The message must not quote prompt text."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


# strict: pydantic's default would turn true into 1.0, "7" into 7, "true" into True
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = False


class _SamplingFields(BaseModel):
    model_config = STRICT

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | StopList | None = None
    seed: Int64 | None = None
    presence_penalty: float = Field(default=0.0, ge=-PENALTY_MAX, le=PENALTY_MAX)
    frequency_penalty: float = Field(default=0.0, ge=-PENALTY_MAX, le=PENALTY_MAX)
    user: str | None = None
    # extensions (vLLM's)
    top_k: int = Field(default=0, ge=-1, le=INT32_MAX)  # 0 or -1 (vLLM's "off"): no top-k
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    # float32 on the device: past these a logit divided or multiplied by it rounds to 0 or overflows
    repetition_penalty: float = Field(default=1.0, ge=REPETITION_PENALTY_MIN, le=REPETITION_PENALTY_MAX)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    priority: Int64 = 0
    cache_salt: str | None = Field(default=None, min_length=1)  # prefix-cache isolation between tenants

    @field_validator("cache_salt")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        if value is not None and not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:  # a JSON escape can hold a lone surrogate: no hash can take it
                raise ValueError("must be valid Unicode text (no lone surrogates)") from None
        return value

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens or 16,
            min_tokens=self.min_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            stop=stop,
            include_stop_str_in_output=self.include_stop_str_in_output,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
        )


# A completions prompt: text, texts, token ids or lists of them. Tried in this order, strictly first:
# pydantic's default ("smart") union validates a 40k-token prompt against several members (~4 ms of
# the event loop's time on a server CPU) where the strict list of ints alone takes ~1 ms; the lax
# members after them keep what smart mode accepted besides ([1.0, 2] and [true, 2] as token ids).
Prompt = Annotated[str | list[StrictInt] | list[str] | list[list[StrictInt]] | list[int] | list[list[int]],
                   Field(union_mode="left_to_right")]


class CompletionRequest(_SamplingFields):
    prompt: Prompt
    logprobs: int | None = Field(default=None, ge=0, le=LOGPROBS_MAX)
    echo: Literal[False] = False
    suffix: None = None
    best_of: Literal[1] | None = None

    @field_validator("echo", "best_of", mode="before")
    @classmethod
    def _not_coerced(cls, value: Any, info: Any) -> Any:
        """A literal compares equal across types (0 == False, True == 1): check the type first."""
        want = bool if info.field_name == "echo" else int
        if value is not None and (type(value) is not want):
            raise ValueError(f"must be {'a boolean' if want is bool else 'an integer'}")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Role
    content: str | list[dict[str, Any]] | None = None
    # OpenAI's other message fields: accepted, not rendered (the template gets role and content)
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    audio: dict[str, Any] | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=LOGPROBS_MAX)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The field that set the output budget (named by a too-long error)."""
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def check(self) -> None:
        """OpenAI's rule across fields: top_logprobs only with logprobs: true."""
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "requires logprobs: true")


_KNOWN_PART_TYPES = frozenset({"image_url", "input_audio", "file", "refusal", "input_image", "image", "audio",
                               "video_url", "audio_url"})


def message_text(message: ChatMessage, index: int) -> str:
    """Content as plain text (OpenAI allows a list of parts; only text parts are supported)."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for j, part in enumerate(message.content):
        kind = part.get("type")
        if kind != "text":
            shown = f" {kind!r}" if kind in _KNOWN_PART_TYPES else ""  # never echo free text from the client
            raise FieldError(f"messages[{index}].content[{j}].type",
                             f"content parts of type{shown} are not supported; only 'text' parts are")
        text = part.get("text")
        if not isinstance(text, str):
            raise FieldError(f"messages[{index}].content[{j}].text", "must be a string")
        if len(part) > 2:  # a text part is {type, text}
            extra = next(k for k in part if k not in ("type", "text"))
            shown = f".{extra}" if extra.isidentifier() and len(extra) <= 64 else ""  # a key is client text too
            raise FieldError(f"messages[{index}].content[{j}]{shown}", "unknown field")
        texts.append(text)
    return "".join(texts)
