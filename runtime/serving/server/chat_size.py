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

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args

from runtime.serving.server.protocol import Role

ROLES: tuple[str, ...] = get_args(Role)


class ChatSize:
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
