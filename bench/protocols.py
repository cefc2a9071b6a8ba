"""Generator overhead per protocol: requests/s of kneeswarm's user (protocol + recorder) against
bare Locust FastHttpUser posting the same bodies to the same fast responder, in the same run.

    .venv/bin/python bench/protocols.py [--seconds 6] [--users 8] [--rounds 3] [--only openai-stream,kserve]

The responder (a gevent server pinned to core 0, Locust to core 1, as in bench/generator.py)
answers each path with a canned answer; for OpenAI streaming it writes an SSE body of
``--tokens`` chunks plus usage and [DONE] at once.  The bare user reads the whole body
(``self.client.request``); kneeswarm's streams it event by event, timing each.  Rounds
alternate bare / kneeswarm; medians and their ratio are printed per protocol (target >= 0.95).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generator import REPO, free_port, locust_run, pin  # noqa: E402  (bench/ is not a package)

logger = logging.getLogger(__name__)

CHUNK = ('{"id":"c","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,'
         '"delta":{"content":"tok "},"logprobs":null,"finish_reason":%s}]}')
PLANS = {  # case: (plan lines, bare-user import and constructor of the same protocol)
    "kserve": ('protocol = "kserve"', "KServeV2({})"),
    "torchserve": ('protocol = "torchserve"', "TorchServe({})"),
    "tfserving": ('protocol = "tfserving"', "TFServing({})"),
    "http": ('protocol = "http"\n[request]\npath = "/score"\nsuccess_path = "outputs"',
             'GenericHTTP({"path": "/score"})'),
    "openai": ('protocol = "openai"\n[request]\nstream = false\nmax_tokens = 16',
               'OpenAI({"stream": False, "max_tokens": 16})'),
    "openai-stream": ('protocol = "openai"\n[request]\nmax_tokens = 16', 'OpenAI({"max_tokens": 16})'),
}
BARE = '''
from locust import FastHttpUser, task
from locustfiles.protocols import GenericHTTP, KServeV2, OpenAI, TFServing, TorchServe

class Bare(FastHttpUser):
    def on_start(self):
        self.req = {make}.next_request()

    @task
    def infer(self):
        r = self.req
        self.client.request(r.method, r.path, data=r.body, headers=r.headers, name="infer")
'''


def answers(tokens: int) -> dict[bytes, bytes]:
    """path prefix -> the whole HTTP answer."""
    def whole(body: bytes, ctype: bytes = b"application/json") -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (ctype, len(body)) + body

    sse = b"".join(b"data: " + (CHUNK % ('"length"' if i == tokens - 1 else "null")).encode() + b"\n\n"
                   for i in range(tokens))
    sse += b'data: {"choices":[],"usage":{"prompt_tokens":32,"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % tokens
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(sse), sse)
    chat = json.dumps({"choices": [{"message": {"role": "assistant", "content": "tok " * tokens},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 32, "completion_tokens": tokens}}).encode()
    return {
        b"/v2/": whole(b'{"model_name":"demo","outputs":[{"name":"output","shape":[1,1],"datatype":"FP32","data":[0.5]}]}'),
        b"/predictions/": whole(b'{"predictions":[[0.5]]}'),
        b"/v1/models/": whole(b'{"predictions":[[0.5]]}'),
        b"/score": whole(b'{"outputs":[0.5]}'),
        b"/v1/chat/stream": b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                            + chunked,
        b"/v1/chat/": whole(chat),
    }


def serve(port: int, tokens: int) -> None:
    """Keep-alive responder: one canned answer per request, chosen by path (and "stream":true)."""
    from gevent.server import StreamServer

    canned = answers(tokens)

    def handle(sock, _addr):
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                header, _, rest = buf.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in header.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(rest) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    rest += chunk
                body, buf = rest[:length], rest[length:]
                path = header.split(b" ", 2)[1]
                if path.startswith(b"/v1/chat/") and b'"stream":true' in body:
                    path = b"/v1/chat/stream"
                sock.sendall(next(v for k, v in canned.items() if path.startswith(k)))
        except OSError:  # the load generator closed its connection at the end of a round
            pass

    StreamServer(("127.0.0.1", port), handle).serve_forever()


def bench_case(case: str, url: str, tmp: Path, a: argparse.Namespace) -> tuple[float, float, float]:
    """Medians over the rounds: bare req/s, kneeswarm req/s, and the ratio of requests per CPU-second."""
    plan_lines, make = PLANS[case]
    bare_file = tmp / f"bare-{case}.py"
    bare_file.write_text(BARE.format(make=make))
    plan = tmp / f"plan-{case}.toml"
    head, _, request = plan_lines.partition("\n[request]")
    plan.write_text(f'name = "bench"\ntarget = "{url}"\n{head}\n[load]\nsteps = [{a.users}]\nramp = 0.0\n'
                    f"hold = {a.seconds}\nsettle = 0.0\n" + (f"[request]{request}\n" if request else ""))
    bare, ks, per_cpu = [], [], []
    for _ in range(a.rounds):
        b = locust_run(["-f", str(bare_file), "--host", url, "-u", str(a.users), "-r", str(a.users),
                        "-t", f"{int(a.seconds)}s"], a.seconds)
        k = locust_run(["-f", str(REPO / "locustfiles" / "swarm.py"), "--host", url, "--kneeswarm-plan",
                        str(plan), "--kneeswarm-out", str(tmp / "runs")], a.seconds)
        bare.append(b[0])
        ks.append(k[0])
        per_cpu.append(k[1] / b[1])
    return statistics.median(bare), statistics.median(ks), statistics.median(per_cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="chunks per streamed answer")
    ap.add_argument("--only", default=",".join(PLANS), help="comma-separated cases")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.tokens)
        return
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    port = free_port()
    target = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--tokens", str(a.tokens)],
                              preexec_fn=pin(0))
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-bench-"))
    try:
        time.sleep(1.0)
        url = f"http://127.0.0.1:{port}"
        for case in a.only.split(","):
            bare, ks, per_cpu = bench_case(case, url, tmp, a)
            print(f"{case:14s} bare FastHttpUser {bare:7.0f} req/s   kneeswarm {ks:7.0f} req/s   "
                  f"ratio {ks / bare:.3f} (target >= 0.95); per CPU-second {per_cpu:.3f}", flush=True)
        print(f"{os.cpu_count()} cores, {a.users} users, {a.seconds:g}s x {a.rounds} rounds, "
              f"{a.tokens} chunks per streamed answer")
    finally:
        target.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
