"""Generator overhead counted in CPU instructions (valgrind's callgrind), not seconds: the steady
figure on a shared machine, where bench/generator.py's requests/s move by 10-30 % between rounds.

    .venv/bin/python bench/instructions.py [--only kserve,openai-stream] [--requests 2000] [--users 8]

Per protocol, a client process sends requests to bench/generator.py's canned responder (the gRPC
cases: bench/grpc_cases.py's, against Locust's own gRPC example's way, an interceptor), under
``valgrind --tool=callgrind``, twice: ``--base`` requests and ``--base + --requests``; the
difference of the two instruction totals over ``--requests`` is the instructions per request
(start-up and imports cancel out).  Both clients run in one Python process each with Locust's
own Environment, local runner and stats: "bare" is a FastHttpUser sending the protocol's body and
nothing else (streamed: reading the whole body), "same" the same job done with bare Locust
(bench/generator.py's baselines: answers judged, streams timed by hand), "kneeswarm" kneeswarm's
InferenceUser with the recorder's listener (its answer check, streaming judgement and row),
``--users`` greenlets each.
What is not in it: the local runner's row writer (bench/master_path.py: ~1.2 us per row) and host
agents (bench/agent_overhead.py).  Each valgrind run takes about a minute (Python starts 50x slower).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from generator import BARE_CHECKED, BARE_SSE, PLANS, free_port, pin  # noqa: E402 - bench/ is not a package
from grpc_cases import PLANS as GRPC_PLANS, bare_source  # noqa: E402

COLLECTED = re.compile(r"Collected : (\d+)")
NAMES = {"bare": "bare FastHttpUser", "same": "bare FastHttpUser doing the same job"}
GRPC_NAMES = {"bare": "Locust's gRPC example (an interceptor)", "same": "Locust's gRPC example doing the same job"}
#: a gRPC case and the HTTP case that sends the same request as JSON
OVER_HTTP = {"kserve-grpc": "kserve", "torchserve-grpc": "torchserve"}


def grpc_users(side: str, case: str, url: str, tmp: Path, channel: str) -> tuple[type, type]:
    """(kneeswarm's user, the baseline's user) of a gRPC case (bench/grpc_cases.py)."""
    from kneeswarm.contracts.planfile import load_plan
    from kneeswarm.locustfiles import grpcuser, state
    from kneeswarm.locustfiles.users import InferenceUser

    head, _, request = GRPC_PLANS[case].partition("\n[request]")
    plan = tmp / f"plan-{case}.toml"
    plan.write_text(f'name = "bench"\ntarget = "{url}"\n{head}\n[load]\nsteps = [1]\n'
                    + (f"[request]{request}\n" if request else ""))
    state.set_plan(load_plan(str(plan), {}))
    grpcuser.CHANNEL_SCOPE = channel
    InferenceUser.host = url
    ns: dict = {}
    exec(bare_source(case, "same" if side == "same" else "bare", url), ns)
    return InferenceUser, ns["BareSame" if side == "same" else "BareBare"]


def client(side: str, case: str, requests: int, users: int, url: str, tmp: Path, channel: str = "user") -> None:
    """Send ``requests`` requests from ``users`` users of one side, in this process."""
    from gevent import monkey

    monkey.patch_all()
    import gevent
    from locust import FastHttpUser, events
    from locust.env import Environment

    if case in GRPC_PLANS:
        from kneeswarm.locustfiles.recorder import RowBuffer

        ks, base = grpc_users(side, case, url, tmp, channel)
        env = Environment(user_classes=[ks, base], events=events)
        env.create_local_runner()
        if side == "kneeswarm":
            env.events.request.add_listener(RowBuffer().on_request)
        _drive(env, [(ks if side == "kneeswarm" else base)(env) for _ in range(users)], requests, side, case)
        return

    from kneeswarm.contracts.planfile import load_plan
    from kneeswarm.locustfiles import state
    from kneeswarm.locustfiles.protocols import for_plan
    from kneeswarm.locustfiles.recorder import RowBuffer
    from kneeswarm.locustfiles.users import InferenceUser

    plan_lines, _, _ = PLANS[case]
    head, _, request = plan_lines.partition("\n[request]")
    plan = tmp / "plan.toml"
    plan.write_text(f'name = "bench"\ntarget = "{url}"\n{head}\n[load]\nsteps = [1]\n'
                    + (f"[request]{request}\n" if request else ""))
    state.set_plan(load_plan(str(plan), {}))
    req = for_plan(state.plan(), seed=1).next_request()

    class Bare(FastHttpUser):
        host = url

        def infer(self) -> None:
            self.client.request(req.method, req.path, data=req.body, headers=req.headers, name="infer")

    same_job = {}  # the same job done with bare Locust: bench/generator.py's BARE_CHECKED or BARE_SSE
    _, make, key = PLANS[case]
    exec(BARE_CHECKED.format(make=make, key=key) if key else BARE_SSE, same_job)
    Same = type("Same", (same_job["BareChecked" if key else "BareSSE"],), {"host": url})

    InferenceUser.host = url
    env = Environment(user_classes=[InferenceUser, Bare, Same], events=events)
    env.create_local_runner()
    if side == "kneeswarm":
        env.events.request.add_listener(RowBuffer().on_request)  # as the plugin does (rows kept, not sent)
    made = [{"kneeswarm": InferenceUser, "bare": Bare, "same": Same}[side](env) for _ in range(users)]
    _drive(env, made, requests, side, case)


def _drive(env: object, made: list, requests: int, side: str, case: str) -> None:
    """Each user sends its share of ``requests`` in a greenlet of its own; all must succeed."""
    import gevent

    for u in made:
        u.on_start()  # type: ignore[attr-defined]

    def loop(u: object, n: int) -> None:
        for _ in range(n):
            u.infer()  # type: ignore[attr-defined]

    gevent.joinall([gevent.spawn(loop, u, requests // len(made) + (i < requests % len(made))) for i, u in enumerate(made)])
    total = env.stats.total  # type: ignore[attr-defined]
    if total.num_requests != requests or total.num_failures:
        raise SystemExit(f"{side} {case}: {total.num_requests} requests, {total.num_failures} failed (wanted {requests})")


def instructions(side: str, case: str, requests: int, users: int, url: str, tmp: Path, channel: str = "user") -> int:
    """Instructions of one client process under callgrind."""
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
            "--client", side, "--case", case, "--n", str(requests), "--users", str(users), "--url", url,
            "--tmp", str(tmp), "--channel", channel]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, preexec_fn=pin(1), timeout=1800,
                         env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    found = COLLECTED.search(res.stderr)
    if res.returncode != 0 or not found:
        raise SystemExit(f"{side} {case}: no instruction count (exit {res.returncode}): {res.stderr[-800:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join([*PLANS, *GRPC_PLANS]),
                    help="comma-separated cases (bench/generator.py's, bench/grpc_cases.py's)")
    ap.add_argument("--channel", default="user", choices=("user", "worker"),
                    help="gRPC: a channel per user (kneeswarm's) or one shared by the process's users")
    ap.add_argument("--requests", type=int, default=2000, help="requests whose instructions are counted")
    ap.add_argument("--base", type=int, default=8, help="requests of the shorter run (start-up, first requests)")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--baselines", default="bare,same", help="bare (the floor), same (the same job by hand)")
    ap.add_argument("--tokens", type=int, default=16, help="chunks per streamed answer")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        client(a.client, a.case, a.n, a.users, a.url, Path(a.tmp), a.channel)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("bench/instructions.py needs valgrind (apt install valgrind)")
    port = free_port()
    responder = subprocess.Popen([sys.executable, str(REPO / "bench" / "generator.py"), "--serve", str(port),
                                  "--tokens", str(a.tokens)], preexec_fn=pin(0))
    gport = free_port()
    grpc_responder = subprocess.Popen([sys.executable, str(REPO / "bench" / "grpc_cases.py"), "--serve", str(gport),
                                       "--tokens", str(a.tokens)], preexec_fn=pin(0))
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-instr-"))
    kneeswarm_per: dict[str, float] = {}
    try:
        time.sleep(1.0)
        for case in a.only.split(","):
            url = f"grpc://127.0.0.1:{gport}" if case in GRPC_PLANS else f"http://127.0.0.1:{port}"
            names = GRPC_NAMES if case in GRPC_PLANS else NAMES
            per = {}
            for side in ("kneeswarm", *a.baselines.split(",")):
                short = instructions(side, case, a.base, a.users, url, tmp, a.channel)
                long = instructions(side, case, a.base + a.requests, a.users, url, tmp, a.channel)
                per[side] = (long - short) / a.requests
            kneeswarm_per[case] = per["kneeswarm"]
            for side in a.baselines.split(","):
                print(f"{case:14s} instructions per request: {names[side]} {per[side]:,.0f}, kneeswarm "
                      f"{per['kneeswarm']:,.0f}, ratio {per[side] / per['kneeswarm']:.3f} (kneeswarm "
                      f"{per['kneeswarm'] / per[side] - 1:+.1%})", flush=True)
        for grpc_case, http_case in OVER_HTTP.items():
            if grpc_case in kneeswarm_per and http_case in kneeswarm_per:
                g, h = kneeswarm_per[grpc_case], kneeswarm_per[http_case]
                print(f"{grpc_case:14s} against {http_case} (the same request over HTTP JSON): kneeswarm {g:,.0f} "
                      f"vs {h:,.0f} instructions per request: gRPC {'saves' if g < h else 'costs'} "
                      f"{abs(h - g):,.0f} ({g / h - 1:+.1%})", flush=True)
        print(f"callgrind, {a.requests} requests counted ({a.base} before), {a.users} users, "
              f"{a.tokens} chunks per streamed answer, gRPC channel per {a.channel}")
    finally:
        responder.kill()
        grpc_responder.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
