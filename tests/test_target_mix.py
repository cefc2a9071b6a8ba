"""The demo target's models of different cost (``--models``): each served under its name, counted
per model as Triton counts, in arrival order on shared slots or with ``--priority`` models first."""

from __future__ import annotations

import asyncio

import pytest
import requests

from kneeswarm.target.metrics import TargetMetrics
from kneeswarm.target.mix import MixEngine, ModelCost, parse_models

BODY = {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}


def test_models_parse_and_bad_ones_are_refused():
    assert parse_models("cheap:5,slow:40:2") == [ModelCost("cheap", 5.0), ModelCost("slow", 40.0, 2)]
    for bad in ("cheap", "cheap:0", "a:5,a:6", "a:5:0", "a:x"):
        with pytest.raises(ValueError):
            parse_models(bad)


def _order(priority: tuple[str, ...]) -> list[str]:
    """The order in which queued requests of two models start on one shared slot: one request
    holds the slot while six more (alternating models) arrive behind it."""
    async def main() -> list[str]:
        engine = MixEngine(TargetMetrics({"mode": "knee"}, 1, 0), [ModelCost("a", 1.0), ModelCost("b", 1.0)], 1, priority)
        started: list[str] = []

        async def one(model: str) -> None:
            await engine.infer(model)
            started.append(model)

        first = asyncio.create_task(one("a"))
        await asyncio.sleep(0)  # it holds the slot
        rest = [asyncio.create_task(one(m)) for m in "babab" + "a"]
        await asyncio.gather(first, *rest)
        return started

    return asyncio.run(main())


def test_the_shared_slots_serve_in_arrival_order_and_priority_models_first():
    assert _order(()) == list("ababab" + "a")
    assert _order(("b",)) == list("a" + "bbb" + "aaa")


def test_each_model_is_served_under_its_name_and_counted_per_model(start_demo_target):
    t = start_demo_target("--mode", "knee", "--models", "cheap:2,slow:4:1", "--slots", "2")
    s = requests.Session()
    sent = {"cheap": 5, "slow": 3}
    for model, n in sent.items():
        for _ in range(n):
            r = s.post(f"{t.url}/v2/models/{model}/infer", json=BODY, timeout=10)
            assert r.status_code == 200 and r.json()["model_name"] == model
    assert s.post(f"{t.url}/v2/models/other/infer", json=BODY, timeout=10).status_code == 404
    m = t.metrics()
    for model, n in sent.items():
        assert m[f'nv_inference_request_success{{model="{model}",version="1"}}'] == n
        assert m[f'nv_inference_exec_count{{model="{model}",version="1"}}'] == n
