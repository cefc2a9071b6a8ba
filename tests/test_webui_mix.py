"""A traffic mix from the Locust web UI, in Chromium: a real master, two workers in their own
processes and the demo target serving two models of different cost (``--models``).

The Knee classes tab shows each class live (its rows so far and their share against its weight's,
the current step's requests, QPS and P99) and its own knees once the report is written; Locust's
own statistics name each class's requests apart ("infer cheap", "infer slow") beside an aggregate
that is the whole's.  The truth is the run directory's rows (pandas and numpy on the parts), the
summary's knees and the target's per-model counters."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import requests

from conftest import REPO, answers_200, chromium_or_skip, chromium_page, read_summary, wait_for
from kneeswarm.contracts.rundir import RunDir
from kneeswarm.launch.conductor import free_port

pytestmark = pytest.mark.long

SETTLE = 0.5
#: a table of the page by its header titles: [{title: cell text}] per row, or null when not shown
TABLE = """(title) => { const th = Array.from(document.querySelectorAll('th')).find(t => t.textContent === title);
  if (!th) { return null; }
  const table = th.closest('table');
  const heads = Array.from(table.querySelectorAll('thead th')).map(t => t.textContent);
  return Array.from(table.querySelectorAll('tbody tr')).map(tr => Object.fromEntries(
    Array.from(tr.querySelectorAll('td')).map((td, i) => [heads[i], td.textContent]))); }"""
COLUMNS = {"Class": "class", "Requests": "requests", "Share %": "share_pct", "Weight %": "weight_pct",
           "Step": "step", "Step requests": "step_requests", "QPS": "qps", "P99 ms": "p99_ms",
           "Knee (users)": "knee", "P99 knee (users)": "latency_knee"}


#: the Knee tab's chart's lines as plotly drew them: {name: [[x, y], ...]}
TRACES = """() => { const d = document.getElementById('kneeswarm-chart');
  if (!d || !d.data) { return null; }
  return Object.fromEntries(d.data.map(t => [t.name, t.x.map((x, i) => [x, t.y[i]])])); }"""


def _class_line(live: dict, name: str) -> list[list]:
    """A class's P99 by users in live.json, as its line on the chart should be."""
    pts = sorted((p["users"], p["step"], p["p99_ms"]) for p in live.get("class_steps") or []
                 if p["class"] == name and p["p99_ms"] is not None)
    return [[u, y] for u, _s, y in pts]


def _same(text: str, value) -> bool:
    if value is None or value == "":
        return text in ("", "null", "None", "-")
    if isinstance(value, (int, float)):
        try:
            return abs(float(text) - float(value)) < 0.051
        except ValueError:
            return False
    return text == str(value)


def _page_shows(page, classes: list[dict]) -> bool:
    """The Knee classes tab shows these rows (live.json's), cell by cell."""
    shown = page.evaluate(TABLE, "Step requests")
    if not shown or len(shown) != len(classes):
        return False
    return all(_same(cells.get(title, "?"), row[key]) for cells, row in zip(shown, classes) for title, key in COLUMNS.items())


def _locust(*args: str, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), *args],
                            cwd=log.parent, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)


