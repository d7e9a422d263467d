"""``eta._Model._room`` (a bisection over running sums) answers what a walk over the unit's holdings does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.eta import Estimate, _Model
from scheduling.core.plan import plan
from scheduling.core.types import Tier
from tests.property.strategies import NOW, snapshots


def _walk(model: _Model, unit: str, gpu_type: str, need: int, cap: int, tier: int) -> Estimate | None:
    """The reference: the holdings by end time, given back one by one until the job fits under the cap."""
    holdings = [h for h in model.holdings((unit, gpu_type)) if h.tier <= tier]
    held = sum(h.gpus for h in holdings)
    if held + need <= cap:
        return Estimate(model.now, None)
    for h in holdings:
        held -= h.gpus
        if held + need <= cap:
            return Estimate(max(h.end, model.now), h.job_id)
    return None


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.data())
def test_room_is_the_walk_over_holdings(snap, data):
    model = _Model(snap, plan(snap, now=NOW), NOW)
    keys = model.unit_keys() or [("none", "H100")]
    for _ in range(10):
        unit, gpu_type = data.draw(st.sampled_from(keys))
        need = data.draw(st.integers(0, 40))
        cap = data.draw(st.integers(0, 80))
        tier = data.draw(st.sampled_from([Tier.PRODUCTION, Tier.RESEARCH, Tier.SPOT]))
        assert model._room(unit, gpu_type, need, cap, tier) == _walk(model, unit, gpu_type, need, cap, tier)
