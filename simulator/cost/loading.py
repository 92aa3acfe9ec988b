"""A cost model by name: a model file, ``recorded:LOG``, or a model shipped in simulator/cost/cost_models."""

from __future__ import annotations

from pathlib import Path

from simulator.cost.cost_model import CostModel, CostModelError
from simulator.cost.linear_model import LinearCostModel
from simulator.cost.model_base import read_model_doc
from simulator.cost.recorded_model import RecordedCostModel
from simulator.cost.tree_model import TreeCostModel

SHIPPED = Path(__file__).parent / "cost_models"


def load_cost_model(spec: str | Path) -> CostModel:
    """A cost model from a JSON file, ``recorded:LOG``, or a name shipped in ``SHIPPED``."""
    spec = str(spec)
    if spec.startswith("recorded:"):
        return RecordedCostModel.from_log(spec.split(":", 1)[1])
    path = Path(spec)
    if not path.exists():
        shipped = SHIPPED / f"{spec.removesuffix('.json')}.json"
        if shipped.exists():
            path = shipped
        else:
            raise FileNotFoundError(f"{spec}: no such cost model (a JSON file, recorded:LOG, or one of "
                                    f"{', '.join(shipped_cost_models())})")
    doc = read_model_doc(path)
    kind = doc.get("kind")
    if kind == "linear":
        return LinearCostModel.from_doc(doc, path)
    if kind == "trees":
        return TreeCostModel.from_doc(doc, path)
    raise CostModelError(f"{path}: unknown cost-model kind {kind!r} (known: linear, trees)")


def shipped_cost_models() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.json"))
