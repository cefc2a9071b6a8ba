"""Generator overhead, every protocol: requests/s of kneeswarm's user (protocol + recorder) against
bare Locust FastHttpUser sending the same bodies to the same fast responder, in the same run.

    .venv/bin/python bench/generator.py [--seconds 8] [--users 8] [--rounds 3] [--only openai-stream,kserve]

Two baselines, each its own Locust run: the floor, a FastHttpUser that sends the body and judges
nothing (``client.request``, which reads the whole answer), and the same job done with bare
Locust: answers judged the way Locust's documentation shows (``catch_response``, the answer
parsed as JSON and its result key checked) or, streamed, timed by hand the way Locust-based LLM
benchmarks do (Locust's ``iter_content``, one ``json.loads`` per event, TTFT at the first text
chunk).  kneeswarm's user judges every answer and records a row per request, so the floor ratio
is what judging and recording cost, and the same-job ratio what kneeswarm costs beyond Locust
doing that work.

The responder (a gevent server in its own process, pinned to core 0; Locust pinned to core 1)
answers each path with a canned answer, so the load generator, not the server, is what is
measured.  OpenAI streaming: an SSE body of ``--tokens`` chunks plus usage and [DONE], written at
once; kneeswarm's user reads it as it arrives and judges every event (TTFT, ITL, usage, [DONE]).

The Locust process's children (kneeswarm's lifecycle, host agent and collectors) are moved off
its core as they appear, so that on both sides the generator's core is the Locust process's alone.
Every side loads bench/window.py beside its locustfile: requests and the Locust process's own
CPU time are counted over the same steady window (``--warm`` seconds after all users run;
start-up, the host agents' start and the report stay out).  Rounds alternate the order of the
sides; per protocol and baseline the medians of requests/s, their ratio and the median of the
per-round ratios (target >= 0.95), and the ratio of CPU time per request (baseline / kneeswarm:
less sensitive to other load on the machine) are printed.  bench/instructions.py counts the same
in CPU instructions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from grpc_cases import PLANS as GRPC_PLANS, bare_source  # noqa: E402 - bench/ is not a package
WINDOW = REPO / "bench" / "window.py"
CHILD_PIN_PERIOD = 0.2  # seconds between looks for new children of the Locust process to move off its core
CHUNK = ('{"id":"c","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,'
         '"delta":{"content":"tok "},"logprobs":null,"finish_reason":%s}]}')
PLANS = {  # case: (plan lines, bare-user import and constructor of the same protocol, a key of a good answer)
    "kserve": ('protocol = "kserve"', "KServeV2({})", "outputs"),
    "torchserve": ('protocol = "torchserve"', "TorchServe({})", "predictions"),
    "tfserving": ('protocol = "tfserving"', "TFServing({})", "predictions"),
    "http": ('protocol = "http"\n[request]\npath = "/score"\nsuccess_path = "outputs"',
             'GenericHTTP({"path": "/score"})', "outputs"),
    "openai": ('protocol = "openai"\n[request]\nstream = false\nmax_tokens = 16',
               'OpenAI({"stream": False, "max_tokens": 16})', "choices"),
    "openai-stream": ('protocol = "openai"\n[request]\nmax_tokens = 16', 'OpenAI({"max_tokens": 16})', None),
}
BARE = '''
from locust import FastHttpUser, task
from kneeswarm.locustfiles.protocols import GenericHTTP, KServeV2, OpenAI, TFServing, TorchServe

class Bare(FastHttpUser):
    def on_start(self):
        self.req = {make}.next_request()

    @task
    def infer(self):
        r = self.req
        self.client.request(r.method, r.path, data=r.body, headers=r.headers, name="infer")
'''
# The same job done by hand, the way Locust's documentation validates answers: catch_response and
# the answer parsed as JSON, a failure unless it is a 200 holding the protocol's result key.
BARE_CHECKED = '''
import json

from locust import FastHttpUser, task
from kneeswarm.locustfiles.protocols import GenericHTTP, KServeV2, OpenAI, TFServing, TorchServe

class BareChecked(FastHttpUser):
    def on_start(self):
        self.req = {make}.next_request()

    @task
    def infer(self):
        r = self.req
        with self.client.request(r.method, r.path, data=r.body, headers=r.headers, name="infer",
                                 catch_response=True) as resp:
            if resp.status_code != 200 or {key!r} not in json.loads(resp.content):
                resp.failure("bad answer")
'''
# OpenAI streaming, the same job done by hand: what a Locust user written to time streamed answers
# does (LLM benchmarks built on Locust, e.g. fw-ai/benchmark's llm_bench, read so): Locust's own
# streaming reader, one json.loads per event, TTFT at the first chunk with text, tokens counted,
# the request's time set to the end of the stream.
BARE_SSE = '''
import json
import time

from locust import FastHttpUser, task
from kneeswarm.locustfiles.protocols import OpenAI

class BareSSE(FastHttpUser):
    def on_start(self):
        self.req = OpenAI({"max_tokens": 16}).next_request()

    @task
    def infer(self):
        r = self.req
        t0 = time.perf_counter()
        with self.client.request(r.method, r.path, data=r.body, headers=r.headers, name="infer", stream=True,
                                 catch_response=True) as resp:
            ttft, tokens, pending = None, 0, b""
            for chunk in resp.iter_content(chunk_size=1024, decode_content=False):
                *lines, pending = (pending + chunk).split(b"\\n")
                for line in lines:
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        choices = json.loads(line[6:])["choices"]
                        if choices and choices[0]["delta"].get("content"):
                            tokens += 1
                            if ttft is None:
                                ttft = time.perf_counter() - t0
            resp.request_meta["response_time"] = (time.perf_counter() - t0) * 1000.0
            if tokens:
                resp.success()
            else:
                resp.failure("no tokens")
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu: int):
    """preexec_fn that pins a child to one core (target and generator never share one)."""
    ncpu = os.cpu_count() or 1
    return (lambda: os.sched_setaffinity(0, {cpu % ncpu})) if ncpu > 1 and hasattr(os, "sched_setaffinity") else None


def unpin_children(pid: int) -> None:
    """Move the Locust process's children (kneeswarm's test lifecycle, its host agent and
    collectors; they inherit the pin) to the responder's core: the generator's core is then the
    Locust process's alone on both sides, as a worker's is under `kneeswarm run` (whose lifecycle
    runs in the conductor).  What monitoring costs is bench/agent_overhead.py's figure."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            if child.cpu_affinity() != [0]:
                child.cpu_affinity([0])
        except (psutil.Error, AttributeError, OSError):
            pass


