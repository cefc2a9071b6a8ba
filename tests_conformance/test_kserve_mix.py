"""A traffic mix against KServe's Python model server: two models of different cost in one server,
driven by a real `kneeswarm run` with ``[[request.classes]]`` (one class per model, weighted 3:1)
and checked against the server's own record of each model's requests.

The server: kserve_model.py serving two models of the existing model's kind (SLOTS requests at
once, each BUSY_MS of the event loop's CPU and then WAIT_MS without it): `cheap` (~10 ms) and
`slow` (~50 ms), with slots enough that the steps here (at most max(STEPS) users) never queue.

Its own record, per model:
- one trace line per request, its path naming the model
  ("kserve.trace kserve.io.v2.models.slow.infer: 0.0513 ['http_status:200', ..., 'time:wall']"),
  stamped by this test as it arrives;
- /metrics: ``request_predict_seconds{model_name}``, a histogram of each request's predict time
  (its count: the model's requests; its buckets: where its predict times lie), scraped by this
  test before and after the run, and by the run itself into hosts/target/prometheus.csv.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import (
    FIGURES, assert_every_step_valid, class_counts, kneeswarm_run, plan_text, read_summary,
    rows_and_steps, Run, scrape)
from servers import Installed, Server, free_port, kserve

SERVER_INSTALL = kserve  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

SLOTS = 8  # per model: above max(STEPS), so no request waits for a slot
# class (= its model) -> (weight, BUSY_MS, WAIT_MS)
MODELS = {"cheap": (3, 1.0, 9.0), "slow": (1, 2.0, 48.0)}
STEPS = (1, 2, 4)
HOLD_S = 8.0
SHARE_ABS = 0.03  # each class's share of the rows within 3 points of its weight's
RATE_REL = 0.10  # each class's server req/s within 10 % of its QPS
COUNT = "request_predict_seconds_count"
BUCKET = "request_predict_seconds_bucket"

# "kserve.trace kserve.io.v2.models.<model>.infer: <seconds> ['http_status:200', ..., 'time:wall']"
WALL_LINE = re.compile(r"kserve\.trace kserve\.io\.v2\.models\.(\w+)\.infer: ([\d.]+) \['http_status:200'.*'time:wall'\]")


@dataclass
class MixRun:
    installed: Installed
    run: Run
    log: list[tuple[float, str]]
    before: dict[str, float]
    after: dict[str, float]

    def served(self, model: str) -> list[tuple[float, float]]:
        """[(when its trace line arrived, the server's wall time in ms)] per answered request of MODEL."""
        return [(t, float(m[2]) * 1000.0) for t, line in self.log
                if (m := WALL_LINE.search(line)) is not None and m[1] == model]

    def counted(self, model: str) -> float:
        """The server's predict count of MODEL over the run (its /metrics after less before)."""
        key = f'{COUNT}{{model_name="{model}"}}'
        return self.after.get(key, 0.0) - self.before.get(key, 0.0)


def weight_share(name: str) -> float:
    return MODELS[name][0] / sum(w for w, _, _ in MODELS.values())


@pytest.fixture(scope="module")
def mix(tmp_path_factory) -> MixRun:
    ks = kserve()
    out = tmp_path_factory.mktemp("kserve-mix")
    port = free_port()
    models = [arg for name, (_w, busy, wait) in MODELS.items() for arg in ("--model", f"{name}:{SLOTS}:{busy}:{wait}")]
    server = Server([str(ks.paths["python"]), str(Path(__file__).with_name("kserve_model.py")), "--http_port", str(port),
                     "--grpc_port", str(free_port()), *models, "--enable_latency_logging", "true"],
                    f"http://127.0.0.1:{port}", "/v2/health/ready")
    classes = "".join(f'[[request.classes]]\nname = "{name}"\nmodel = "{name}"\nweight = {w}\n'
                      for name, (w, _b, _wt) in MODELS.items())
    plan = plan_text("kserve-mix", server.url, "kserve", f"{server.url}/metrics", STEPS, HOLD_S,
                     f"shape = [1, 8]\n{classes}")
    try:
        before = scrape(server.url + "/metrics")
        run = kneeswarm_run(plan, out, "--pid", str(server.pid))
        time.sleep(1.0)  # the last answers' trace lines
        after = scrape(server.url + "/metrics")
    finally:
        server.stop()
    return MixRun(ks, run, list(server.lines), before, after)


def test_every_step_valid_and_no_errors(mix):
    rows, _ = rows_and_steps(mix.run.run_dir)
    assert_every_step_valid(mix.run.run_dir, rows)
    assert set(rows["class"]) == set(MODELS), rows["class"].value_counts()


def test_each_class_count_is_the_servers_count_of_its_model(mix):
    rows, steps = rows_and_steps(mix.run.run_dir)
    unrecorded = 0
    for name in MODELS:
        served = mix.served(name)
        # the server's two records of the model agree: a trace line per request, its predict count
        assert len(served) == mix.counted(name), (name, len(served), mix.counted(name))
        # per step, by when each request ended: the class's rows against the model's trace lines
        unrecorded += class_counts(name, rows, steps, [t for t, _ in served], f"kserve mix {name}",
                                   f"KServe Python model server, two models: class {name}", mix.installed.version,
                                   "kserve (v2)")
    # requests in flight when the load stopped were served but never recorded: at most one per user
    assert 0 <= unrecorded <= max(STEPS), unrecorded


def test_each_class_share_is_its_weights(mix):
    rows, _ = rows_and_steps(mix.run.run_dir)
    s = read_summary(mix.run.run_dir)
    shares = {name: float((rows["class"] == name).mean()) for name in MODELS}
    served = {name: len(mix.served(name)) for name in MODELS}
    server_shares = {name: n / sum(served.values()) for name, n in served.items()}
    print(f"rows {len(rows)}; shares client {shares}, server {server_shares}")
    for name in MODELS:
        assert abs(shares[name] - weight_share(name)) <= SHARE_ABS, (name, shares, len(rows))
        assert abs(server_shares[name] - weight_share(name)) <= SHARE_ABS, (name, server_shares, served)
    assert {c["name"]: c["weight_share"] for c in s["mix"]["classes"]} == pytest.approx(
        {n: weight_share(n) for n in MODELS}, rel=1e-12)


def scraped(mix: MixRun) -> pd.DataFrame:
    """The run's own scrapes of the server's /metrics (read here from the file, not by the analysis)."""
    return pd.read_csv(Path(mix.run.run_dir) / "hosts" / "target" / "prometheus.csv")


def rate_between(scrapes: pd.DataFrame, column: str, lo: float, hi: float) -> float | None:
    """A counter's increase per second over [LO, HI], linear between the scrapes around each end; None
    where the scrapes do not span it."""
    t = scrapes["t"].to_numpy(dtype=float)
    v = scrapes[column].to_numpy(dtype=float)
    if not (t[0] <= lo < hi <= t[-1]):
        return None
    return float((np.interp(hi, t, v) - np.interp(lo, t, v)) / (hi - lo))


def test_each_class_server_rps_is_its_qps_and_the_scraped_counters(mix):
    s = read_summary(mix.run.run_dir)
    scrapes = scraped(mix)
    steps = {st["index"]: st for st in s["steps"]}
    figs = []
    for c in s["mix"]["classes"]:
        column = f'{COUNT}{{model_name="{c["name"]}"}}'
        assert column in scrapes.columns, (column, [k for k in scrapes.columns if COUNT in k])
        for cs in c["steps"]:
            st = steps[cs["index"]]
            mine = rate_between(scrapes, column, st["t_lo"], st["t_hi"])
            figs.append(f"{c['name']} {cs['users']}u {cs.get('server_rps') or 0:.1f}/{cs['qps']:.1f}")
            if not cs["valid"]:
                continue
            assert mine is not None and cs["server_rps"] is not None, (c["name"], cs["users"], mine, cs.get("server_rps"))
            assert cs["server_rps"] == pytest.approx(mine, rel=1e-9), (c["name"], cs["users"], cs["server_rps"], mine)
            assert cs["server_rps"] == pytest.approx(cs["qps"], rel=RATE_REL), (c["name"], cs["users"], cs)
    print("server req/s / QPS per class and step:", "; ".join(figs))


def bucket_floor(scrapes: pd.DataFrame, model: str, lo: float, hi: float) -> float:
    """The lower edge (ms) of the predict-time bucket that holds the median of MODEL's requests over
    [LO, HI], from its histogram's cumulative buckets as scraped at the window's ends: at least half
    of the server's own predict times in the window are at least this."""
    pat = re.compile(rf'^{BUCKET}\{{(?:.*,)?le="([^"]+)"(?:,.*)?\}}$')
    edges = sorted((float(m[1]), col) for col in scrapes.columns
                   if (m := pat.match(col)) is not None and f'model_name="{model}"' in col)
    inside = scrapes.loc[(scrapes["t"] >= lo) & (scrapes["t"] <= hi)]
    counts = [(le, float(inside[col].iloc[-1] - inside[col].iloc[0])) for le, col in edges]
    total = counts[-1][1]  # le="+Inf"
    below = 0.0
    for le, n in counts:
        if n >= total / 2:
            return below * 1000.0
        below = le
    return below * 1000.0


def test_each_class_p50_at_least_the_servers_predict_time(mix):
    """Each class's P50 (the slow class's above all: its model's own cost) is never below the
    server's for its model: the P50 of its wall time per request (its trace lines) in each step's
    window, and the lower edge of the predict histogram's bucket that holds its median there."""
    s = read_summary(mix.run.run_dir)
    scrapes = scraped(mix)
    steps = {st["index"]: st for st in s["steps"]}
    for c in s["mix"]["classes"]:
        served = mix.served(c["name"])
        figs = []
        for cs in c["steps"]:
            st = steps[cs["index"]]
            wall = [ms for t, ms in served if st["t_lo"] <= t < st["t_hi"]]
            wall_p50 = float(np.percentile(wall, 50))  # the server's whole handling of each request (its trace)
            floor = bucket_floor(scrapes, c["name"], st["t_lo"], st["t_hi"])  # its predict histogram's median bucket
            figs.append((cs["users"], cs["p50_ms"], wall_p50, floor))
            assert cs["p50_ms"] >= wall_p50, (c["name"], cs["users"], cs["p50_ms"], wall_p50)
            assert cs["p50_ms"] >= floor > 0, (c["name"], cs["users"], cs["p50_ms"], floor)
        print(f"{c['name']} P50 ms client/server wall (server predict median >=):",
              "; ".join(f"{u}u {p:.1f}/{w:.1f} ({f:.0f})" for u, p, w, f in figs))
        FIGURES.setdefault(f"kserve mix {c['name']}", {}).update({
            "P50 ms client/server": " ".join(f"{u}u {p:.0f}/{w:.0f}" for u, p, w, _ in figs),
            "run s": f"{mix.run.seconds:.0f}"})
    slow_floor = MODELS["slow"][1] + MODELS["slow"][2]  # the slow model's own cost: every request takes at least it
    assert all(cs["p50_ms"] >= slow_floor for c in s["mix"]["classes"] if c["name"] == "slow" for cs in c["steps"])
