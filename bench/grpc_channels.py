"""gRPC channels: one per user (kneeswarm's default) or one shared by a worker's users, measured.

    .venv/bin/python bench/grpc_channels.py [--users 32] [--streams 8] [--seconds 8]

A real gRPC server (tests/grpc_server.py: model "double", SLOTS requests served at once, each
SERVICE_MS, so it could serve users / SERVICE_MS requests/s) that lets one HTTP/2 connection have at
most ``--streams`` calls open at once (HTTP/2's MAX_CONCURRENT_STREAMS, which servers and proxies in
front of them set: nginx's http2_max_concurrent_streams is 128 unless told), and one Locust process running
kneeswarm's kserve-grpc user with ``--users`` users, once per channel scope.  Printed per scope:
requests/s, mean latency, and the load generator's CPU per request.  With one shared channel every
call is a stream on one connection: beyond the stream limit calls wait inside the client, where
neither the server's queue nor the run's rows (their latency grows, but no step says why) show it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from generator import free_port, locust_window  # noqa: E402 - bench/ is not a package

SLOTS, SERVICE_MS = 256, 20.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warm", type=float, default=2.0)
    a = ap.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "grpc_server.py"), str(port), "--slots",
                               str(SLOTS), "--service-ms", str(SERVICE_MS), "--max-streams", str(a.streams)],
                              stdout=subprocess.PIPE, text=True)
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-channels-"))
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "serving"
        # the server prints a line per call: read and dropped, or the pipe fills (64 KiB, about 1,000
        # calls) and the server stalls in its write, and with it every call after
        threading.Thread(target=server.stdout.read, daemon=True).start()
        url = f"grpc://127.0.0.1:{port}"
        plan = tmp / "plan.toml"
        plan.write_text(f'name = "bench"\ntarget = "{url}"\nprotocol = "kserve-grpc"\n[load]\nsteps = [{a.users}]\n'
                        f'ramp = 0.0\nhold = {a.seconds}\nsettle = 0.0\n[request]\nmodel = "double"\n'
                        'input_name = "x"\nshape = [1, 8]\n')
        for scope in ("user", "worker"):
            os.environ["KNEESWARM_BENCH_CHANNEL"] = scope
            args = ["-f", f"{REPO / 'locustfiles' / 'swarm.py'},{REPO / 'bench' / 'window.py'}", "--host", url,
                    "--kneeswarm-plan", str(plan), "--kneeswarm-out", str(tmp / "runs")]
            w = locust_window(args, a.seconds, a.warm, tmp / f"w-{scope}.json")
            qps = w["requests"] / w["seconds"]
            print(f"channel per {scope:6s}: {qps:6.0f} req/s, mean latency {1000.0 * a.users / qps:6.1f} ms (Little's "
                  f"law), {1e6 * w['cpu_s'] / w['requests']:4.0f} us CPU per request", flush=True)
        print(f"{a.users} users, a server of {SLOTS} slots x {SERVICE_MS:.0f} ms allowing {a.streams} streams per "
              f"connection (it could serve {1000.0 * a.users / SERVICE_MS:.0f} req/s to {a.users} users)")
    finally:
        server.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
