"""``serve --api-server-count auto`` (the default): a front end per 4 cores, 1 to 4, and 1 where
front ends cannot share the engine (runtime/serving/server/front_ends.py, runtime/cli/serve.py)."""

from __future__ import annotations

import pytest

from runtime.cli import build_parser
from runtime.cli.serve import resolve_api_server_count
from runtime.serving.server.front_ends import auto_count, machine_cores
from runtime.serving.server.intake import worker_count


@pytest.mark.parametrize(("cores", "count"), [(1, 1), (2, 1), (4, 1), (7, 1), (8, 2), (12, 3), (16, 4), (192, 4)])
def test_auto_is_a_front_end_per_four_cores_from_one_to_four(cores, count):
    assert auto_count(cores) == count


def _args(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_auto_is_the_default_and_follows_the_cores():
    args = _args()
    assert args.api_server_count == "auto"
    assert resolve_api_server_count(args, cores=2) == 1  # a small machine keeps the one process
    assert resolve_api_server_count(args, cores=16) == 4
    assert resolve_api_server_count(_args("--api-server-count", "auto"), cores=32) == 4


@pytest.mark.parametrize("flags", [["--no-engine-process"], ["--data-parallel-size", "2"]])
def test_auto_is_one_where_front_ends_cannot_share_the_engine(flags):
    assert resolve_api_server_count(_args(*flags), cores=64) == 1


def test_a_count_given_is_kept():
    assert resolve_api_server_count(_args("--api-server-count", "3"), cores=2) == 3


def test_intake_workers_share_half_the_cores_between_the_front_ends():
    assert [worker_count(c, 1) for c in (1, 2, 4, 8, 64)] == [1, 1, 2, 4, 4]
    assert worker_count(16, 4) == 2 and worker_count(8, 4) == 1


def test_this_machine_counts_its_cores():
    assert machine_cores() >= 1
