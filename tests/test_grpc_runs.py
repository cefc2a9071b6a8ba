"""Real runs of the gRPC protocols: `kneeswarm run` against a real gRPC server (tests/grpc_server.py:
Triton's and TorchServe's services, with kneeswarm's stubs) whose own record of what it served is
the truth -- one line per request, with the header it came with, and for a stream
the time each response was sent.  And the bad inputs: a wrong model, a wrong shape, a server without
gRPC on that port, a plaintext target for a TLS server and the reverse: one line each, exit 2, no
run directory (so no load)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, only_run_dir, run_cli, wait_for
from tls_proxy import DEMO_HOST, make_pki

pytestmark = pytest.mark.slow

SERVER = Path(__file__).with_name("grpc_server.py")
RESPONSES, PACE_MS = 6, 50.0
USERS = 2  # every run's one step
INFLIGHT_AT_STOP = 6  # open loop at 60/s, calls of 30 ms: a few in flight when the load stops


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GrpcServer:
    def __init__(self, *args: str):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(self.port), "--responses", str(RESPONSES),
                                      "--pace-ms", str(PACE_MS), *args], stdout=subprocess.PIPE, text=True, cwd=REPO)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "serving"

    def lines(self) -> list[str]:
        """What it printed since it started (it is stopped first: its output is then complete)."""
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return out.splitlines()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def plan(tmp: Path, target: str, protocol: str, request: str, endpoint: str = "", steps: str = "[2]",
         hold: float = 3.0) -> Path:
    p = tmp / "plan.toml"
    p.write_text(f'name = "g"\ntarget = "{target}"\nprotocol = "{protocol}"\n[load]\nsteps = {steps}\nramp = 0.5\n'
                 f"hold = {hold}\nsettle = 0.5\nworkers = 1\n[request]\n{request}\n[analysis]\nmin_requests = 10\n"
                 + (f"[endpoint]\n{endpoint}\n" if endpoint else ""))
    return p


def run(tmp: Path, plan_file: Path, *args: str):
    res = run_cli("run", str(plan_file), "--out", str(tmp / "out"), "-q", *args, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    from kneeswarm.contracts.rundir import RunDir

    return RunDir(only_run_dir(tmp / "out")).read_requests()


def test_triton_stream_times_each_response_against_the_servers_own(tmp_path):
    server = GrpcServer()
    try:
        rows = run(tmp_path, plan(tmp_path, f"grpc://127.0.0.1:{server.port}", "triton-stream",
                                  'model = "tokens"\n[[request.inputs]]\nname = "text_input"\ndatatype = "BYTES"\n'
                                  'shape = [1]\ndata = ["{{prompt}}"]\n'))
    finally:
        lines = server.lines()
    served = [line for line in lines if line.startswith("served ModelStreamInfer")]
    stamps = [[float(x) for x in line.split()[1::2]] for line in lines if line.startswith("recv ")]
    # the server served the preflight's request too, and those in flight when the load stopped (at most
    # one per user) were served but never recorded
    assert rows["ok"].all() and 0 <= len(served) - 1 - len(rows) <= USERS
    assert (rows["chunks_out"] == RESPONSES).all() and (rows["tokens_out"] == RESPONSES).all()
    assert rows["tokens_counted"].all() and (rows["tokens_in"] == 32).all() and (rows["status"] == 200).all()
    server_ttft = np.median([(s[1] - s[0]) * 1000.0 for s in stamps])
    server_itl = np.median(np.concatenate([np.diff(s[1:]) * 1000.0 for s in stamps]))
    client_ttft = rows["ttft_ms"].median()
    client_itl = np.median(np.concatenate(rows["itl_ms"].to_numpy()))
    # the first response, not the request's end (that is RESPONSES x PACE_MS later); the client's own
    # scheduling on a busy machine (this server shares its cores) may add a few ms, never a response's gap
    assert server_ttft <= client_ttft <= server_ttft + PACE_MS / 2, (client_ttft, server_ttft)
    assert client_itl == pytest.approx(server_itl, rel=0.10), (client_itl, server_itl)
    assert (rows["latency_ms"] >= RESPONSES * PACE_MS).all()  # the server's pace alone takes that long


def test_kserve_grpc_over_mutual_tls_with_metadata(tmp_path, pki, monkeypatch):
    server = GrpcServer("--tls", str(pki.server_cert), str(pki.server_key), "--client-ca", str(pki.ca))
    monkeypatch.setenv("KS_TEST_SECRET", "s3cret-not-for-logs")
    endpoint = (f'ca_bundle = "{pki.ca}"\nclient_cert = "{pki.client_cert}"\nclient_key = "{pki.client_key}"\n'
                f'server_name = "{DEMO_HOST}"\nheaders = {{Host = "models.example"}}\n'
                'headers_env = {X-Test-Header = "KS_TEST_SECRET"}\n')
    try:
        rows = run(tmp_path, plan(tmp_path, f"grpcs://127.0.0.1:{server.port}", "kserve-grpc",
                                  'model = "double"\ninput_name = "x"\nshape = [1, 8]\n', endpoint))
    finally:
        lines = server.lines()
    served = [line.split() for line in lines if line.startswith("served ModelInfer")]
    assert rows["ok"].all() and (rows["status"] == 200).all() and 0 <= len(served) - 1 - len(rows) <= USERS
    assert {s[5] for s in served} == {"s3cret-not-for-logs"}  # the secret header, as call metadata
    # a connection per user (grpcuser.CHANNEL_SCOPE "user": grpc would share one among a process's
    # channels without a local subchannel pool), and the preflight's own
    assert len({s[4] for s in served}) == USERS + 1, {s[4] for s in served}
    run_dir = only_run_dir(tmp_path / "out")
    assert "s3cret" not in (run_dir / "plan.toml").read_text()


def test_torchserve_grpc_rows_are_the_servers_predictions(tmp_path):
    server = GrpcServer()
    try:
        rows = run(tmp_path, plan(tmp_path, f"grpc://127.0.0.1:{server.port}", "torchserve-grpc",
                                  'model = "echo"\nshape = [1, 4]\n'))
    finally:
        lines = server.lines()
    served = [line for line in lines if line.startswith("served Predictions")]
    assert rows["ok"].all() and 0 <= len(served) - 1 - len(rows) <= USERS and rows["ttft_ms"].isna().all()


def test_open_loop_rows_from_their_intended_times_and_pushback_as_429(tmp_path):
    """Open loop over gRPC: every arrival is a row starting at its intended time; a server that
    refuses beyond 2 calls in flight (RESOURCE_EXHAUSTED) gives rows of status 429, category
    http_429, as many as it refused.  The tensors go typed (contents = "typed"): the server reads
    them from fp32_contents and checks their count against the shape."""
    server = GrpcServer("--max-inflight", "2", "--service-ms", "30")
    load = ('arrivals = "open"\nrates = [20.0, 60.0]\nsource_rate = 10.0\narrival = "constant"\n')
    p = plan(tmp_path, f"grpc://127.0.0.1:{server.port}", "kserve-grpc",
             'model = "double"\ninput_name = "x"\nshape = [1, 8]\ncontents = "typed"\n')
    p.write_text(p.read_text().replace("steps = [2]\n", load))
    try:
        rows = run(tmp_path, p)
    finally:
        lines = server.lines()
    served = [line for line in lines if line.startswith("served ModelInfer")]
    refused = [line for line in lines if line.startswith("refused ModelInfer")]
    pushed = rows[rows["error"] == "http_429"]
    assert len(pushed) > 10 and (pushed["status"] == 429).all() and set(rows["error"].dropna()) == {"http_429"}
    # the preflight's one request; calls in flight when the load stopped were answered after the
    # worker's last report (the server's lines count them, no row does)
    # at most the arrival rate times the longest call can be in flight at the stop
    in_flight = max(INFLIGHT_AT_STOP, 60.0 * rows["latency_ms"].max() / 1000.0 + 2)
    assert 0 <= len(refused) - len(pushed) <= in_flight, (len(refused), len(pushed), in_flight)
    assert 0 <= len(served) - 1 - rows["ok"].sum() <= in_flight, (len(served), rows["ok"].sum(), in_flight)
    # constant arrivals: each source's rows start 1 / source_rate apart, whatever the latency
    gaps = np.diff(np.sort(rows["t_start"].to_numpy()))
    assert np.median(gaps) < 0.1 and len(rows) >= 0.8 * (20.0 + 60.0) * 3.0


@pytest.fixture(scope="module")
def servers(pki):
    plain, tls = GrpcServer(), GrpcServer("--tls", str(pki.server_cert), str(pki.server_key))
    http_port = free_port()
    http = subprocess.Popen([sys.executable, "-m", "http.server", str(http_port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def http_up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_for(http_up, 10, "the HTTP server")
    yield plain.port, tls.port, http_port
    for s in (plain, tls):
        s.lines()
    http.terminate()
    http.wait(timeout=10)


@pytest.mark.parametrize("case,said", [
    ("wrong model", "model 'nope' is not served"),
    ("wrong shape", "input 'x' has shape [-1, -1], the plan sends [8]"),
    ("no gRPC there", "answers HTTP/1.1, not gRPC"),
    ("plaintext to TLS", "the server speaks TLS on that port (the target should be grpcs://)"),
    ("TLS to plaintext", "does not speak TLS on that port"),
])
def test_bad_input_is_one_line_before_any_load(tmp_path, servers, pki, case, said):
    plain, tls, http = servers
    target, request, endpoint = f"grpc://127.0.0.1:{plain}", 'model = "double"\ninput_name = "x"\nshape = [1, 8]\n', ""
    if case == "wrong model":
        request = 'model = "nope"\ninput_name = "x"\n'
    elif case == "wrong shape":
        request = 'model = "double"\ninput_name = "x"\nshape = [8]\n'
    elif case == "no gRPC there":
        target = f"grpc://127.0.0.1:{http}"
    elif case == "plaintext to TLS":
        target = f"grpc://127.0.0.1:{tls}"
    else:
        target, endpoint = f"grpcs://127.0.0.1:{plain}", f'ca_bundle = "{pki.ca}"\n'
    t0 = time.monotonic()
    res = run_cli("run", str(plan(tmp_path, target, "kserve-grpc", request, endpoint)), "--out",
                  str(tmp_path / "out"), "-q", timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and said in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out").exists()
    assert time.monotonic() - t0 < 60  # said at once, not after the connection wait
