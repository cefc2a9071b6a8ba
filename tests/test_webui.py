"""The Locust web UI path: `locust -f locustfiles/swarm.py` with the web UI, Start pressed over HTTP.

Each start of a swarm records to a new run directory under --kneeswarm-out, and
`kneeswarm analyze` reports it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from kneeswarm.launch.conductor import free_port
from kneeswarm.contracts.rundir import RunDir

from conftest import REPO, answers_200, chromium_or_skip, chromium_page, read_summary, wait_for

pytestmark = pytest.mark.slow


def test_web_ui_start_records_a_run(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "ui"\n[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 1.5\nsettle = 0.5\n')
    port = free_port()
    out = tmp_path / "runs"
    ui = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-host", "127.0.0.1",
         "--web-port", str(port), "--host", target.url, "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
        def finished(n: int) -> bool:
            runs = sorted(out.glob("*/report/index.html")) if out.exists() else []
            return len(runs) >= n

        for n in (1, 2):  # a second Start in the same session: a second run directory, its own agents
            r = requests.post(base + "/swarm", data={"user_count": 1, "spawn_rate": 1, "host": target.url}, timeout=10)
            assert r.status_code == 200 and r.json()["success"], r.text
            wait_for(lambda: finished(n), 90, f"run {n}'s report")
        assert requests.get(base + "/stats/requests", timeout=5).json()["state"] in ("stopped", "stopping", "cleanup")
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(runs) == 2
    for run_dir in runs:
        meta = RunDir(run_dir).read_meta()
        assert (run_dir / "plan.toml").exists() and meta["launcher"] == "locust"
        assert meta["ended"] == "completed" and meta["complete"] is True
        assert meta["lost"] == {}
        assert list(meta["hosts"]) == ["local"]  # the target's process, found by its port
        assert (run_dir / "hosts" / "local" / "vmstat.csv").is_file()
        s = read_summary(run_dir)
        assert s["complete"] is True
        assert [st["users"] for st in s["steps"]] == [1, 2]
        assert all(st["requests"] > 0 for st in s["steps"])
    assert runs[0].name != runs[1].name


def _start_ui(tmp_path, plan, out, port, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-port", str(port),
         "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out), *extra],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=(tmp_path / "ui.log").open("w"), text=True,
    )


@pytest.mark.long
def test_web_ui_in_chromium_plan_knee_tab_agents_and_report(tmp_path, start_demo_target):
    """Chromium: the plan in the form, Start, the Knee tabs fill (the chart with a point per step so
    far), the report link at the stop and the report's knee marked on the chart; the run directory
    has the monitored host's parsed CSVs and a report that opens with no console error.  One slot:
    saturated from 1 or 2 users (the client's own time per request keeps 2 users from filling 2
    slots, and a grid 1, 2, 3 then shows no knee)."""
    browsers = chromium_or_skip()
    target = start_demo_target("--mode", "knee", "--slots", "1", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "ui"\ntarget = "{target.url}"\nmetrics_url = "{target.url}/metrics"\n'
                    '[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 3.0\nsettle = 0.5\n'
                    f'[[hosts]]\nname = "server"\npid = {target.pid}\n')
    port, out = free_port(), tmp_path / "runs"
    ui = _start_ui(tmp_path, plan, out, port)
    base = f"http://127.0.0.1:{port}"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
        with chromium_page(browsers, base + "/", viewport={"width": 1400, "height": 1000}) as (browser, page):
            steps_field = page.locator("[name=kneeswarmSteps]")
            steps_field.wait_for(timeout=30_000)
            assert steps_field.input_value() == "1,2"  # the plan file's steps, in the form
            assert page.locator("[name=kneeswarmHold]").input_value() == "3.0"
            assert not page.locator("[name=userCount]").is_visible()  # the step plan drives the load
            assert page.locator("#kneeswarm-plan-note").is_visible()
            page.screenshot(path=str(shots / "1-form.png"))
            steps_field.fill("1,2,3")  # edited in the form: the run uses it
            page.get_by_role("button", name="Start").click()
            wait_for(lambda: requests.get(base + "/stats/requests", timeout=5).json()["state"] == "running", 120,
                     "the load to start (after the host agents)")
            page.goto(base + "/?tab=knee")
            page.locator("td", has_text="steady").first.wait_for(timeout=60_000)
            wait_for(lambda: _chart_shows_the_steps(page, base), 30, "the chart's points: the steps so far")
            page.screenshot(path=str(shots / "2-knee.png"))
            page.goto(base + "/?tab=knee-servers")
            page.locator("td", has_text="server").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "3-servers.png"))
            link = page.locator("#kneeswarm-report-link")
            link.wait_for(timeout=120_000)
            page.goto(base + "/?tab=knee")
            page.locator("td", has_text="done").nth(2).wait_for(timeout=30_000)  # all three steps
            wait_for(lambda: _chart_shows_the_steps(page, base, knee=True), 30, "the chart: every step, the knee")
            chart = _chart(page)
            page.screenshot(path=str(shots / "4-report-link.png"))
            live = requests.get(base + "/kneeswarm/live.json", timeout=5).json()
            assert chart["qps"] == [r["qps"] for r in live["steps"]] and chart["p99"] == [r["p99_ms"] for r in live["steps"]]
            assert [r["users"] for r in live["steps"]] == [1, 2, 3]
            assert all(r["valid"] == "yes" or r["valid"].startswith("no: ") for r in live["steps"])  # the summary's verdict
            (server,) = [h for h in live["hosts"] if h["host"] == "server"]
            assert 0 <= server["cpu_us"] <= 100 and server["cs_s"] > 0 and server["busiest_thread"]
            href = link.get_attribute("href")
            report = browser.new_page()
            errors = []
            report.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            report.on("pageerror", lambda e: errors.append(str(e)))
            report.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            r = report.goto(base + href)
            assert r.status == 200
            report.wait_for_load_state("networkidle")
            report.screenshot(path=str(shots / "5-report.png"), full_page=False)
            assert errors == []
    finally:
        ui.terminate()
        ui.wait(timeout=60)
        print(f"screenshots: {shots}")
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    run = RunDir(run_dir)
    assert len(run.read_steps()) == 3  # the form's 1,2,3, not the file's 1,2
    assert (run_dir / "hosts" / "server" / "vmstat.csv").is_file()
    assert (run_dir / "hosts" / "server" / "process.csv").is_file()
    assert (run_dir / "hosts" / "target" / "prometheus.csv").is_file()
    assert (run_dir / "report" / "index.html").is_file()
    meta = run.read_meta()
    assert "server" in meta["hosts"] and meta["ended"] == "completed"
    s = read_summary(run_dir)
    assert [st["users"] for st in s["steps"]] == [1, 2, 3]
    assert s["knee"]["users"] in (1, 2)  # 1 slot
    assert [sh["x0"] for sh in chart["shapes"] if sh["name"] == "knee"] == [s["knee"]["users"]]  # marked


CHART = """() => { const d = document.getElementById('kneeswarm-chart');
  if (!d || !d.data || !d.layout) { return null; }
  return {x: d.data[0].x, qps: d.data[0].y, p99: d.data[1].y, why: d.data[0].hovertext,
          shapes: (d.layout.shapes || []).map(s => ({name: s.name, x0: s.x0, x1: s.x1}))}; }"""


def _chart(page) -> dict | None:
    """The Knee tab's chart as plotly drew it (its div's data and layout), or None."""
    return page.evaluate(CHART)


def _chart_shows_the_steps(page, base: str, knee: bool = False) -> bool:
    """The chart has a point for each step with a QPS so far in live.json, by users (and, with
    ``knee``, a knee mark or bracket)."""
    steps = requests.get(base + "/kneeswarm/live.json", timeout=5).json()["steps"]
    users = sorted(r["users"] for r in steps if r["qps"] is not None)
    chart = _chart(page)
    return bool(users) and chart is not None and chart["x"] == users and (not knee or bool(chart["shapes"]))


def test_web_ui_refuses_a_public_address_without_login(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "ui"\n')
    ui = _start_ui(tmp_path, plan, tmp_path / "runs", free_port(), "--web-host", "0.0.0.0")
    assert ui.wait(timeout=60) == 2
    assert "--web-login" in (tmp_path / "ui.log").read_text()


@pytest.fixture(scope="module", autouse=True)
def plain_headless(request, tmp_path_factory):
    """The run of test_plain_locust_headless_is_a_full_run, started with the module (its own demo
    target), so that it goes while the web UI tests wait on theirs; that test collects it."""
    from kneeswarm.launch.cli import start_target, stop_target

    if not any(item.name == "test_plain_locust_headless_is_a_full_run" for item in request.session.items
               if item.module is request.module):
        yield None  # not selected: nothing started
        return
    tmp = tmp_path_factory.mktemp("plain")
    proc, url = start_target(["--mode", "knee", "--slots", "2", "--service-ms", "20"])
    plan = tmp / "plan.toml"
    plan.write_text(f'name = "plain"\ntarget = "{url}"\nmetrics_url = "{url}/metrics"\n'
                    '[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 3.0\nsettle = 0.5\n'
                    f'[[hosts]]\nname = "server"\npid = {proc.pid}\n')
    out, log = tmp / "runs", tmp / "locust.log"  # files, not pipes: nobody reads them until the test
    with log.open("w") as f:
        run = subprocess.Popen(
            [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--headless",
             "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out)],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=f, text=True,
        )
    yield run, out, log
    if run.poll() is None:
        run.kill()
        run.wait()
    stop_target(proc)


def test_plain_locust_headless_is_a_full_run(plain_headless):
    """`locust -f locustfiles/swarm.py --headless`, no conductor: the same host agents, target
    metrics and report as `kneeswarm run`."""
    run, out, log = plain_headless
    assert run.wait(timeout=180) == 0, log.read_text()[-3000:]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    meta = RunDir(run_dir).read_meta()
    assert meta["ended"] == "completed" and list(meta["hosts"]) == ["server"]
    assert meta["hosts"]["server"].get("parsed_verified") is True
    assert (run_dir / "hosts" / "server" / "vmstat.csv").is_file()
    assert (run_dir / "hosts" / "target" / "prometheus.csv").is_file()
    assert (run_dir / "report" / "index.html").is_file()
    assert [st["users"] for st in read_summary(run_dir)["steps"]] == [1, 2]


def test_web_login_from_environment_variables(tmp_path):
    """A non-loopback web UI (127.0.0.2 stands for one here) with --web-login: nothing without the
    credentials of KNEESWARM_WEB_USER / KNEESWARM_WEB_PASSWORD, everything with them."""
    import os

    plan = tmp_path / "plan.toml"
    plan.write_text('name = "ui"\n')
    port = free_port()
    env = {**os.environ, "KNEESWARM_WEB_USER": "alice", "KNEESWARM_WEB_PASSWORD": "s3cret"}
    ui = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-port", str(port),
         "--web-host", "127.0.0.2", "--web-login", "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(tmp_path / "runs")],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=(tmp_path / "ui.log").open("w"), env=env,
    )
    base = f"http://127.0.0.2:{port}"
    try:
        s = requests.Session()
        s.trust_env = False  # 127.0.0.2 is not in a proxy's no_proxy list

        wait_for(lambda: answers_200(base + "/login", s), 60, "the login page")
        anon = s.get(base + "/kneeswarm/live.json", timeout=5, allow_redirects=False)
        assert anon.status_code in (302, 401)
        bad = s.post(base + "/kneeswarm/login", data={"username": "alice", "password": "wrong"}, timeout=5)
        assert s.get(base + "/kneeswarm/live.json", timeout=5, allow_redirects=False).status_code in (302, 401), bad.url
        s.post(base + "/kneeswarm/login", data={"username": "alice", "password": "s3cret"}, timeout=5)
        assert s.get(base + "/kneeswarm/live.json", timeout=5).json()["steps"] == []
        assert s.get(base + "/", timeout=5).status_code == 200
    finally:
        ui.terminate()
        ui.wait(timeout=30)


@pytest.mark.long
def test_web_ui_search_in_chromium_shows_each_probes_why(tmp_path, start_demo_target):
    """Chromium, a web UI search: mode = "search" set in the start form over a grid plan; the Knee tab shows
    why each probe was chosen as it is decided; the report has the search section.  A fixed hold
    of 3 s: each probe is judged once its rows are in (they trail the workers' reports by ~6 s, so
    a probe lasts ~7 s whatever the hold; no settle: 2 slots of 20 ms are steady at once).  From 2
    users on 2 slots: 2, 4 and the refinement 3, a why of each kind (start, growth, knee), out of
    order for the chart to sort; from 1 it was a fourth probe (CI's whole run must fit in 45 minutes)."""
    browsers = chromium_or_skip()
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "ui-search"\ntarget = "{target.url}"\n'
                    '[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 3.0\nsettle = 0\n')
    port, out = free_port(), tmp_path / "runs"
    ui = _start_ui(tmp_path, plan, out, port)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
        with chromium_page(browsers, base + "/", viewport={"width": 1400, "height": 1000}) as (_, page):
            page.locator("[name=kneeswarmMode]").wait_for(timeout=30_000)
            page.locator("[name=kneeswarmMode]").fill("search")
            page.locator("[name=kneeswarmStart]").fill("2")
            page.locator("[name=kneeswarmMax]").fill("8")
            page.get_by_role("button", name="Start").click()
            wait_for(lambda: requests.get(base + "/stats/requests", timeout=5).json()["state"] == "running", 120,
                     "the load to start")
            page.goto(base + "/?tab=knee")
            page.locator("td", has_text="growth x2 from 2").first.wait_for(timeout=90_000)  # decided, shown
            wait_for(lambda: _chart_shows_the_steps(page, base), 30, "the chart's points: the probes so far")
            assert _chart(page)["why"][0].endswith("start")  # each point says why its probe was chosen
            page.locator("#kneeswarm-report-link").wait_for(timeout=180_000)
            wait_for(lambda: _chart_shows_the_steps(page, base, knee=True), 30, "the chart: every probe, the knee")
            chart = _chart(page)
            live = requests.get(base + "/kneeswarm/live.json", timeout=5).json()
    finally:
        ui.terminate()
        ui.wait(timeout=60)
    whys = [r["why"] for r in live["steps"]]
    assert whys[0] == "start" and whys[1].startswith("growth") and whys[2].startswith("knee in [2, 4]"), whys
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    s = read_summary(run_dir)["search"]
    users = [p["users"] for p in s["probes"]]
    assert users == [2, 4, 3] and s["knee_bracket"] == [2, 3] and s["stopped_because"], s  # 2 slots
    assert "<h2>Search</h2>" in (run_dir / "report" / "index.html").read_text()
    assert chart["x"] == sorted(users)  # the chart orders the probes by users; each labelled with its why
    assert [[sh["x0"], sh["x1"]] for sh in chart["shapes"] if sh["name"] == "knee bracket"] == [s["knee_bracket"]]
