"""How the Triton decode kernel splits a step's KV reads, shared by the kernel and the cost models.

The kernel (runtime/executor/kernels/paged_attention.py) launches one program per (sequence, KV
head, split) and picks a power-of-two split count so that about ``PROGRAMS_PER_SM`` programs per
SM are in flight. Its time follows its longest program: the longest context divided by the split
count. With few sequences a long one is split many ways and costs little; past about
``PROGRAMS_PER_SM · SMs / KV heads`` sequences nothing is split and one long sequence holds the
whole step (on the H200, a decode past 4,096 tokens adds ~2 ms to a step of 64 or more).

A log's header says which kernel ran (``extra.attention_backend``, ``extra.kv.num_kv_heads``,
``extra.sms``); ``DecodeSplits.from_header_extra`` reads it so that a cost model fitted on the log
prices a step by the same policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_SPLITS = 64
MIN_TOKENS_PER_SPLIT = 256
PROGRAMS_PER_SM = 4
DEFAULT_SMS = 132  # the H200's; a Triton log recorded before headers carried ``sms``


def num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, sms: int) -> int:
    """The decode kernel's split count: a power of two, at most ``MAX_SPLITS``, each split at
    least ``MIN_TOKENS_PER_SPLIT`` tokens of the longest sequence."""
    programs = max(1, num_seqs * num_kv_heads)
    want = PROGRAMS_PER_SM * sms // programs
    most = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    n = min(want, most, MAX_SPLITS)
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class DecodeSplits:
    """The split policy of one model on one device: its KV heads and the device's SM count."""

    num_kv_heads: int
    sms: int
    # per decode count, the most splits the SMs want (min of the first and last terms of num_splits)
    _caps: dict[int, int] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def longest_program(self, longest: int, num_seqs: int) -> int:
        """Context tokens the longest program reads: the longest context over
        ``num_splits(num_seqs, num_kv_heads, longest, sms)`` (the same arithmetic, its per-count
        part remembered: this runs once a simulated decode step)."""
        if longest <= 0 or num_seqs <= 0:
            return 0
        cap = self._caps.get(num_seqs)
        if cap is None:
            cap = self._caps[num_seqs] = min(PROGRAMS_PER_SM * self.sms // (num_seqs * self.num_kv_heads), MAX_SPLITS)
        n = longest // MIN_TOKENS_PER_SPLIT
        if n > cap:
            n = cap
        return longest if n <= 1 else -(-longest // (1 << (n.bit_length() - 1)))

    def to_dict(self) -> dict[str, int]:
        return {"num_kv_heads": self.num_kv_heads, "sms": self.sms}

    @classmethod
    def from_dict(cls, doc: dict[str, Any] | None) -> DecodeSplits | None:
        return None if not doc else cls(int(doc["num_kv_heads"]), int(doc["sms"]))

    @classmethod
    def from_header_extra(cls, extra: dict[str, Any] | None) -> DecodeSplits | None:
        """The policy of the kernel a log's steps ran (None: not the split Triton decode kernel)."""
        extra = extra or {}
        kv = extra.get("kv") or {}
        if extra.get("attention_backend") != "triton" or not kv.get("num_kv_heads"):
            return None
        return cls(int(kv["num_kv_heads"]), int(extra.get("sms") or DEFAULT_SMS))
