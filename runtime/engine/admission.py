"""Whether an engine could ever serve a request: one rule, read by the core when a request is added
and by a server's front end before it queues one (it holds the engine's config, not its core)."""

from __future__ import annotations

from runtime.engine.config import EngineConfig
from traces.params import InvalidRequest, SamplingParams


def validate_request(config: EngineConfig, num_prompt_tokens: int, params: SamplingParams) -> None:
    """Raise InvalidRequest if an engine of ``config`` could never serve such a request."""
    sched, cache = config.scheduler, config.cache
    if num_prompt_tokens < 1:
        raise InvalidRequest("prompt must contain at least one token")
    if num_prompt_tokens >= sched.max_model_len:
        raise InvalidRequest(
            f"prompt has {num_prompt_tokens} tokens; max_model_len is {sched.max_model_len}")
    total = min(num_prompt_tokens + params.max_tokens, sched.max_model_len)
    if -(-total // cache.block_size) > cache.num_blocks:
        raise InvalidRequest(
            f"prompt + max_tokens = {total} tokens need {-(-total // cache.block_size)} KV blocks; "
            f"the pool has {cache.num_blocks} (cache.num_blocks)")
    if not sched.enable_chunked_prefill and total > sched.max_num_batched_tokens:
        raise InvalidRequest(
            f"prompt + max_tokens = {total} tokens exceed scheduler.max_num_batched_tokens="
            f"{sched.max_num_batched_tokens}, which must hold a whole (re)computed prompt when "
            "chunked prefill is off")


def check_cache_salt(cache_salt: object) -> None:
    """Raise InvalidRequest unless ``cache_salt`` is a non-empty string the log can hold."""
    if not isinstance(cache_salt, str) or not cache_salt:
        raise InvalidRequest(f"cache_salt must be a non-empty string, got {cache_salt!r}")
    try:
        cache_salt.encode()
    except UnicodeEncodeError:
        raise InvalidRequest("cache_salt must be valid Unicode text (no lone surrogates)") from None
