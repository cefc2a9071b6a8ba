"""A stopped user sends nothing more: Locust's stop (end of the step plan, the web UI's Stop, a
worker told to stop) must end kneeswarm's users, closed and open loop alike.

It once did not: InferenceUser kept its open-loop requests in ``self._group``, the name of
Locust's own group that ``User.stop`` kills the user through, so a stop was a no-op and users sent
load through the whole teardown (host agents stopping, report) without a row recorded for it.
Run in a child process: Locust's gevent monkey-patching stays out of pytest's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = r"""
import json, sys, time
from locust.env import Environment  # first: Locust monkey-patches before requests loads ssl
import gevent, requests
from kneeswarm.collectors.prometheus import parse_exposition
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles import state
from kneeswarm.locustfiles.users import InferenceUser

url, mode = sys.argv[1], sys.argv[2]
load = {"steps": [4], "mode": mode} | ({"rates": [40.0], "source_rate": 10.0} if mode == "open" else {})
state.set_plan(plan_from_dict({"target": url, "load": load}, "test"))
InferenceUser.host = url
# requests the target received (counted on arrival: one still queued at the stop is not "more")
received = lambda: sum(v for k, v in parse_exposition(requests.get(url + "/metrics", timeout=5).text).items()
                       if k.startswith("kneeswarm_target_received_total"))
env = Environment(user_classes=[InferenceUser], host=url)
runner = env.create_local_runner()
runner.start(4, spawn_rate=100)
gevent.sleep(1.5)
before_stop = received()
runner.stop()
gevent.sleep(1.0)  # a request sent just before the stop may still be on its way in
after_stop = received()
gevent.sleep(1.5)
print(json.dumps({"before_stop": before_stop, "after_stop": after_stop, "later": received(),
                  "user_count": runner.user_count}))
"""


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["closed", "open"])
def test_a_stopped_user_sends_nothing_more(mode):
    from kneeswarm.launch.cli import start_target, stop_target

    proc, url = start_target([])
    try:
        res = subprocess.run([sys.executable, "-c", SCRIPT, url, mode], capture_output=True, text=True,
                             timeout=60, cwd=REPO)
    finally:
        stop_target(proc)
    assert res.returncode == 0, res.stderr[-2000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    print(mode, seen)
    assert seen["before_stop"] > 0  # the users did send load
    assert seen["user_count"] == 0
    assert seen["later"] == seen["after_stop"], "requests reached the target after the users were stopped"
