"""runtime/executor/staging.py: many small arrays, one copy, dtypes and values preserved."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.executor.staging import ALIGN, stage


def test_mixed_dtypes_odd_sizes_and_empty_arrays():
    host = {
        "a": np.array([1.5, -2.25, 3.0], dtype=np.float32),  # 12 bytes: the next one needs padding
        "b": np.array([7, -1], dtype=np.int64),
        "empty": np.zeros(0, dtype=np.float64),
        "c": np.array([0.1, 0.2], dtype=np.float64),
        "d": np.array([5], dtype=np.int32),
    }
    dev, nbytes = stage(host, torch.device("cpu"))
    assert nbytes == 4 * ALIGN  # every non-empty array starts on an ALIGN boundary
    for name, a in host.items():
        assert dev[name].dtype == torch.from_numpy(a).dtype
        assert dev[name].tolist() == a.tolist()


def test_nothing_to_send():
    dev, nbytes = stage({"x": np.zeros(0, dtype=np.int64)}, torch.device("cpu"))
    assert nbytes == 0 and dev["x"].numel() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_views_on_cuda():
    host = {"a": np.arange(3, dtype=np.float32), "b": np.arange(5, dtype=np.int64)}
    dev, _ = stage(host, torch.device("cuda"))
    assert dev["a"].is_cuda and dev["b"].tolist() == list(range(5))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_staging_does_not_wait_for_the_work_queued_on_the_device():
    """A copy from pageable memory waits for the stream; through pinned memory the host returns at
    once, and each buffer keeps its bytes until its copy has run, however many follow it."""
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # the stream busy for about a second
    staged = [stage({"a": np.full(1000, i, dtype=np.int64)}, torch.device("cuda"))[0]["a"] for i in range(50)]
    assert not torch.cuda.current_stream().query()  # the host did not wait for the device
    torch.cuda.synchronize()
    assert all(t.unique().tolist() == [i] for i, t in enumerate(staged))
