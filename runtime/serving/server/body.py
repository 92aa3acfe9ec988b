"""A request body's bytes -> the endpoint's body model, as FastAPI reads a body parameter, so that
the same code runs on the event loop (small bodies) and in an intake worker (large ones,
runtime/serving/server/intake.py): JSON only under a JSON content type (none given: not JSON, as
FastAPI's strict default), a decode error as ``json_invalid``, every validation error located
under ``body``. The counts on the raw body (``precheck``) run between parsing and validating, as
FastAPI ran them as a dependency: 240,000 messages are refused before the model reads each one.
"""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def parse(model: type[BaseModel], data: bytes, content_type: str | None,
          precheck: Callable[[dict], None]) -> Any:
    """``model`` from ``data``; RequestValidationError (a 400 naming the field) when it is not one."""
    body: Any = None
    if data:
        body = data
        if _is_json(content_type):
            try:
                body = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body", getattr(e, "pos", 0)),
                                               "msg": "JSON decode error", "input": {}}]) from None
            except RecursionError:  # nesting deeper than the parser goes: not a body anyone sends
                raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                               "msg": "JSON nested too deeply", "input": {}}]) from None
    if isinstance(body, dict):
        precheck(body)
    if body is None:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])}
                                      for err in e.errors(include_url=False, include_context=False)]) from None
