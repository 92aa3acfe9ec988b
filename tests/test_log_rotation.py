"""``LogWriter(path, if_exists=...)``: a restarted server never loses the log it recorded before."""

from __future__ import annotations

import pytest

from traces.events import Header, Preempted
from traces.formats import detect_format
from traces.log import IF_EXISTS, LogWriter, read_log
from traces.log_files import rotation_path, split_name


def write(path, n: int, **kw) -> LogWriter:
    with LogWriter(path, **kw) as w:
        w(Header(clock="wall", seed=n))
        w(Preempted(time=0.0, step=n, request_id=n))
    return w


def seeds(path) -> int:
    return next(iter(read_log(path))).seed


def test_the_allowed_values_are_exported():
    assert IF_EXISTS == ("rotate", "error", "overwrite")
    with pytest.raises(ValueError, match="rotate, error, overwrite"):
        LogWriter("x.jsonl", if_exists="append")


@pytest.mark.parametrize("name", ["live.jsonl", "live.jsonl.gz"])
def test_rotate_keeps_every_earlier_log_in_order_under_a_readable_name(tmp_path, name):
    path = tmp_path / name
    assert write(path, 0, if_exists="rotate").rotated_to is None  # nothing there yet
    for n in range(1, 4):
        w = write(path, n, if_exists="rotate")
        assert w.rotated_to == rotation_path(path, n)
    stem, suffix = split_name(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name] + [f"{stem}.{n}{suffix}" for n in (1, 2, 3)])
    assert [seeds(rotation_path(path, n)) for n in (1, 2, 3)] == [0, 1, 2] and seeds(path) == 3
    assert detect_format(rotation_path(path, 2)) == "log"  # .jsonl(.gz) kept: still recognised (and gunzipped)


def test_rotate_never_overwrites_an_older_rotation(tmp_path):
    path = tmp_path / "live.jsonl"
    write(path, 0)
    write(rotation_path(path, 1), 10)
    write(rotation_path(path, 4), 40)  # a gap (one was deleted): numbering continues past the highest
    w = write(path, 1, if_exists="rotate")
    assert w.rotated_to == rotation_path(path, 5)
    assert [seeds(rotation_path(path, n)) for n in (1, 4, 5)] == [10, 40, 0] and seeds(path) == 1


def test_error_refuses_with_the_path_and_leaves_the_log_alone(tmp_path):
    path = tmp_path / "live.jsonl"
    write(path, 7)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="a log is already there") as e:
        LogWriter(path, if_exists="error")
    assert e.value.filename == str(path) and str(path) in str(e.value)
    assert path.read_bytes() == before
    write(tmp_path / "new.jsonl", 1, if_exists="error")  # no file: fine


def test_overwrite_is_the_default(tmp_path):
    path = tmp_path / "out.jsonl"
    write(path, 1)
    write(path, 2)
    assert seeds(path) == 2 and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("if_exists", IF_EXISTS)
def test_a_device_is_not_a_log(if_exists):
    write("/dev/null", 0, if_exists=if_exists)  # benchmarks write there: never renamed, never refused


@pytest.mark.parametrize(("name", "stem", "suffix"), [
    ("live.jsonl", "live", ".jsonl"), ("live.jsonl.gz", "live", ".jsonl.gz"), ("run.v2.jsonl", "run.v2", ".jsonl"),
    ("trace", "trace", ""), ("x.gz", "x", ".gz"), (".jsonl", ".jsonl", ""),
])
def test_rotation_names_keep_the_format_suffix(tmp_path, name, stem, suffix):
    assert split_name(tmp_path / name) == (stem, suffix)
    assert rotation_path(tmp_path / name, 3).name == f"{stem}.3{suffix}"
