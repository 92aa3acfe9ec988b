"""A/B comparisons state every Header difference: config fields, the Header's own fields, extra
(device, dtype, model path, ...) and versions; values as a reader wants them (on/off, 2,048); a
field only some runs record is named once on an "only in" line, not a row of "(absent)"."""

from __future__ import annotations

from analysis.header_diff import header_differences, header_fields, render_header_differences
from runtime.engine.config import EngineConfig
from traces.events import make_header


def _header(config=None, **kw):
    return make_header(config or EngineConfig(), clock=kw.pop("clock", "wall"), **kw)


def test_every_differing_field_is_listed_once_in_header_order():
    a = _header(extra={"device": "cpu", "kv": {"num_layers": 30}}, model_identity="smollm2@x")
    cfg = EngineConfig().replace(**{"scheduler.enable_chunked_prefill": False, "scheduler.max_num_batched_tokens":
                                    123_000, "cache.num_blocks": 50, "seed": 3})
    b = _header(cfg, clock="sim", extra={"device": "cuda", "cost_model": "m.json"}, model_identity="smollm2@x")
    text = render_header_differences(["on", "off"], [a, b])
    assert text.splitlines() == [
        "config differences (on → off):",
        "  cache.num_blocks: 1,024 → 50",
        "  scheduler.max_num_batched_tokens: 2,048 → 123,000",
        "  scheduler.enable_chunked_prefill: on → off",
        "  seed: 0 → 3",
        "  clock: wall → sim",
        "  extra.device: cpu → cuda",
        "  only in on: extra.kv.num_layers=30",
        "  only in off: extra.cost_model=m.json",
    ]
    assert "(absent)" not in text


def test_the_header_repeats_of_config_fields_are_not_listed_twice():
    fields = header_fields(_header(model_identity="m@1"))
    assert "num_blocks" not in fields and "block_size" not in fields and fields["model"] == "m@1"
    assert fields["cache.num_blocks"] == 1024 and "versions.python" in fields


def test_three_runs_and_no_difference():
    a, b = _header(), _header(EngineConfig().replace(**{"scheduler.policy": "priority"}))
    assert header_differences([a, a, b]) == [("scheduler.policy", ["fcfs", "fcfs", "priority"])]
    assert "scheduler.policy: fcfs → fcfs → priority" in render_header_differences(["x", "y", "z"], [a, a, b])
    assert render_header_differences(["x", "y"], [a, a]).startswith("same config in every run (x → y)")
    assert render_header_differences(["x"], [a]) == ""


def test_a_value_of_another_type_is_a_difference():
    a, b = _header(extra={"n": 1}), _header(extra={"n": 1.0, "flag": None})
    lines = render_header_differences(["a", "b"], [a, b]).splitlines()[1:]
    assert lines == ["  extra.n: 1 → 1.0", "  only in b: extra.flag=none"]


def test_fields_only_some_runs_record_are_one_compact_line_per_set_of_runs():
    """A live run's device and KV geometry against two simulations' cost model and workload (the
    demo): one line each, nested groups as ``prefix.* (n)``, long values named only; a field the
    runs that record it disagree on is still a row."""
    live = _header(extra={"model_path": "/a/very/long/path/to/the/model/weights/SmolLM2-135M-Instruct",
                          "device": "cpu", "kv": {"num_layers": 30, "head_dim": 64}})
    sims = [_header(clock="sim", extra={"cost_model": m, "workload": {"source": "live.jsonl", "num_requests": 24}})
            for m in ("m.json", "n.json")]
    lines = render_header_differences(["live", "on", "off"], [live, *sims]).splitlines()
    assert lines[1:] == [
        "  clock: wall → sim → sim",
        "  extra.cost_model: – → m.json → n.json",
        "  only in live: extra.model_path, extra.device=cpu, extra.kv.* (2)",
        "  only in on, off: extra.workload.* (2)",
    ]
