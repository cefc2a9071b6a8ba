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


def _served(m: dict[str, float], name: str, model: str) -> float:
    """The sum of a counter's samples labelled with ``model`` (as its server labels it: model or model_name)."""
    return sum(v for k, v in m.items() if k.startswith(name + "{") and (f'model_name="{model}"' in k or f'model="{model}"' in k))


#: protocol: (path of a model's request, body, per-model counter, the server's 404 body for model "other")
PROTOCOLS = {
    "torchserve": ("/predictions/{m}", {"data": [[1.0, 2.0]]}, "ts_inference_requests_total",
                   {"code": 404, "type": "ModelNotFoundException", "message": "Model not found: other"}),
    "tfserving": ("/v1/models/{m}:predict", {"instances": [[1.0, 2.0]]}, ":tensorflow:serving:request_count",
                  {"error": "Servable not found for request: Latest(other)"}),
    "openai": ("/v1/completions", {"prompt": "a b c", "max_tokens": 2}, "vllm:request_success_total",
               {"object": "error", "message": "The model `other` does not exist.", "type": "NotFoundError", "code": 404}),
    "openai-chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}], "max_tokens": 2,
                                             "stream": True}, "vllm:request_success_total", None),
}


def test_every_endpoint_serves_each_model_at_its_cost_counts_it_per_model_and_refuses_an_unknown_one(start_demo_target):
    """--models on TorchServe's, TF Serving's and OpenAI's endpoints as on KServe's: each request is
    its model's (its pool's run counted by Triton's exec count, whatever the protocol), counted by
    the per-model counter that server exports, and an unknown model is that server's own 404."""
    t = start_demo_target("--mode", "knee", "--models", "cheap:2,slow:4:1", "--slots", "2")
    s = requests.Session()
    sent = {"cheap": 4, "slow": 2}
    before = t.metrics()
    for protocol, (path, body, counter, missing) in PROTOCOLS.items():
        for model, n in sent.items():
            for _ in range(n):
                doc = {**body, "model": model} if protocol.startswith("openai") else body
                r = s.post(t.url + path.format(m=model), json=doc, timeout=10)
                assert r.status_code == 200, (protocol, model, r.text)
                if protocol == "openai":
                    assert r.json()["model"] == model
        after = t.metrics()
        for model, n in sent.items():
            assert _served(after, counter, model) - _served(before, counter, model) == n, (protocol, model)
            ran = f'nv_inference_exec_count{{model="{model}",version="1"}}'
            assert after[ran] - before.get(ran, 0.0) == n, (protocol, model)  # its model's slot, its service time
        before = after
        doc = {**body, "model": "other"} if protocol.startswith("openai") else body
        r = s.post(t.url + path.format(m="other"), json=doc, timeout=10)
        assert r.status_code == 404 and (missing is None or r.json() == missing), (protocol, r.text)
    listed = s.get(t.url + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in listed] == ["cheap", "slow"]
    for model in ("cheap", "slow"):
        status = s.get(f"{t.url}/v1/models/{model}", timeout=10).json()["model_version_status"]
        assert status[0]["state"] == "AVAILABLE"
    assert s.get(f"{t.url}/v1/models/other", timeout=10).status_code == 404


def test_models_with_the_engine_model_is_refused_in_one_line(capsys):
    from kneeswarm.target.server import main

    with pytest.raises(SystemExit) as e:
        main(["--mode", "knee", "--models", "cheap:2,slow:4", "--kv-tokens", "64"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--kv-tokens" in err, err
