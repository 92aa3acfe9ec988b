"""The cost models' longest program (traces/decode_splits.py) is the kernel's split arithmetic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from traces.decode_splits import DecodeSplits, num_splits


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64), st.integers(1, 256), st.integers(1, 512), st.integers(1, 200_000))
def test_longest_program_is_the_longest_context_over_the_kernels_split_count(kv_heads, sms, seqs, longest):
    policy = DecodeSplits(kv_heads, sms)
    expected = -(-longest // num_splits(seqs, kv_heads, longest, sms))
    assert policy.longest_program(longest, seqs) == expected
    assert policy.longest_program(longest, seqs) == expected  # remembered per decode count


def test_a_policy_is_a_value():
    a, b = DecodeSplits(8, 132), DecodeSplits(8, 132)
    a.longest_program(6000, 7)  # (what it remembers is not part of it)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert DecodeSplits.from_dict(a.to_dict()) == a
