"""Generator overhead: requests/s of kneeswarm's KServe user (with per-request recording) against
bare Locust FastHttpUser posting the same body, same fast target, same run.

    .venv/bin/python bench/generator.py [--seconds 8] [--users 8] [--rounds 3]

The target is a minimal gevent HTTP responder (a canned KServe answer) in its own process, pinned
to core 0 while Locust runs pinned to core 1, so the load generator, not the server, is what is
measured.  Rounds alternate bare / kneeswarm;
the medians and their ratio are printed (target: ratio >= 0.9), and, less sensitive to other
load on the machine, requests per CPU-second of the Locust process (start-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ANSWER = b'{"model_name":"demo","outputs":[{"name":"output","shape":[1,1],"datatype":"FP32","data":[0.5]}]}'

BARE_LOCUSTFILE = '''
from locust import FastHttpUser, task
from locustfiles.protocols import KServeV2

class Bare(FastHttpUser):
    def on_start(self):
        self.req = KServeV2({"model": "demo", "shape": [1, 64]}, seed=1).next_request()

    @task
    def infer(self):
        r = self.req
        self.client.request(r.method, r.path, data=r.body, headers=r.headers, name="infer")
'''


def serve(port: int) -> None:
    """A fast keep-alive HTTP responder: reads one request (headers + body), answers ANSWER."""
    from gevent.server import StreamServer

    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(ANSWER)

    def handle(sock, _addr):
        try:
            answer(sock)
        except OSError:  # the load generator closed its connection at the end of a round
            pass

    def answer(sock):
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
            header, _, rest = buf.partition(b"\r\n\r\n")
            length = 0
            for line in header.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            while len(rest) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                rest += chunk
            buf = rest[length:]
            sock.sendall(head + ANSWER)

    StreamServer(("127.0.0.1", port), handle).serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu: int):
    """preexec_fn that pins a child to one core (target and generator never share one)."""
    ncpu = os.cpu_count() or 1
    return (lambda: os.sched_setaffinity(0, {cpu % ncpu})) if ncpu > 1 and hasattr(os, "sched_setaffinity") else None


def locust_rate(args: list[str], seconds: float) -> float:
    """Run one headless Locust process; requests/s from its --json summary."""
    return locust_run(args, seconds)[0]


def locust_run(args: list[str], seconds: float) -> tuple[float, float]:
    """Run one headless Locust process: (requests/s, requests per CPU-second of that process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = subprocess.run([sys.executable, "-m", "locust", "--headless", "--json", "--loglevel", "ERROR", *args],
                         capture_output=True, text=True, timeout=seconds + 60, cwd=REPO, preexec_fn=pin(1))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stats = json.loads(res.stdout)
    s = next(x for x in stats if x["name"] == "infer")
    return s["num_requests"] / max(1e-9, s["last_request_timestamp"] - s["start_time"]), s["num_requests"] / cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve)
        return
    port = free_port()
    target = subprocess.Popen([sys.executable, __file__, "--serve", str(port)], preexec_fn=pin(0))
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-bench-"))
    try:
        time.sleep(1.0)
        url = f"http://127.0.0.1:{port}"
        bare_file = tmp / "bare.py"
        bare_file.write_text(BARE_LOCUSTFILE)
        plan = tmp / "plan.toml"
        plan.write_text(f'name = "bench"\ntarget = "{url}"\n[load]\nsteps = [{a.users}]\nramp = 0.0\n'
                        f"hold = {a.seconds}\nsettle = 0.0\n")
        bare, ks, bare_eff, ks_eff = [], [], [], []
        for r in range(a.rounds):
            rate, eff = locust_run(["-f", str(bare_file), "--host", url, "-u", str(a.users), "-r", str(a.users),
                                    "-t", f"{int(a.seconds)}s"], a.seconds)
            bare.append(rate)
            bare_eff.append(eff)
            rate, eff = locust_run(["-f", str(REPO / "locustfiles" / "swarm.py"), "--host", url,
                                    "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(tmp / "runs")], a.seconds)
            ks.append(rate)
            ks_eff.append(eff)
            print(f"round {r + 1}: bare FastHttpUser {bare[-1]:8.0f} req/s ({bare_eff[-1]:6.0f} per CPU-s)   "
                  f"kneeswarm KServe+recorder {ks[-1]:8.0f} req/s ({ks_eff[-1]:6.0f} per CPU-s)", flush=True)
        rows = sum(len(__import__("pyarrow.parquet", fromlist=["x"]).read_table(p)) for p in (tmp / "runs").glob("*/requests/*.parquet"))
        mb, mk = statistics.median(bare), statistics.median(ks)
        paired = statistics.median(k / b for k, b in zip(ks, bare))
        print(f"median: bare {mb:.0f} req/s, kneeswarm {mk:.0f} req/s, ratio of medians {mk / mb:.3f}, "
              f"median of per-round ratios {paired:.3f} (target >= 0.9); requests per CPU-second "
              f"{statistics.median(ks_eff) / statistics.median(bare_eff):.3f} of bare (process start included); "
              f"{rows} rows recorded, {os.cpu_count()} cores, {a.users} users, {a.seconds:g}s x {a.rounds} rounds")
    finally:
        target.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
