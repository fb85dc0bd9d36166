"""Backend URLs as users write them: the OpenAI `base_url` form (`.../v1`) and a mount prefix."""

from __future__ import annotations

import pytest
from gw_harness import run, running_fleet

from fleetwise.errors import SpecError
from fleetwise.gateway.config import BackendSpec, GatewayConfig
from fleetwise.spec.base import validate


@pytest.mark.parametrize(("url", "base"), [
    ("http://10.0.0.1:8000", "http://10.0.0.1:8000"),
    ("http://10.0.0.1:8000/", "http://10.0.0.1:8000"),
    ("http://10.0.0.1:8000/v1", "http://10.0.0.1:8000"),
    ("http://10.0.0.1:8000/v1/", "http://10.0.0.1:8000"),
    ("https://proxy.example/engine-a", "https://proxy.example/engine-a"),
    ("https://proxy.example/engine-a/v1", "https://proxy.example/engine-a"),
])
def test_an_openai_base_url_names_the_server_root_and_a_path_is_a_prefix(url: str, base: str) -> None:
    b = BackendSpec(url=url)
    assert b.url == base
    assert b.key == base.split("/")[2]


def test_a_backend_url_with_a_query_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as err:
        validate(GatewayConfig, {"backends": [{"url": "http://h:8000/v1?key=x"}]}, "gateway.yaml")
    msg = str(err.value)
    assert "backends.0.url" in msg and "'http://h:8000/v1?key=x' has a query or fragment" in msg
    assert "\n" not in msg


def test_requests_to_a_v1_backend_url_reach_v1_completions_once() -> None:
    async def scenario() -> None:
        async with running_fleet(1) as f:
            r = f.responders[0]
            f.gw.add_backend(BackendSpec(url=r.url + "/v1", name="b0"))
            await f.wait_for(lambda: f.gw.backends.live["b0"].scraped_at_s is not None)
            status, doc, _ = await f.post("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2})
            assert status == 200 and doc["choices"][0]["text"] == "t0 t1 "
            assert "/v1/completions" in r.paths and "/metrics" in r.paths
            assert not [p for p in r.paths if p.startswith("/v1/v1")]
    run(scenario)
