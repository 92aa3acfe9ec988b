"""A tree ensemble's remembered predictions (per cell of split thresholds) are bit for bit the walk's."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost.trees import LEAF, Tree, TreeEnsemble


def random_tree(rng: random.Random, n_features: int, depth: int) -> Tree:
    feature, threshold, left, right, value = [], [], [], [], []

    def node(d: int) -> int:
        i = len(value)
        feature.append(0), threshold.append(0.0), left.append(LEAF), right.append(LEAF), value.append(rng.gauss(0, 1))
        if d < depth and rng.random() < 0.8:
            feature[i] = rng.randrange(n_features)
            threshold[i] = rng.choice([rng.uniform(-10, 10), float(rng.randrange(-10, 10)) + 0.5])
            left[i] = node(d + 1)
            right[i] = node(d + 1)
        return i

    node(0)
    return Tree(feature, threshold, left, right, value)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 6))
def test_remembered_predictions_are_the_walk(seed, n_features):
    rng = random.Random(seed)
    ensemble = TreeEnsemble([random_tree(rng, n_features, 4) for _ in range(rng.randrange(1, 30))],
                            base=rng.gauss(0, 1), scale=rng.uniform(0.01, 1))
    cuts = ensemble._thresholds(n_features)
    for _ in range(300):  # on, just off and far from every threshold, ints and floats
        x = []
        for f in range(n_features):
            near = rng.choice(cuts[f]) if cuts[f] and rng.random() < 0.7 else rng.uniform(-20, 20)
            x.append(rng.choice([near, near + 1e-12, near - 1e-12, round(near), near * 2]))
        one_by_one = ensemble.base + ensemble.scale * sum(t.predict_one(x) for t in ensemble.trees)
        assert ensemble.walk(x) == one_by_one  # (every tree a level at a time, in numpy)
        assert ensemble.predict_one(x) == one_by_one
        assert ensemble.predict_one(x) == one_by_one  # remembered


def test_the_memo_is_bounded():
    rng = random.Random(3)
    ensemble = TreeEnsemble([random_tree(rng, 2, 5) for _ in range(5)])
    ensemble.MAX_CELLS = 4
    for _ in range(50):
        x = [rng.uniform(-20, 20), rng.uniform(-20, 20)]
        assert ensemble.predict_one(x) == ensemble.walk(x)
        assert len(ensemble._cells) <= 4


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32))
def test_a_tree_models_step_time_is_the_walk(seed):
    """TreeCostModel names a decode-only step's cell by its span count, context sum and longest
    context alone, and adds its linear part's terms left to right."""
    from simulator.cost.features import EXT_FEATURES, ext_features
    from simulator.cost.tree_model import TreeCostModel
    from traces.decode_splits import DecodeSplits
    from traces.events import Span

    rng = random.Random(seed)
    n = len(EXT_FEATURES)
    trees = [random_tree(rng, n, 4) for _ in range(20)]
    context, longest = EXT_FEATURES.index("decode_context"), EXT_FEATURES.index("longest_program")
    for t in trees:  # thresholds where these features live
        t.threshold = [rng.uniform(0, 4000) if f == context else rng.uniform(0, 500) if f == longest
                       else rng.uniform(0, 40) for f in t.feature]
    model = TreeCostModel({"const": 1e-3, "decode_context": 1e-8, "seqs": 1e-6, "longest_program": 1e-7},
                          TreeEnsemble(trees))
    for i in range(400):
        if i == 200:  # the decode kernel split as on the H200 (the remembered cells start over)
            model = model.with_decode_splits(DecodeSplits(num_kv_heads=8, sms=132))
        spans = [Span(i, rng.randrange(4000 // 8), 1 if rng.random() < 0.9 else rng.randrange(2, 64), True)
                 for i in range(rng.randrange(1, 9))]
        x = ext_features(spans, model.decode_splits)
        linear = 0
        for c, v in zip(model._coef, x):  # Σ c·v left to right
            linear = linear + c * v
        expected = max(linear + model.ensemble.walk(x), model.floor)
        assert model.step_time(0, spans) == expected
        assert model.step_time(0, spans) == expected  # remembered


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, 12), count=st.integers(0, 80), splits=st.booleans(),
       overlap=st.booleans(), floor=st.booleans(), cut=st.floats(0.0, 1.2))
