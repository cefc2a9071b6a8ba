"""The Locust web UI path: `locust -f locustfiles/swarm.py` with the web UI, Start pressed over HTTP.

Each start of a swarm records to a new run directory under --kneeswarm-out, and
`kneeswarm analyze` reports it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from kneeswarm.conductor import free_port
from kneeswarm.rundir import RunDir

from conftest import REPO, read_summary, run_cli, wait_for

pytestmark = pytest.mark.slow


def test_web_ui_start_records_a_run(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text('name = "ui"\n[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 3.0\nsettle = 0.5\n')
    port = free_port()
    out = tmp_path / "runs"
    ui = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-host", "127.0.0.1",
         "--web-port", str(port), "--host", target.url, "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(out)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            try:
                return requests.get(base + "/", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, 60, "the web UI")
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


def test_web_ui_in_chromium_plan_knee_tab_agents_and_report(tmp_path, start_demo_target):
    """Chromium: the plan in the form, Start, the Knee tabs fill, the report link at the stop; the
    run directory has the monitored host's parsed CSVs and a report that opens with no console error."""
    import shutil

    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make test installs it)")
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    plan = tmp_path / "plan.toml"
    plan.write_text(f'name = "ui"\ntarget = "{target.url}"\nmetrics_url = "{target.url}/metrics"\n'
                    '[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 4.0\nsettle = 0.5\n'
                    f'[[hosts]]\nname = "server"\npid = {target.pid}\n')
    port, out = free_port(), tmp_path / "runs"
    ui = _start_ui(tmp_path, plan, out, port)
    base = f"http://127.0.0.1:{port}"
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        wait_for(lambda: _up(base), 60, "the web UI")
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(base + "/")
            steps_field = page.locator("[name=kneeswarmSteps]")
            steps_field.wait_for(timeout=30_000)
            assert steps_field.input_value() == "1,2"  # the plan file's steps, in the form
            assert page.locator("[name=kneeswarmHold]").input_value() == "4.0"
            assert not page.locator("[name=userCount]").is_visible()  # the step plan drives the load
            assert page.locator("#kneeswarm-plan-note").is_visible()
            page.screenshot(path=str(shots / "1-form.png"))
            steps_field.fill("1,2,3")  # edited in the form: the run uses it
            page.get_by_role("button", name="Start").click()
            wait_for(lambda: requests.get(base + "/stats/requests", timeout=5).json()["state"] == "running", 120,
                     "the load to start (after the host agents)")
            page.goto(base + "/?tab=knee")
            page.locator("td", has_text="steady").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "2-knee.png"))
            page.goto(base + "/?tab=knee-servers")
            page.locator("td", has_text="server").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "3-servers.png"))
            link = page.locator("#kneeswarm-report-link")
            link.wait_for(timeout=120_000)
            page.goto(base + "/?tab=knee")
            page.locator("td", has_text="done").nth(2).wait_for(timeout=30_000)  # all three steps
            page.screenshot(path=str(shots / "4-report-link.png"))
            live = requests.get(base + "/kneeswarm/live.json", timeout=5).json()
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
            browser.close()
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


def _up(base: str) -> bool:
    try:
        return requests.get(base + "/", timeout=1).status_code == 200
    except requests.RequestException:
        return False


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
    from kneeswarm.cli import start_target, stop_target

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

        def up() -> bool:
            try:
                return s.get(base + "/login", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, 60, "the login page")
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
