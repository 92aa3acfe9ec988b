"""``minivllm profile --for WORKLOAD|LOG``: the sweep is sized to what the workload asks of a cost
model (its longest request, longest prompt and largest decode batch)."""

from __future__ import annotations

import pytest

from runtime.cli import main
from runtime.cli.profile_for import workload_shape
from tests.model_helpers import make_tiny, one_thread
from traces.generators import generate
from traces.log import read_header

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def test_the_shape_of_a_log_is_what_its_steps_did():
    shape = workload_shape("tests/data/h200/heldout_conv_on_0.7.jsonl.gz", {})
    assert (shape.max_request, shape.max_prompt, shape.max_batch) == (4292, 4107, 122)


def test_the_shape_of_a_workload_comes_from_its_requests_and_a_resimulation(tmp_path):
    path = tmp_path / "w.jsonl"
    generate(40, rate=1000.0, input_len="uniform:20:300", output_len="fixed:50", seed=1).save(path)
    shape = workload_shape(str(path), {"max_num_seqs": 8})
    assert shape.max_prompt <= 300 and shape.max_request == shape.max_prompt + 50
    assert shape.max_batch == 8  # all arrive at once: the batch fills to max_num_seqs


def test_profile_for_sizes_the_sweep(tmp_path):
    tiny = make_tiny("llama", tmp_path / "model")
    workload = tmp_path / "w.jsonl"
    generate(12, rate=1000.0, input_len="uniform:20:90", output_len="fixed:10", seed=2).save(workload)
    log = tmp_path / "p.jsonl"
    assert main(["profile", "--model", str(tiny.folder), "--device", "cpu", "--for", str(workload),
                 "--max-num-seqs", "4", "--quiet-wait", "0", "--out", str(log), "--no-progress"]) == 0
    limits = read_header(log).extra["profile"]
    shape = workload_shape(str(workload), {"max_num_seqs": 4})
    assert limits["max_batch"] == shape.max_batch == 4
    assert limits["max_prefill"] >= shape.max_prompt
    assert limits["max_context"] <= shape.max_request


def test_a_missing_workload_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--for", "nope.jsonl", "--quick"])
    assert exc.value.code == 2 and "--for: nope.jsonl" in capsys.readouterr().err