def test_a_run_of_decode_durations_is_step_time_step_by_step(seed, n, count, splits, overlap, floor, cut):
    """decode_durations (the simulator's runs of decode steps), the tree model's own loop and the
    linear model's (TimedModel's), gives each step's step_time bit for bit, and stops before the
    first step that ends at or after ``due``."""
    from simulator.cost.features import EXT_FEATURES
    from simulator.cost.host_timing import HostTiming
    from simulator.cost.linear_model import LinearCostModel
    from simulator.cost.tree_model import TreeCostModel
    from traces.decode_splits import DecodeSplits
    from traces.events import Span

    rng = random.Random(seed)
    coefficients = {"const": 1e-3, "decode_context": 1e-8, "seqs": 1e-6, "longest_program": 1e-7}
    trees = [random_tree(rng, len(EXT_FEATURES), 4) for _ in range(10)]
    for t in trees:
        t.threshold = [rng.uniform(0, 3000) for _ in t.feature]
    for model in (TreeCostModel(coefficients, TreeEnsemble(trees), floor=2e-3 if floor else 0.0),
                  LinearCostModel(coefficients)):
        model = model.with_decode_splits(DecodeSplits(8, 132) if splits else None)
        model = model.with_host(HostTiming(overlap=True, gap_const=1.5e-3, gap_per_seq=1e-5, launch=1e-4)
                                if overlap else None)
        starts = [rng.randrange(0, 2000) for _ in range(n)]
        steps = [model.step_time(0, [Span(r, s + i, 1, True) for r, s in enumerate(starts)]) for i in range(count)]
        context, longest = sum(starts) + n, max(starts) + 1
        assert model.decode_durations(n, context, longest, 5.0, count, float("inf")) == steps
        due = 5.0 + cut * sum(steps)
        ends = [5.0]
        for t in steps:
            ends.append(ends[-1] + t)
        kept = next((i for i, e in enumerate(ends[1:]) if e >= due), count)
        assert model.decode_durations(n, context, longest, 5.0, count, due) == steps[:kept]


def test_a_tree_file_from_before_a_feature_was_added_loads_by_feature_name(tmp_path):
    """Files name their features; one saved before ``longest_program`` existed (``tokens`` was
    index 7 then) still splits on ``tokens``."""
    import json

    from simulator.cost.features import EXT_FEATURES
    from simulator.cost.loading import load_cost_model
    from simulator.cost.tree_model import TreeCostModel
    from traces.events import Span

    before = [f for f in EXT_FEATURES if f != "longest_program"]
    tokens_then = before.index("tokens")
    assert tokens_then != EXT_FEATURES.index("tokens")
    tree = Tree([tokens_then, -2, -2], [100.0, -2.0, -2.0], [1, LEAF, LEAF], [2, LEAF, LEAF], [0.0, 1e-3, 2e-3])
    doc = TreeCostModel({"const": 1e-3}, TreeEnsemble([tree])).to_dict()
    doc["tree_features"], doc["coefficients"] = before, {"const": 1e-3}
    (tmp_path / "old.json").write_text(json.dumps(doc))
    m = load_cost_model(str(tmp_path / "old.json"))
    assert m.step_time(0, [Span(0, 0, 50, True)]) == 1e-3 + 1e-3
    assert m.step_time(0, [Span(0, 0, 500, True)]) == 1e-3 + 2e-3
    assert m.step_time(0, [Span(0, 9000, 1, True)]) == 1e-3 + 1e-3  # a long context is not 9,001 tokens
