"""An adapter set larger than the server keeps loaded, run for real: `kneeswarm run` (a Locust master
and worker in their own processes) against the demo target serving four LoRA adapters
(``--adapters a,b,c,d``) with two slots (``--max-loras 2``: swapped in and out) and with four (all
kept loaded), side by side.

The truth is the target's own: how it was built (its max-loras), its count of swaps and of each
adapter's requests (``kneeswarm_target_lora_swaps_total``, ``kneeswarm_target_lora_requests_total``).
Each run is judged twice: as recorded (the server's ``vllm:lora_requests_info`` scraped), and again
with the scrape removed (the client's rows alone)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import Target, read_summary, runs_against_targets
from kneeswarm.analysis import analyze
from kneeswarm.contracts.rundir import RunDir

ADAPTERS = "abcd"
# requests of 48 ms (20 + 7 x 4), a swap 40: long enough against the generator's own time per request
# that two runs side by side on a loaded 2-CPU host still hold their users busy (Little's law)
TARGET = ["--mode", "knee", "--model-name", "base", "--adapters", ",".join(ADAPTERS), "--swap-ms", "40",
          "--ttft-ms", "20", "--itl-ms", "4"]
FLAGS = {"two": [*TARGET, "--max-loras", "2"], "four": [*TARGET, "--max-loras", "4"]}


def plan(name: str, url: str, steps: str, hold: float) -> str:
    classes = "".join(f'[[request.classes]]\nname = "{a}"\nmodel = "{a}"\nweight = 1\n' for a in ADAPTERS)
    return (f'name = "{name}"\ntarget = "{url}"\nprotocol = "openai"\nmetrics_url = "{url}/metrics"\n'
            f"[load]\nsteps = {steps}\nramp = 0.5\nhold = {hold}\nsettle = 0.5\nworkers = 1\n"
            '[request]\nmodel = "base"\nprompt_tokens = 8\nmax_tokens = 8\nignore_eos = true\n'
            f"{classes}[analysis]\nmin_requests = 50\n")


def over(summary: dict) -> tuple[list[dict], list[dict]]:
    """(confirmed, marginal) adapters_over_capacity findings."""
    return ([f for f in summary.get("findings") or [] if f["id"] == "adapters_over_capacity"],
            [f for f in summary.get("findings_marginal") or [] if f["id"] == "adapters_over_capacity"])


def client_only(run_dir: Path, tmp: Path) -> dict:
    """The run analysed again without the server's scrape: the client's rows alone."""
    copy = tmp / (run_dir.name + "-client")
    shutil.copytree(run_dir, copy)
    for f in (copy / "hosts" / "target").rglob("prometheus*"):
        f.unlink()
    analyze(copy)
    return read_summary(copy)


def check(done: dict[str, tuple[Path, Target]], tmp: Path, users: int, misses_within: float) -> dict[str, dict]:
    out = {}
    for name, (run_dir, target) in done.items():
        got = target.metrics()
        swaps = sum(got[f'kneeswarm_target_lora_swaps_total{{adapter="{a}"}}'] for a in ADAPTERS)
        served = {a: got[f'kneeswarm_target_lora_requests_total{{adapter="{a}"}}'] for a in ADAPTERS}
        rows = RunDir(run_dir).read_requests()
        recorded = {a: int(rows.loc[rows["class"] == a, "ok"].sum()) for a in ADAPTERS}
        # every answered request is the target's; those in flight when the load stopped were served, never
        # recorded: at most one per user of the last step
        assert all(0 <= served[a] - recorded[a] for a in ADAPTERS) and sum(served.values()) - sum(recorded.values()) <= users
        out[name] = {"summary": read_summary(run_dir), "client": client_only(run_dir, tmp), "swaps": swaps,
                     "served": served}
    (tmp / "figures.json").write_text(json.dumps({n: {"swaps": o["swaps"], "served": o["served"]} for n, o in out.items()}))
    two, four = out["two"], out.get("four")
    assert two["swaps"] > 4 * 10  # two slots: swapped again and again
    if four is not None:
        assert four["swaps"] == 4  # four slots: each adapter loaded once, never swapped
    for how in ("summary", "client"):
        (f,), _ = over(two[how])  # confirmed, from the gauge and from the client alone
        assert f["support"] >= 0.95, (how, f)
        ev = f["evidence"]
        assert ev["adapters"] == 4
        if how == "summary":
            assert ev["max_lora"] == 2  # the server's own gauge says what it was started with
        # the client's replay of its requests through an LRU of that many slots: the target's swaps (exact
        # while no request waits; where they wait, a slot freed goes to a waiter at once, and an adapter whose
        # request the client still saw in flight may be out already: the replay counts fewer)
        assert abs(ev["misses"] - two["swaps"]) <= misses_within * two["swaps"], (how, ev["misses"], two["swaps"])
        if four is not None:
            confirmed, marginal = over(four[how])
            assert confirmed == [] and all(not m.get("at_point") and m["support"] < 0.5 for m in marginal), (how, marginal)
    assert over(two["client"])[0][0]["evidence"]["loaded_estimate"] == 2  # the client's estimate of the slots
    return out


def test_four_adapters_on_two_slots_are_over_capacity(tmp_path):
    """One run, one step of 2 users (never more in flight than slots: no request waits), kept short
    for `make test`; the four slots that must stay silent are the sweep's."""
    with runs_against_targets(tmp_path, {"two": FLAGS["two"]}, lambda n, url: plan(n, url, "[2]", 4.0)) as done:
        check(done, tmp_path, 2, 0.05)


@pytest.mark.long
def test_four_adapters_on_two_slots_are_over_capacity_and_on_four_are_not(tmp_path):
    """The same step side by side with four slots (each adapter loaded once): not found there."""
    with runs_against_targets(tmp_path, FLAGS, lambda n, url: plan(n, url, "[2]", 5.0)) as done:
        check(done, tmp_path, 2, 0.05)


@pytest.mark.long
def test_four_adapters_on_two_slots_over_a_sweep_every_adapter_slower(tmp_path):
    """1-8 users: on two slots every class's mean latency (numpy on its answered rows) is above the
    same class's on four slots at every step (every adapter slower), and the finding holds from the
    first step; each class's server req/s, from the target's count of its adapter, is its QPS."""
    with runs_against_targets(tmp_path, FLAGS, lambda n, url: plan(n, url, "[1, 2, 4, 8]", 6.0)) as done:
        out = check(done, tmp_path, 8, 0.20)
        means = {}
        for name, (run_dir, _t) in done.items():
            rows = RunDir(run_dir).read_requests()
            good = rows.loc[rows["ok"].fillna(False).astype(bool) & (rows["step"] >= 0)]
            means[name] = {(int(u), str(c)): float(np.mean(g["latency_ms"])) for (u, c), g in good.groupby(["users", "class"])}
    assert set(means["two"]) == set(means["four"]) and len(means["two"]) == 16
    slower = {k: (means["two"][k], means["four"][k]) for k in means["two"] if means["two"][k] <= means["four"][k]}
    assert not slower, slower
    (f,), _ = over(out["two"]["summary"])
    assert f["steps"][0] == 1
    for name in ("two", "four"):  # the server's own per-model count (vllm:request_success_total{model_name}) per class
        for c in out[name]["summary"]["mix"]["classes"]:
            rated = [s for s in c["steps"] if s.get("server_rps") is not None]  # none where a step's window began
            assert len(rated) >= 3, (name, c["name"])  # before the first scrape (the scraper starts with the load)
            for s in rated:
                assert s["server_rps"] == pytest.approx(s["qps"], rel=0.10), (name, c["name"], s["users"])
