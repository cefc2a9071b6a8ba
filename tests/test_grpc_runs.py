"""Real runs of the gRPC protocols: `kneeswarm run` against a real gRPC server (tests/grpc_server.py:
Triton's and TorchServe's services, with kneeswarm's stubs) whose own record of what it served is
the truth -- one line per request, with the header it came with, and for a stream
the time each response was sent.  The load modes on gRPC rows as on HTTP ones: open loop, a search
(the knee at the server's slots), soak, ``--repeat`` merged, the SLA gate,
compare and history.  And the bad inputs: a wrong model, a wrong shape, a server without
gRPC on that port, a plaintext target for a TLS server and the reverse: one line each, exit 2, no
run directory (so no load)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, only_run_dir, read_summary, run_cli, wait_for
from kneeswarm.analysis.runs.compare import NOT_COMPARABLE, REGRESSED
from kneeswarm.analysis.runs.history import run_history
from kneeswarm.analysis.summary.soak import SOAK_IDS
from kneeswarm.contracts.outcome import EXIT_SLA_FAILED
from kneeswarm.contracts.rundir import REPEAT_JSON, RunDir
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
         hold: float = 3.0, load: str | None = None, more: str = "") -> Path:
    """A plan of one worker; ``load`` replaces the [load] table's lines, ``more`` adds tables."""
    load = load if load is not None else f"steps = {steps}\nramp = 0.5\nhold = {hold}\nsettle = 0.5\nworkers = 1\n"
    p = tmp / "plan.toml"
    p.write_text(f'name = "g"\ntarget = "{target}"\nprotocol = "{protocol}"\n[load]\n{load}[request]\n{request}\n'
                 "[analysis]\nmin_requests = 10\n" + (f"[endpoint]\n{endpoint}\n" if endpoint else "") + more)
    return p


