"""Before a load run: the OpenAI base URL of a server, and whether one answers there.

``api_base`` takes the address as users write it (``http://host:port``, with or without ``/v1``
and a trailing slash); ``served_models`` asks ``/v1/models`` (each model's id and, where the card
says, its max_model_len) and says in one sentence what is wrong when no server answers or what
answers is not an OpenAI-compatible one.
"""

from __future__ import annotations

from urllib.parse import urlsplit


class ProbeError(Exception):
    """The server can't be used; the message says why (without the flag, which the caller names)."""


class NoModelList(ProbeError):
    """Something answers at the address, but with no OpenAI model list."""


def api_base(url: str) -> str:
    """``http://host:port[/v1][/]`` -> ``http://host:port/v1``."""
    base = url.strip().rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ProbeError(f"expected http://HOST:PORT (optionally ending in /v1), got {url!r}")
    return base if base.endswith("/v1") else base + "/v1"


def served_models(base: str, api_key: str | None = None, timeout: float = 10.0) -> dict[str, int | None]:
    """The model ids ``base``/models lists (``base`` from ``api_base``), each with its card's
    ``max_model_len`` (None: the card does not say)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(base + "/models", headers=headers, timeout=timeout)
    except httpx.HTTPError as e:
        raise ProbeError(f"no server answers at {base} ({e or type(e).__name__}); is it running?") from None
    if resp.status_code in (401, 403):
        raise ProbeError(f"{base}/models answered HTTP {resp.status_code}: the server wants an API key (--api-key)")
    if resp.status_code != 200:
        raise NoModelList(f"{base}/models answered HTTP {resp.status_code}: not an OpenAI-compatible server "
                         "at that address (its API base is usually http://HOST:PORT/v1)")
    try:
        ids = {m["id"]: m.get("max_model_len") if isinstance(m.get("max_model_len"), int) else None
               for m in resp.json()["data"]}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise NoModelList(f"{base}/models answered, but not with an OpenAI model list: not an OpenAI-compatible "
                         "server (or pass --served-model-name)") from None
    if not ids:
        raise NoModelList(f"{base}/models lists no model (pass --served-model-name)")
    return ids
