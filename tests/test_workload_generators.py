"""Synthetic workloads: seeded, right rate and burstiness, length distributions, spec parsing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.sim_helpers import DATA
from traces.generators import LengthDist, arrival_times, generate
from traces.prompt import materialize
from traces.workload import WorkloadError


def test_generate_is_deterministic_per_seed():
    a = generate(50, rate=3.0, cv=2.0, seed=1)
    b = generate(50, rate=3.0, cv=2.0, seed=1)
    c = generate(50, rate=3.0, cv=2.0, seed=2)
    assert a.requests == b.requests and a.requests != c.requests


@pytest.mark.parametrize("cv", [0.0, 0.5, 1.0, 3.0])
def test_arrival_rate_and_burstiness(cv):
    t = arrival_times(20_000, rate=10.0, cv=cv, rng=np.random.default_rng(0))
    gaps = np.diff(t)
    assert t[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.1 * max(cv, 1))


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert (LengthDist.parse("fixed:7").sample(rng, 10) == 7).all()
    u = LengthDist.parse("uniform:3:5").sample(rng, 1000)
    assert set(u.tolist()) == {3, 4, 5}
    ln = LengthDist.parse("lognormal:200:0.5").sample(rng, 20_000)
    assert ln.mean() == pytest.approx(200, rel=0.05) and ln.std() / ln.mean() == pytest.approx(0.5, rel=0.1)
    assert LengthDist.parse("lognormal:200:2:300").sample(rng, 1000).max() <= 300
    tr = LengthDist.parse(f"trace:{DATA / 'azure_conv_head200.csv'}:output")
    assert len(tr.values) == 200 and set(tr.sample(rng, 100).tolist()) <= set(tr.values)


@pytest.mark.parametrize("spec", ["fixed", "fixed:0", "uniform:5:3", "lognormal:-1:1", "gauss:3", "uniform:a:b",
                                  "trace:x"])
def test_bad_length_specs_name_the_spec(spec):
    with pytest.raises(WorkloadError, match="length spec"):
        LengthDist.parse(spec)


def test_shared_prefix_is_token_identical():
    wl = generate(20, rate=1.0, input_len="uniform:100:200", shared_prefix=64, seed=3)
    heads = {tuple(materialize(r.prompt)[:64].tolist()) for r in wl}
    tails = {tuple(materialize(r.prompt)[64:80].tolist()) for r in wl}
    assert len(heads) == 1 and len(tails) == 20


def test_bad_generator_arguments():
    with pytest.raises(WorkloadError, match="rate"):
        generate(3, rate=0)
    with pytest.raises(WorkloadError, match="cv"):
        generate(3, rate=1, cv=-1)
