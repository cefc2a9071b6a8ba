"""A step down in closed loop (a search refining to fewer users): the users it stops finish the
request they are in, and every one of those requests is a row, ok, with its whole latency.

Before, Locust killed the stopped users at once (its stop_timeout was 0): a request in flight was
cut without a row, which the server still served into the next step.  Real processes: `kneeswarm
run` (master and one worker: the stop_timeout travels to the worker with the spawn message) in
search mode against a knee target of 5 slots, whose probes go 4, 8, then down towards the knee.
The truth is the target's own request log (every request it received, with its arrival time).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kneeswarm.contracts.rundir import RunDir
from tests.conftest import read_summary, run_cli

# 8 users on 5 slots of 500 ms: every user is always in a request (queued or served).  5 slots, not 4:
# at 4 the 4-user probe already serves the plateau and the search closes the knee there without
# coming down (kneeswarm.launch.search.plateau_close); at 5 it serves 80 % of it, and the bounds aim down to 5
SLOTS, SERVICE_MS = 5, 500
# a fixed hold, long enough for the search's 50 rows a probe at 8 req/s once its rows are in
PLAN = ('[load]\nmode = "search"\nstart = 4\nmax = 8\ngrowth = 2.0\nhold = 8.0\nsettle = 1.0\nramp = 0.5\n'
        'workers = 1\n')


@pytest.mark.long
@pytest.mark.slow
def test_users_stopped_by_a_step_down_finish_their_request_and_it_is_recorded(tmp_path, start_demo_target):
    log = tmp_path / "requests.jsonl"
    target = start_demo_target("--mode", "knee", "--slots", str(SLOTS), "--service-ms", str(SERVICE_MS),
                               "--request-log", str(log))
    (tmp_path / "plan.toml").write_text(PLAN)
    res = run_cli("run", str(tmp_path / "plan.toml"), "--target", target.url, "--out", str(tmp_path / "out"), "-q",
                  timeout=300)
    target.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    (run_dir,) = [d for d in (tmp_path / "out").iterdir() if d.is_dir()]
    run = RunDir(run_dir)
    rows, steps = run.read_requests(), pd.read_csv(run_dir / "steps.csv")
    arrived = [json.loads(line)["t"] for line in log.read_text().splitlines() if line.strip()]
    print(list(steps["users"]), f"{len(rows)} rows, the target received {len(arrived)}")

    downs = [i for i in range(1, len(steps)) if steps["users"][i] < steps["users"][i - 1]]
    assert downs, list(steps["users"])  # the search went down at least once
    # every request the target received up to the last step's end is a row (none cut without one at a
    # step down); a request sent within a ms of that instant is before it for the client, after it for
    # the target: 1 either way.  (Past it the last step drains, and the test's own stop still cuts.)
    end = float(steps["t_end"].iloc[-1])
    seen = sum(t < end for t in arrived)
    assert abs(int((rows["t_start"] < end).sum()) - seen) <= 1, seen
    assert rows["ok"].all() and rows["error"].isna().all()
    for i in downs:
        t, before, after = steps["t_ramp"][i], int(steps["users"][i - 1]), int(steps["users"][i])
        busy = rows[(rows["t_start"] < t) & (rows["t_start"] + rows["latency_ms"] / 1000.0 > t)]
        print(f"step {i}: {before} -> {after} users at t={t:.2f}: {len(busy)} requests in flight, "
              f"latency {sorted(busy['latency_ms'].round())} ms")
        # every user of the step before was in a request at the step change, the stopped ones too;
        # each completed whole (no request is served in less than the service time)
        assert len(busy) == before
        assert (busy["latency_ms"] >= SERVICE_MS * 0.95).all()
    for step in read_summary(run_dir)["steps"]:  # nothing counted as an error, before or after a step down
        assert step["error_rate"] == 0 and not step["errors"], step
