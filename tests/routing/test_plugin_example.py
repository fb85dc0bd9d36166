"""The scorer example of docs/policies/plugins.md, run as written there: declared, attached,
weighted in a policy; called once per decision over every candidate; its scores reach the
decision and move the choice."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetwise.core.views import FleetView, RouteRequest, WorkerView
from fleetwise.routing import make_policy
from fleetwise.routing.plugins import SCORERS
from fleetwise.routing.vector import Columns
from fleetwise.spec.routing import RoutingSpec
from fleetwise.spec.routing_plugins import ROUTING_PLUGINS

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies" / "plugins.md"


def example_source() -> str:
    """The one Python block of the page."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1
    return blocks[0]


@pytest.fixture
def queued() -> Iterator[list[Columns]]:
    """The example attached under `queued` for the test (declared first, as step 1 says), every
    call's columns recorded; the registry is left as it was."""
    ROUTING_PLUGINS.declare("scorer", "queued", "(min queued + 1) / (queued + 1): fewest requests waiting.")
    calls: list[Columns] = []
    try:
        namespace: dict[str, Any] = {}
        exec(compile(example_source(), str(DOC), "exec"), namespace)  # attaches the implementation
        fn = SCORERS["queued"]
        assert fn is namespace["score_queued"]

        def recorded(req: RouteRequest, c: Columns) -> list[float]:
            calls.append(c)
            return fn(req, c)

        SCORERS["queued"] = recorded
        yield calls
    finally:
        ROUTING_PLUGINS._impl["scorer"].pop("queued", None)
        ROUTING_PLUGINS._declared["scorer"].pop("queued", None)


def test_the_documented_scorer_scores_every_candidate_in_one_call(queued: list[Columns]) -> None:
    spec = RoutingSpec(policy="fleetwise-default", params={"scorers": {"load": 1.0, "queued": 0.5},
                                                           "load_bound": {"enabled": False}})
    policy = make_policy(spec, seed=1)
    # equal loads: the emptiest queue wins by the queued scorer alone
    fleet = FleetView(1.0, tuple(WorkerView(f"w{i}", queued_requests=q, running_requests=4 - q,
                                            queued_prefill_tokens=0, running_decode_tokens=0, reported_at_s=1.0)
                                 for i, q in enumerate([3, 1, 0, 2])))
    d = policy.route(RouteRequest("r0", 100, 10), fleet)
    assert len(queued) == 1 and queued[0].kept == [0, 1, 2, 3]  # one call, every candidate
    assert d.worker == "w2"
    assert {k: d.scores[k] for k in ("w0.queued", "w1.queued", "w2.queued", "w3.queued")} == {
        "w0.queued": 0.25, "w1.queued": 0.5, "w2.queued": 1.0, "w3.queued": round(1 / 3, 6)}
    for i in range(1, 6):
        policy.route(RouteRequest(f"r{i}", 100, 10), fleet)
    assert len(queued) == 6


def test_an_undeclared_scorer_is_refused_with_the_closest_name() -> None:
    with pytest.raises(ValueError, match="unknown scorer 'queud'"):
        RoutingSpec(policy="fleetwise-default", params={"scorers": {"queud": 1.0}}).resolved()