def run(tmp: Path, plan_file: Path, *args: str):
    res = run_cli("run", str(plan_file), "--out", str(tmp / "out"), "-q", *args, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
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


OPEN_RATES = (20.0, 60.0)


def test_open_loop_rows_at_the_asked_rates_from_their_intended_times_and_pushback_as_429(tmp_path):
    """Open loop over gRPC: every arrival is a row starting at its intended time, each step's rows
    at the rate the plan asked, and the server saw them at that rate too; a server that refuses
    beyond 2 calls in flight (RESOURCE_EXHAUSTED) gives rows of status 429, category http_429, as
    many as it refused.  The tensors go typed (contents = "typed"): the server reads them from
    fp32_contents and checks their count against the shape."""
    server = GrpcServer("--max-inflight", "2", "--service-ms", "30")
    load = (f'arrivals = "open"\nrates = [{", ".join(map(str, OPEN_RATES))}]\nsource_rate = 10.0\n'
            'arrival = "constant"\nramp = 0.5\nhold = 3.0\nsettle = 0.5\nworkers = 1\n')
    p = plan(tmp_path, f"grpc://127.0.0.1:{server.port}", "kserve-grpc",
             'model = "double"\ninput_name = "x"\nshape = [1, 8]\ncontents = "typed"\n', load=load)
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
    assert np.median(gaps) < 0.1 and len(rows) >= 0.8 * sum(OPEN_RATES) * 3.0
    # each step: its rows at the asked rate, and the server's own lines (answered or refused, stamped
    # when they ended: at most a 30 ms call later) at that rate over the same window
    steps = RunDir(only_run_dir(tmp_path / "out")).read_steps()
    ends = np.array([float(line.split()[2]) for line in served + refused])
    for rate, (_, step) in zip(OPEN_RATES, steps.iterrows()):
        lo, hi = step.t_steady, step.t_end
        mine = ((rows["t_start"] >= lo) & (rows["t_start"] < hi)).sum() / (hi - lo)
        seen = ((ends >= lo) & (ends < hi)).sum() / (hi - lo)
        print(f"asked {rate} calls/s: rows {mine:.1f}/s, the server's {seen:.1f}/s")
        # constant arrivals: only the window's edges (a call each) and the calls in flight at the stop vary
        assert mine == pytest.approx(rate, rel=0.15) and seen == pytest.approx(rate, rel=0.15), (rate, mine, seen)


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


# -- the rest of the load unchanged on gRPC rows: a search, a repeated run, its SLA gate, compare, history --
KSERVE_DOUBLE = 'model = "double"\ninput_name = "x"\nshape = [1, 8]\n'
# The search: SEARCH_SLOTS calls served at once, SEARCH_SERVICE_MS each (QPS = min(users, slots) / service):
# the knee is at the slots.  From 2 users: 2, 4 (a gain of half the linear one: saturated), 3 (scaling),
# bracket [3, 4].  150 ms: 2 users give 13 rows/s, 50 (a probe's fewest) well inside a probe's 4.5 s of
# rows (max_hold 11 after the settle and the workers' watermark, as tests/test_search_runs.py says), and a
# busy machine's scheduling delay of tens of ms costs a call of 150 ms little.
SEARCH_SLOTS, SEARCH_SERVICE_MS = 3, 150.0
SEARCH_LOAD = ('mode = "search"\nstart = 2\nmax = 64\nhold = "auto"\nmin_hold = 3\nmax_hold = 11\nsettle = 0.5\n'
               'ramp = 0.5\nworkers = 1\n')


@pytest.mark.long
def test_search_brackets_the_knee_at_the_servers_slots(tmp_path):
    """``mode = "search"`` over kserve-grpc: every probe an ordinary step of gRPC rows, the knee
    bracketed at the server's slots, and the rows the calls the server answered."""
    server = GrpcServer("--slots", str(SEARCH_SLOTS), "--service-ms", str(SEARCH_SERVICE_MS))
    try:
        rows = run(tmp_path, plan(tmp_path, f"grpc://127.0.0.1:{server.port}", "kserve-grpc", KSERVE_DOUBLE,
                                  load=SEARCH_LOAD))
    finally:
        lines = server.lines()
    run_dir = only_run_dir(tmp_path / "out")
    s = read_summary(run_dir)
    search = s["search"]
    users = [p["users"] for p in search["probes"]]
    print(users, search["knee_bracket"], search["stopped_because"],
          [(st["users"], st["qps"]) for st in s["steps"]])
    assert list(RunDir(run_dir).read_steps()["users"]) == users and s["complete"]
    lo, hi = search["knee_bracket"]
    assert abs(lo - SEARCH_SLOTS) <= 1 and hi - lo <= 1 and max(users) <= 2 * 2 * SEARCH_SLOTS, search
    served = [line for line in lines if line.startswith("served ModelInfer")]
    # the preflight's one call, and those in flight when the load stopped (at most one per user)
    assert rows["ok"].all() and 0 <= len(served) - 1 - len(rows) <= max(users), (len(served), len(rows))
    for st in s["steps"]:  # each probe's QPS the server's truth, min(users, slots) / service
        if st["valid"]:
            truth = min(st["users"], SEARCH_SLOTS) * 1000.0 / SEARCH_SERVICE_MS
            assert st["qps"] == pytest.approx(truth, rel=0.15), (st["users"], st["qps"], truth)


# The repeated run: 4 slots of 50 ms (the test server's defaults), 2 and 8 users; an SLA no call can
# meet (a P99 below the time the server holds every call), so every run fails it.
REPEAT_SLOTS, REPEAT_SERVICE_MS, REPEAT_STEPS = 4, 50.0, (2, 8)
REPEAT_P99_MS = REPEAT_SERVICE_MS - 10


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    """`kneeswarm run --repeat 2 --fail-on-sla` over kserve-grpc: (its result, the out folder)."""
    tmp = tmp_path_factory.mktemp("grpc-repeat")
    server = GrpcServer("--slots", str(REPEAT_SLOTS), "--service-ms", str(REPEAT_SERVICE_MS))
    p = plan(tmp, f"grpc://127.0.0.1:{server.port}", "kserve-grpc", KSERVE_DOUBLE,
             steps=f"[{', '.join(map(str, REPEAT_STEPS))}]", more=f"[sla]\np99_ms = {REPEAT_P99_MS}\n")
    try:
        res = run_cli("run", str(p), "--repeat", "2", "--cooldown", "1", "--fail-on-sla", "--out", str(tmp / "out"),
                      "-q", timeout=300)
    finally:
        server.lines()
    return res, tmp / "out"


def _series(out: Path) -> tuple[list[Path], Path]:
    """(the run directories in order, the merged result's folder) of the series under ``out``."""
    runs = sorted(p for p in out.iterdir() if (p / "meta.json").is_file())
    (folder,) = [p for p in out.iterdir() if (p / REPEAT_JSON).is_file()]
    return runs, folder


@pytest.mark.long
def test_repeat_2_merges_two_grpc_runs_and_the_sla_gate_fails_both(repeated):
    """Two runs, each an ordinary run directory of gRPC rows, merged: each step's QPS in both runs
    the server's truth (min(users, slots) / service); the SLA, below the server's service time,
    failed by both, so the series exits 3 and so does each run's own analysis with the gate."""
    res, out = repeated
    assert res.returncode == EXIT_SLA_FAILED, res.stderr[-3000:]
    runs, folder = _series(out)
    rep = json.loads((folder / REPEAT_JSON).read_text())
    assert len(runs) == 2 and rep["merged"] == 2 and rep["complete"] and rep["planned"] == 2
    assert [r["sla_passed"] for r in rep["runs"]] == [False, False] and rep["sla"]["passed"] is False
    assert [st["users"] for st in rep["steps"]] == list(REPEAT_STEPS)
    # each run's own summary says which of its steps are valid (on a busy machine a step the generator
    # did not hold is not: Little's law); the merge counts those, and each valid one's QPS is the truth
    valid = {u: sum(st["valid"] for r in runs for st in read_summary(r)["steps"] if st["users"] == u)
             for u in REPEAT_STEPS}
    for st in rep["steps"]:
        truth = min(st["users"], REPEAT_SLOTS) * 1000.0 / REPEAT_SERVICE_MS
        values = [v for v in st["qps"]["values"] if v is not None]
        assert st["ran"] == 2 and st["valid"] == len(values) == valid[st["users"]], (st, valid)
        assert all(v == pytest.approx(truth, rel=0.15) for v in values), (st["users"], st["qps"], truth)
    assert valid[REPEAT_STEPS[0]] >= 1, valid  # 2 users of 4 slots: no queue, nothing for the generator to fall behind on
    for run_dir in runs:
        s = read_summary(run_dir)
        assert s["sla"]["passed"] is False and s["sla"]["best"] is None
        again = run_cli("analyze", str(run_dir), "--fail-on-sla")
        assert again.returncode == EXIT_SLA_FAILED, again.stderr[-2000:]
        # the P99 the gate read is at least the server's service time: no call is answered sooner
        cases = {c.get("name"): c for c in ET.parse(run_dir / "report" / "junit.xml").getroot().iter("testcase")}
        failure = cases[f"p99_ms <= {REPEAT_P99_MS:g}"].find("failure")
        assert failure is not None and float(failure.get("message").split("=")[1].split()[0]) >= REPEAT_SERVICE_MS


@pytest.mark.long
def test_compare_and_history_of_the_two_grpc_runs(repeated, tmp_path):
    """The same server twice: compare finds no regression (exit 0 with the gate), and the history
    reads the series as one point."""
    _, out = repeated
    (first, second), folder = _series(out)
    res = run_cli("compare", str(first), str(second), "--fail-on-regression", "--out", str(tmp_path / "cmp"), "-q")
    assert res.returncode == 0, res.stderr[-2000:]
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert cmp["verdict"] not in (REGRESSED, NOT_COMPARABLE) and len(cmp["steps"]) == len(REPEAT_STEPS), cmp["verdict"]
    result, _ = run_history([out], out=str(tmp_path / "history"))
    (group,) = result["groups"]
    assert [r["run_id"] for r in group["runs"]] == [folder.name]


SOAK_LOAD = 'mode = "soak"\nusers = 2\nduration = 14\nwindow = 2\nramp = 1\nsettle = 1\nworkers = 1\n'
SOAK_WINDOWS = 7


@pytest.mark.long
def test_soak_over_grpc_tiles_its_windows_with_the_servers_series(tmp_path):
    """``mode = "soak"`` over kserve-grpc: one step per window, each window's QPS the rows' own count
    over its length and the server's truth (2 users on 4 slots of 50 ms: 40/s), the monitored
    server's RSS a series per window, and a steady server given no soak finding."""
    server = GrpcServer("--slots", "4", "--service-ms", "50")
    try:
        rows = run(tmp_path, plan(tmp_path, f"grpc://127.0.0.1:{server.port}", "kserve-grpc", KSERVE_DOUBLE,
                                  load=SOAK_LOAD), "--pid", str(server.proc.pid))
    finally:
        server.lines()
    s = read_summary(only_run_dir(tmp_path / "out"))
    windows = s["steps"]
    assert len(windows) == SOAK_WINDOWS and s["soak"]["windows"] == SOAK_WINDOWS
    t, ok = rows["t_start"].to_numpy(), rows["ok"].to_numpy(bool)
    for w in windows:
        m = (t >= w["t_lo"]) & (t < w["t_hi"])
        assert w["requests"] == int(m.sum()) and w["qps"] == pytest.approx((m & ok).sum() / w["window_s"], rel=1e-9)
    valid = [w["qps"] for w in windows if w["valid"]]
    assert valid and all(q == pytest.approx(2 * 1000.0 / 50, rel=0.15) for q in valid), valid
    rss = s["soak"]["series"]["hosts"]["local"]["rss_mb"]
    assert len(rss) == SOAK_WINDOWS and all(v is not None and v > 0 for v in rss), rss
    assert not {f["id"] for f in s["findings"]} & set(SOAK_IDS), s["findings"]
