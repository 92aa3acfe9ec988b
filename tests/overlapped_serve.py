"""``minivllm serve`` with overlapped (async) scheduling on every device, for the tests of
tests/test_serving_under_load.py (no tests here).

On CUDA the engine overlaps its steps by default (``EngineParts.overlap``); on the CPU it never
does, since the forward runs inside ``launch``. The CPU's ``ModelRunner`` still takes the
overlapped path (``launch`` / ``collect``, decode inputs read from the previous launch's ids, the
next step planned before the last one is completed), so forcing it there lets CPU CI run the
GPU's serving path, with the real CLI server, its signal handling and its engine process.

Run it as a file (``python tests/overlapped_serve.py serve ...``): the spawned engine process
re-imports this file as ``__mp_main__``, so the patch below applies there too.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: runtime, traces

from runtime.executor.setup import EngineParts  # noqa: E402

# overlap wherever async scheduling is on (its default), not on CUDA only
EngineParts.overlap = property(lambda self: self.runner.async_scheduling)

if __name__ == "__main__":
    from runtime.cli import main

    sys.exit(main())
