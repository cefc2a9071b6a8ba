"""A locustfile for tests: kneeswarm's own (swarm.py) plus a listener that keeps what the
recorder does not store yet: every streamed request's inter-token gaps and its counts.

    locust -f tests/locust_probe.py --headless --kneeswarm-plan PLAN --kneeswarm-out DIR

On quitting it writes $KNEESWARM_PROBE_OUT (JSON): {"itl_ms": [[gaps of request 1], ...],
"counted": [bool, ...], "usage_out": [...], "chunks": [...], "users": [...]}.
"""

from __future__ import annotations

import json
import os

from locust import events

from kneeswarm.locustfiles.swarm import InferenceUser, KneeswarmSteps, plugin  # noqa: F401  (kneeswarm itself)

_seen: dict[str, list] = {"itl_ms": [], "counted": [], "usage_out": [], "chunks": [], "users": []}
_env = []


@events.init.add_listener
def _keep_env(environment, **_kw):
    _env.append(environment)


@events.request.add_listener
def _on_request(context=None, exception=None, **_kw):
    info = (context or {}).get("kneeswarm_stream")
    if info is None or exception is not None:
        return
    _seen["itl_ms"].append(list(info.itl_ms))
    _seen["counted"].append(info.tokens_counted)
    _seen["usage_out"].append(info.usage_out)
    _seen["chunks"].append(info.chunks)
    _seen["users"].append(_env[0].runner.user_count if _env and _env[0].runner else None)


@events.quitting.add_listener
def _dump(environment, **_kw):
    path = os.environ.get("KNEESWARM_PROBE_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(_seen, f)