def test_web_ui_mix_in_chromium_master_and_workers_each_class_live_and_its_knees(tmp_path, start_demo_target):
    """cheap (5 ms, four instances of its own) and slow (40 ms, one), weights 3 : 1, steps 1, 2, 4
    from a master and two workers: the slow model's one instance is full from 2 users on."""
    browsers = chromium_or_skip()
    target = start_demo_target("--mode", "knee", "--models", "cheap:5:4,slow:40:1")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "ui-mix"\ntarget = "{target.url}"\nprotocol = "kserve"\nmetrics_url = "{target.url}/metrics"\n'
                    f'[load]\nsteps = [1, 2, 4]\nramp = 0.5\nhold = 4.0\nsettle = {SETTLE}\n'
                    '[request]\nshape = [1, 4]\n'
                    '[[request.classes]]\nname = "cheap"\nmodel = "cheap"\nweight = 3\n'
                    '[[request.classes]]\nname = "slow"\nmodel = "slow"\nweight = 1\n')
    port, master_port, out = free_port(), free_port(), tmp_path / "runs"
    master = _locust("--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(master_port),
                     "--web-port", str(port), "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out),
                     log=tmp_path / "master.log")
    workers = [_locust("--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port),
                       log=tmp_path / f"worker-{i}.log") for i in range(2)]
    base = f"http://127.0.0.1:{port}"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    during = None
    try:
        wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
        wait_for(lambda: requests.get(base + "/stats/requests", timeout=5).json().get("worker_count") == 2, 60,
                 "the two workers")
        with chromium_page(browsers, base + "/", viewport={"width": 1400, "height": 1000}) as (_, page):
            page.locator("[name=kneeswarmSteps]").wait_for(timeout=30_000)
            page.get_by_role("button", name="Start").click()
            wait_for(lambda: requests.get(base + "/stats/requests", timeout=5).json()["state"] == "running", 120,
                     "the load to start (after the host agents)")
            page.goto(base + "/?tab=knee-classes")
            page.locator("th", has_text="Step requests").first.wait_for(timeout=30_000)

            def step_two_shown() -> bool:  # the second (or a later) step's figures, in the page as in live.json
                nonlocal during
                live = requests.get(base + "/kneeswarm/live.json", timeout=5).json()
                classes = live.get("classes") or []
                if not classes or classes[0]["step"] < 1 or classes[0]["qps"] is None or not _page_shows(page, classes):
                    return False
                # the run directory at this moment holds at least the rows the view had read
                rows = RunDir(next(p for p in out.iterdir() if p.is_dir())).read_requests()
                during = [(c["class"], c["requests"], int((rows["class"] == c["class"]).sum())) for c in classes]
                return True

            wait_for(step_two_shown, 60, "a later step's figures per class in the Knee classes tab", period=0.5)
            page.screenshot(path=str(shots / "1-classes-live.png"))
            page.locator("#kneeswarm-report-link").wait_for(timeout=180_000)
            page.goto(base + "/?tab=knee-classes")  # Locust's page asks for no statistics once the test stopped
            page.locator("th", has_text="Step requests").first.wait_for(timeout=30_000)
            wait_for(lambda: _page_shows(page, requests.get(base + "/kneeswarm/live.json", timeout=5).json()["classes"])
                     and page.evaluate(TABLE, "Step requests")[0]["Knee (users)"] != "", 30,
                     "the final figures and the knees in the Knee classes tab", period=0.5)
            page.screenshot(path=str(shots / "2-classes-knees.png"))
            live = requests.get(base + "/kneeswarm/live.json", timeout=5).json()
            stats = requests.get(base + "/stats/requests", timeout=5).json()["stats"]
            page.goto(base + "/?tab=knee")
            wait_for(lambda: (page.evaluate(TRACES) or {}).get("P99 ms slow") == _class_line(live, "slow"), 30,
                     "the chart's P99 line of each class", period=0.5)
            traces = page.evaluate(TRACES)
            page.screenshot(path=str(shots / "3-knee-chart.png"))
            page.goto(base + "/?tab=stats")
            page.locator("td", has_text="infer slow").first.wait_for(timeout=30_000)
            page.screenshot(path=str(shots / "4-locust-stats.png"))
    finally:
        for p in [master, *workers]:
            p.terminate()
        for p in [master, *workers]:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        print(f"screenshots: {shots}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    run = RunDir(run_dir)
    rows = run.read_requests()
    summary = read_summary(run_dir)
    steps = run.read_steps()
    last = steps.iloc[-1]
    t_from = float(last["t_steady"]) + SETTLE
    in_last = rows[rows["step"] == int(last["index"])]
    steady = in_last[in_last["t_start"] >= t_from]
    span = float(steady["t_start"].max()) - t_from
    knees = {c["name"]: c for c in summary["mix"]["classes"]}
    counted = target.metrics()
    assert [c["class"] for c in live["classes"]] == ["cheap", "slow"]
    print("during the load (class, shown, rows in the run directory then):", during)
    assert during and all(0 < shown <= held for _c, shown, held in during), during
    print("class  weight%  requests  share%  step-4 requests  QPS  P99 ms  knee  P99 knee")
    for c in live["classes"]:
        name = c["class"]
        mine = steady[steady["class"] == name]
        print(f'{name:6s} {c["weight_pct"]:6.1f} {c["requests"]:9d} {c["share_pct"]:6.1f} {c["step_requests"]:9d} '
              f'{c["qps"]:7.1f} {c["p99_ms"]:7.1f} {c["knee"]!s:>5} {c["latency_knee"]!s:>5}')
        assert c["requests"] == int((rows["class"] == name).sum())
        assert c["share_pct"] == round(100.0 * c["requests"] / int(rows["class"].notna().sum()), 1)
        assert abs(c["share_pct"] - c["weight_pct"]) <= 3.0, c  # its weight's share within 3 points
        assert (c["step"], c["users"], c["step_requests"]) == (2, 4, int((in_last["class"] == name).sum()))
        assert c["qps"] == round(len(mine) / span, 1)
        assert c["p99_ms"] == round(float(np.percentile(mine.loc[mine["ok"], "latency_ms"], 99)), 1)
        for key in ("knee", "latency_knee"):
            assert c[key] == ((knees[name].get(key) or {}).get("users") or "none"), (name, key, c[key])
        served = counted[f'nv_inference_request_success{{model="{name}",version="1"}}']  # the target's own count
        ok = int(rows.loc[rows["class"] == name, "ok"].sum())
        assert 0 <= served - ok <= 4, (name, served, ok)  # but those in flight at the stop (one per user at most)
        # Locust's own statistics: each class's requests apart, as many as its rows
        (entry,) = [s for s in stats if s["name"] == f"infer {name}"]
        assert entry["num_requests"] == c["requests"], (name, entry["num_requests"], c["requests"])
    for name in ("cheap", "slow"):  # the chart: each class's P99 at each step, as its rows give it
        line = []
        for _, st in steps.iterrows():
            step_rows = rows[(rows["step"] == int(st["index"])) & (rows["class"] == name) & rows["ok"]]
            lat = step_rows.loc[step_rows["t_start"] >= float(st["t_steady"]) + SETTLE, "latency_ms"]
            line.append([int(st["users"]), round(float(np.percentile(lat, 99)), 1)])
        assert traces[f"P99 ms {name}"] == line, (name, traces[f"P99 ms {name}"], line)
    (aggregate,) = [s for s in stats if s["name"] == "Aggregated"]
    assert aggregate["num_requests"] == len(rows) and (rows["name"] == "infer").all()  # the whole's, rows unchanged