def locust_window(args: list[str], seconds: float, warm: float, out: Path) -> dict[str, float]:
    """One headless Locust process with bench/window.py beside its locustfile: the window's
    {"requests", "seconds", "cpu_s"}."""
    env = {**os.environ, "KNEESWARM_BENCH_OUT": str(out), "KNEESWARM_BENCH_WARM": str(warm),
           "KNEESWARM_BENCH_SPAN": str(max(1.0, seconds - warm - 2.0))}
    proc = subprocess.Popen([sys.executable, "-m", "locust", "--headless", "--loglevel", "ERROR", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=pin(1), env=env)
    deadline = time.monotonic() + seconds + 120
    while proc.poll() is None and time.monotonic() < deadline:
        unpin_children(proc.pid)
        time.sleep(CHILD_PIN_PERIOD)
    if proc.poll() is None:
        proc.kill()
    res = subprocess.CompletedProcess(args, proc.wait(), "", proc.stderr.read() if proc.stderr else "")
    try:
        w = json.loads(out.read_text())
    except (OSError, ValueError):
        raise SystemExit(f"no window measured ({' '.join(args[:2])}): {res.stderr[-1500:]}") from None
    if not w.get("requests"):
        raise SystemExit(f"no requests in the window ({' '.join(args[:2])}): {res.stderr[-1500:]}")
    return w


def bench_case(case: str, url: str, tmp: Path, a: argparse.Namespace) -> dict[str, list[float]]:
    """Per round: requests/s of the floor ("bare"), the same job by hand ("same") and kneeswarm
("ks"), and CPU-seconds per request of each."""
    bare_file = tmp / f"bare-{case}.py"
    same_job = tmp / f"same-job-{case}.py"
    if case in GRPC_PLANS:  # Locust's own gRPC example's way (bench/grpc_cases.py)
        plan_lines = GRPC_PLANS[case]
        bare_file.write_text(bare_source(case, "bare", url))
        same_job.write_text(bare_source(case, "same", url))
    else:
        plan_lines, make, key = PLANS[case]
        bare_file.write_text(BARE.format(make=make))
        same_job.write_text(BARE_CHECKED.format(make=make, key=key) if key else BARE_SSE)
    plan = tmp / f"plan-{case}.toml"
    head, _, request = plan_lines.partition("\n[request]")
    plan.write_text(f'name = "bench"\ntarget = "{url}"\n{head}\n[load]\nsteps = [{a.users}]\nramp = 0.0\n'
                    f"hold = {a.seconds}\nsettle = 0.0\n" + (f"[request]{request}\n" if request else ""))
    locust_args = ["--host", url, "-u", str(a.users), "-r", str(a.users), "-t", f"{int(a.seconds)}s"]
    sides = {
        "bare": ["-f", f"{bare_file},{WINDOW}", *locust_args],
        "same": ["-f", f"{same_job},{WINDOW}", *locust_args],
        "ks": ["-f", f"{REPO / 'locustfiles' / 'swarm.py'},{WINDOW}", "--host", url, "--kneeswarm-plan", str(plan),
               "--kneeswarm-out", str(tmp / "runs")],
    }
    out: dict[str, list[float]] = {k: [] for side in sides for k in (side, f"{side}_cpu")}
    for r in range(a.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]  # alternate who goes first (drift)
        got = {side: locust_window(sides[side], a.seconds, a.warm, tmp / f"w-{side}.json") for side in order}
        for side, w in got.items():
            out[side].append(w["requests"] / w["seconds"])
            out[f"{side}_cpu"].append(w["cpu_s"] / w["requests"])
        if a.verbose:
            print(f"  {case} round {r + 1}: " + "   ".join(
                f"{(GRPC_SIDE_NAMES if case in GRPC_PLANS else SIDE_NAMES)[side]} {out[side][-1]:7.0f} req/s ({1e6 * out[f'{side}_cpu'][-1]:5.0f} us CPU/req)"
                for side in sides), flush=True)
    return out


SIDE_NAMES = {"bare": "bare FastHttpUser", "same": "bare FastHttpUser doing the same job", "ks": "kneeswarm"}
GRPC_SIDE_NAMES = {"bare": "Locust's gRPC example", "same": "Locust's gRPC example doing the same job",
                   "ks": "kneeswarm"}


def compare(runs: dict[str, list[float]], base: str, names: dict[str, str] | None = None) -> str:
    """One line: medians of requests/s and CPU per request, kneeswarm against the ``base`` side."""
    m = {k: statistics.median(v) for k, v in runs.items()}
    paired = statistics.median(k / b for k, b in zip(runs["ks"], runs[base]))
    return (f"{(names or SIDE_NAMES)[base]} {m[base]:6.0f} req/s  kneeswarm {m['ks']:6.0f} req/s  ratio "
            f"{m['ks'] / m[base]:.3f} (per round {paired:.3f}; target >= 0.95);  CPU per request: bare "
            f"{1e6 * m[base + '_cpu']:.0f} us, kneeswarm {1e6 * m['ks_cpu']:.0f} us, ratio "
            f"{m[base + '_cpu'] / m['ks_cpu']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each Locust run")
    ap.add_argument("--warm", type=float, default=2.0, help="seconds after the start left out of the window")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="chunks per streamed answer")
    ap.add_argument("--only", default=",".join([*PLANS, *GRPC_PLANS]), help="comma-separated cases")
    ap.add_argument("--channel", default="user", choices=("user", "worker"),
                    help="gRPC: a channel per user (kneeswarm's) or one per worker process (KNEESWARM_BENCH_CHANNEL)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every round")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        serve(a.serve, a.tokens)
        return
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    port, gport = free_port(), free_port()
    os.environ["KNEESWARM_BENCH_CHANNEL"] = a.channel
    target = subprocess.Popen([sys.executable, __file__, "--serve", str(port), "--tokens", str(a.tokens)],
                              preexec_fn=pin(0))
    grpc_target = subprocess.Popen([sys.executable, str(REPO / "bench" / "grpc_cases.py"), "--serve", str(gport),
                                    "--tokens", str(a.tokens)], preexec_fn=pin(0))
    tmp = Path(tempfile.mkdtemp(prefix="kneeswarm-bench-"))
    try:
        time.sleep(1.0)
        for case in a.only.split(","):
            url = f"grpc://127.0.0.1:{gport}" if case in GRPC_PLANS else f"http://127.0.0.1:{port}"
            runs = bench_case(case, url, tmp, a)
            for base in ("bare", "same"):
                names = GRPC_SIDE_NAMES if case in GRPC_PLANS else SIDE_NAMES
                print(f"{case:14s} " + compare(runs, base, names), flush=True)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"medians of {a.rounds} rounds; {os.cpu_count()} cores (load average {load:.1f}), {a.users} users, "
              f"{a.seconds:g}s runs, window {max(1.0, a.seconds - a.warm - 2.0):g}s after {a.warm:g}s, "
              f"{a.tokens} chunks per streamed answer")
    finally:
        target.kill()
        grpc_target.kill()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
