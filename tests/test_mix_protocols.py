"""A traffic mix on every HTTP protocol of the demo target, run for real: `kneeswarm run` (a Locust
master and worker in their own processes) against `kneeswarm target --models cheap:5,slow:40`,
one run per protocol side by side, each against its own target (make test-long), and one short
OpenAI run (make test: ~14 s here).

The truth is each target's own per-model counter, the one the server that protocol imitates
exports (TorchServe's ``ts_inference_requests_total{model_name}``, TF Serving's
``:tensorflow:serving:request_count{model_name}``, vLLM's ``vllm:request_success_total{model_name}``)
and Triton's execution count of the model's own slots (``nv_inference_exec_count{model}``, any
protocol): each class's answered rows equal them but for the requests in flight when the load
stopped (served, never recorded: at most one per user of the last step) and the preflight's probes."""

from __future__ import annotations

import pytest

from conftest import mix_plan, read_summary, runs_against_targets, Target
from kneeswarm.contracts.rundir import RunDir

LAST_USERS = 4
#: protocol: ([request] keys, the per-model counter, inference probes each class's preflight sends)
CASES = {
    "openai": ('prompt_tokens = 8\nmax_tokens = 4\n', "vllm:request_success_total", 0),
    "torchserve": ('shape = [1, 4]\n', "ts_inference_requests_total", 1),
    "tfserving": ('shape = [1, 4]\n', ":tensorflow:serving:request_count", 0),
}


def plan(protocol: str, url: str, steps: str = f"[1, {LAST_USERS}]", hold: float = 4.0) -> str:
    return mix_plan(f"{protocol}-mix", url, steps, hold, (3, 1), protocol, CASES[protocol][0])


def served(t: Target, counter: str, model: str) -> float:
    return sum(v for k, v in t.metrics().items() if k.startswith(counter + "{") and f'model_name="{model}"' in k)


def test_a_short_openai_mix_each_class_is_its_model_s_count_on_the_target(tmp_path):
    """The fast one (make test): one short run of streamed OpenAI requests, 4 users."""
    flags = {"openai": ["--mode", "knee", "--models", "cheap:5,slow:40", "--slots", "4"]}
    with runs_against_targets(tmp_path, flags, lambda p, url: plan(p, url, f"[{LAST_USERS}]", 2.0)) as done:
        run_dir, target = done["openai"]
        rows = RunDir(run_dir).read_requests()
        for model in ("cheap", "slow"):
            ok = int(rows.loc[rows["class"] == model, "ok"].sum())
            count = served(target, "vllm:request_success_total", model)
            assert ok > 0 and 0 <= count - ok <= LAST_USERS, (model, ok, count)


@pytest.mark.long
def test_a_mix_on_every_protocol_each_class_is_its_model_s_count_on_the_target(tmp_path):
    flags = {protocol: ["--mode", "knee", "--models", "cheap:5,slow:40", "--slots", "4"] for protocol in CASES}
    figures = {}
    with runs_against_targets(tmp_path, flags, plan) as done:
        for protocol, (run_dir, target) in done.items():
            rows = RunDir(run_dir).read_requests()
            assert rows["class"].notna().all() and (rows["name"] == "infer").all()  # the row's name: no class in it
            counter, probes = CASES[protocol][1], CASES[protocol][2]
            for model in ("cheap", "slow"):
                ok = int(rows.loc[rows["class"] == model, "ok"].sum())
                count = served(target, counter, model)
                ran = target.metrics()[f'nv_inference_exec_count{{model="{model}",version="1"}}']
                figures[(protocol, model)] = (ok, count, ran)
                assert ok > 0 and 0 <= count - probes - ok <= LAST_USERS, (protocol, model, ok, count)
                # the model's own slots ran each one (a run begun when the load stopped may not have been counted as served)
                assert 0 <= ran - count <= LAST_USERS, (protocol, model, ran, count)
            if protocol != "tfserving":  # the analysis reads vLLM's and TorchServe's per-model counters (classes.py)
                for c in read_summary(run_dir)["mix"]["classes"]:
                    rates = [(st["users"], st["qps"], st.get("server_rps")) for st in c["steps"]]
                    print(protocol, c["name"], "users, QPS, server req/s:", rates)
                    assert all(r is not None for _u, _q, r in rates), (protocol, c["name"], rates)
    for (protocol, model), (ok, count, ran) in sorted(figures.items()):
        print(f"{protocol:10s} {model:5s} rows ok {ok:5d}  target's {CASES[protocol][1]} {count:6.0f}")
