"""`[load] repeat` in Locust's web UI: one Start runs the series (kneeswarm.locustfiles.series), the
Knee tab says which repetition is running, and the merged result is linked at the end.

Real processes: `locust -f locustfiles/swarm.py` with its web UI, the knee-mode demo target, the
host agents on the target's port; Chromium through playwright where the page itself is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from kneeswarm.contracts.rundir import REPEAT_JSON, RunDir
from kneeswarm.launch.conductor import free_port

from conftest import REPO, answers_200, chromium_or_skip, chromium_page, wait_for

pytestmark = pytest.mark.slow

PLAN = 'name = "ui"\n[load]\nsteps = [1, 2]\nramp = 0.5\nhold = 1.5\nsettle = 0.5\nrepeat = {repeat}\ncooldown = {cooldown}\n'


def _start_ui(tmp_path: Path, target_url: str, repeat: int, cooldown: float) -> tuple[subprocess.Popen, str, Path]:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(repeat=repeat, cooldown=cooldown))
    port, out = free_port(), tmp_path / "runs"
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"), "--web-host",
                           "127.0.0.1", "--web-port", str(port), "--host", target_url, "--kneeswarm-plan", str(plan),
                           "--kneeswarm-out", str(out)],
                          cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=(tmp_path / "ui.log").open("w"))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
    return ui, base, out


def _repeat(base: str) -> dict:
    return requests.get(base + "/kneeswarm/live.json", timeout=5).json().get("repeat") or {}


@pytest.mark.long
def test_stop_during_the_cooldown_ends_the_series_and_merges_what_ran(tmp_path, start_demo_target):
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    ui, base, out = _start_ui(tmp_path, target.url, repeat=3, cooldown=60.0)
    try:
        r = requests.post(base + "/swarm", data={"user_count": 1, "spawn_rate": 1, "host": target.url}, timeout=10)
        assert r.status_code == 200 and r.json()["success"], r.text
        assert _repeat(base)["text"] == "Repetition 1 of 3"
        wait_for(lambda: _repeat(base).get("state") == "cooldown", 120, "the first repetition's end")
        cooling = _repeat(base)
        assert cooling["index"] == 1 and 0 < cooling["next_in_s"] <= 60 and len(cooling["runs"]) == 1
        assert requests.post(base + "/stop", timeout=10).status_code == 200  # Locust's Stop, between two tests
        wait_for(lambda: "report_url" in _repeat(base), 120, "the merged result")
        done = _repeat(base)
        assert done["state"] == "stopped" and done["text"] == "Series stopped after 1 of 3 repetitions (1 completed)"
        assert requests.get(base + done["report_url"], timeout=10).status_code == 200
    finally:
        ui.terminate()
        ui.wait(timeout=60)
    runs = sorted(p for p in out.iterdir() if (p / "meta.json").is_file())
    (folder,) = [p for p in out.iterdir() if (p / REPEAT_JSON).is_file()]
    assert len(runs) == 1 and RunDir(runs[0]).read_meta()["ended"] == "completed"
    rep = json.loads((folder / REPEAT_JSON).read_text())
    assert (rep["planned"], rep["merged"], rep["complete"]) == (3, 1, False)  # what ran, of what was asked
    assert done["report_url"] == f"/kneeswarm/runs/{folder.name}/index.html"


@pytest.mark.long
def test_a_start_runs_the_series_and_the_knee_tab_shows_each_repetition(tmp_path, start_demo_target):
    """Chromium: repeat 2 from the plan in the start form, Start; the Knee tab says "Repetition 1 of
    2", then the cooldown, then "Repetition 2 of 2", then links the merged report, which opens with
    no console error; two run directories with their reports and one merged result of both."""
    browsers = chromium_or_skip()
    target = start_demo_target("--mode", "knee", "--slots", "2", "--service-ms", "20")
    ui, base, out = _start_ui(tmp_path, target.url, repeat=2, cooldown=3.0)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    seen: list[str] = []
    try:
        with chromium_page(browsers, base + "/", viewport={"width": 1400, "height": 1000}) as (browser, page):
            field = page.locator("[name=kneeswarmRepeat]")
            field.wait_for(timeout=30_000)
            assert field.input_value() == "2" and page.locator("[name=kneeswarmCooldown]").input_value() == "3.0"
            page.get_by_role("button", name="Start").click()
            wait_for(lambda: requests.get(base + "/stats/requests", timeout=5).json()["state"] == "running", 120,
                     "the load to start (after the host agents)")
            page.goto(base + "/?tab=knee")
            banner = page.locator("#kneeswarm-repeat")

            def shows(text: str) -> bool:
                got = banner.text_content(timeout=5_000) if banner.count() else ""
                if got and (not seen or seen[-1] != got):
                    seen.append(got)
                return bool(got) and text in got

            wait_for(lambda: shows("Repetition 1 of 2"), 120, "repetition 1 in the Knee tab", period=0.5)
            page.screenshot(path=str(shots / "1-repetition-1.png"))
            wait_for(lambda: shows("cooldown before repetition 2 of 2"), 120, "the cooldown", period=0.3)
            wait_for(lambda: shows("Repetition 2 of 2"), 60, "repetition 2", period=0.5)
            assert banner.get_attribute("data-index") == "2"
            # the page follows the test the series started (Locust's own page showed the first one stopped)
            wait_for(lambda: "running" in (page.locator("header").first.text_content() or "").lower(), 60,
                     "Locust's status: running again", period=0.5)
            page.locator("td", has_text="steady").first.wait_for(timeout=60_000)
            page.screenshot(path=str(shots / "2-repetition-2.png"))
            link = page.locator("#kneeswarm-repeat-link")
            link.wait_for(timeout=120_000)
            assert "2 of 2 repetitions completed" in banner.text_content()
            page.screenshot(path=str(shots / "3-merged-link.png"))
            merged = browser.new_page()
            errors: list[str] = []
            merged.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            merged.on("pageerror", lambda e: errors.append(str(e)))
            assert merged.goto(base + link.get_attribute("href")).status == 200
            merged.wait_for_load_state("networkidle")
            assert merged.locator("#repeat-chart").count() == 1 and errors == []
            assert "2 of 2 runs merged" in merged.locator("body").text_content()
    finally:
        ui.terminate()
        ui.wait(timeout=60)
        print(f"screenshots: {shots}; the banner said: {seen}")
    runs = sorted(p for p in out.iterdir() if (p / "meta.json").is_file())
    assert len(runs) == 2 and all((r / "report" / "index.html").is_file() for r in runs)
    (folder,) = [p for p in out.iterdir() if (p / REPEAT_JSON).is_file()]
    rep = json.loads((folder / REPEAT_JSON).read_text())
    assert (rep["planned"], rep["merged"], rep["complete"]) == (2, 2, True)
    assert [r["run_id"] for r in rep["runs"]] == [p.name for p in runs]
