"""The bundled demo target, run for real: server processes on port 0, real HTTP clients."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 15.0
INPUT = [((i * 37) % 101) / 50.0 - 1.0 for i in range(64)]


@dataclass
class Target:
    proc: subprocess.Popen
    url: str
    first_line: str
    stderr_path: str

    def stderr(self) -> str:
        with open(self.stderr_path, errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def running_target(tmp_path, *args: str) -> Iterator[Target]:
    """Start ``python -m kneeswarm.target --port 0 ARGS``, read its URL, always stop it."""
    stderr_path = str(tmp_path / f"target-{time.monotonic_ns()}.err")
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kneeswarm.target", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    target = None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("kneeswarm target listening on "):
            with open(stderr_path, errors="replace") as f:
                pytest.fail(f"target did not start: stdout {line!r}, stderr {f.read()[-2000:]!r}")
        target = Target(proc, line.split()[4], line.strip(), stderr_path)
        yield target
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        proc.stdout.close()


def infer_body(data: list[float] | None = None, shape: list[int] | None = None, **over) -> dict:
    tensor = {"name": "input", "shape": shape or [1, 64], "datatype": "FP32", "data": data or INPUT}
    tensor.update(over)
    return {"inputs": [tensor]}


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics, keyed like 'name{label="v"}' (labels sorted), parsed for real."""
    text = requests.get(f"{url}/metrics", timeout=REQUEST_TIMEOUT_S).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


@dataclass
class LoadResult:
    statuses: Counter = field(default_factory=Counter)
    ok_times: list[float] = field(default_factory=list)  # completion times of 200s, monotonic
    errors: list[str] = field(default_factory=list)


def closed_loop(url: str, users: int, duration_s: float, body: dict) -> LoadResult:
    """``users`` threads, each with its own Session, sending back-to-back until time is up."""
    result = LoadResult()
    lock = threading.Lock()
    payload = json.dumps(body)
    start = threading.Barrier(users + 1)
    stop_at = [0.0]

    def user() -> None:
        with requests.Session() as s:
            start.wait()
            while time.monotonic() < stop_at[0]:
                try:
                    r = s.post(
                        f"{url}/v2/models/demo/infer",
                        data=payload,
                        headers={"Content-Type": "application/json"},
                        timeout=REQUEST_TIMEOUT_S,
                    )
                except requests.RequestException as exc:
                    with lock:
                        result.errors.append(repr(exc))
                    continue
                done = time.monotonic()
                with lock:
                    result.statuses[r.status_code] += 1
                    if r.status_code == 200:
                        result.ok_times.append(done)

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + duration_s
    start.wait()
    for t in threads:
        t.join(duration_s + 2 * REQUEST_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "client threads did not finish"
    return result


# -- onnx mode ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def onnx_target(tmp_path_factory) -> Iterator[Target]:
    with running_target(tmp_path_factory.mktemp("onnx"), "--work", "4") as target:
        yield target


def test_first_line_names_url_mode_and_pid(onnx_target):
    assert onnx_target.url.startswith("http://127.0.0.1:")
    assert onnx_target.first_line.endswith(f"mode=onnx pid={onnx_target.proc.pid}")


def test_health_and_metadata(onnx_target):
    url = onnx_target.url
    assert requests.get(f"{url}/v2/health/live", timeout=5).status_code == 200
    assert requests.get(f"{url}/v2/health/ready", timeout=5).status_code == 200
    assert requests.get(f"{url}/v2/models/demo/ready", timeout=5).status_code == 200
    meta = requests.get(f"{url}/v2/models/demo", timeout=5).json()
    assert meta["name"] == "demo"
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
    assert meta["outputs"][0]["name"] == "output"


def test_infer_round_trip_is_deterministic(onnx_target):
    url = f"{onnx_target.url}/v2/models/demo/infer"
    first = requests.post(url, json={**infer_body(), "id": "req-1"}, timeout=REQUEST_TIMEOUT_S)
    second = requests.post(url, json=infer_body(), timeout=REQUEST_TIMEOUT_S)
    assert first.status_code == second.status_code == 200
    a, b = first.json(), second.json()
    assert a["model_name"] == "demo" and a["id"] == "req-1"
    (out,) = a["outputs"]
    assert out["name"] == "output" and out["datatype"] == "FP32"
    assert out["shape"] == [1, 16] and len(out["data"]) == 16
    assert out["data"] == b["outputs"][0]["data"]
    assert any(v != 0.0 for v in out["data"])


def test_infer_accepts_any_batch_size(onnx_target):
    url = f"{onnx_target.url}/v2/models/demo/infer"
    single = requests.post(url, json=infer_body(), timeout=REQUEST_TIMEOUT_S).json()
    r = requests.post(url, json=infer_body(INPUT * 3, [3, 64]), timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200
    out = r.json()["outputs"][0]
    assert out["shape"] == [3, 16] and len(out["data"]) == 48
    assert out["data"][16:32] == pytest.approx(single["outputs"][0]["data"], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize(
    "body",
    [
        b"this is not json",
        b"[1, 2, 3]",
        b'{"inputs": []}',
        json.dumps(infer_body(shape=[1, 63])).encode(),
        json.dumps(infer_body(shape=[64])).encode(),
        json.dumps(infer_body(datatype="INT64")).encode(),
        json.dumps(infer_body(data=INPUT[:10])).encode(),
        json.dumps(infer_body(data=["x"] * 64)).encode(),
        json.dumps(infer_body(name="tokens")).encode(),
    ],
    ids=["garbage", "not-object", "no-inputs", "wrong-width", "1-d", "datatype", "short-data",
         "strings", "input-name"],
)
def test_bad_request_is_400_json(onnx_target, body):
    r = requests.post(f"{onnx_target.url}/v2/models/demo/infer", data=body, timeout=5)
    assert r.status_code == 400
    assert r.json()["error"]


def test_unknown_model_is_404_json(onnx_target):
    url = onnx_target.url
    for r in (
        requests.post(f"{url}/v2/models/nope/infer", json=infer_body(), timeout=5),
        requests.get(f"{url}/v2/models/nope", timeout=5),
        requests.get(f"{url}/v2/models/nope/ready", timeout=5),
    ):
        assert r.status_code == 404
        assert "nope" in r.json()["error"]


def test_metrics_parse_and_name_the_saturation_group(onnx_target):
    requests.post(f"{onnx_target.url}/v2/models/demo/infer", json=infer_body(), timeout=5)
    m = metrics(onnx_target.url)
    assert m['kneeswarm_target_requests_total{code="200"}'] >= 1
    for name in (
        "kneeswarm_target_rejected_total",
        "kneeswarm_target_inflight",
        "kneeswarm_target_queue_length",
        "kneeswarm_target_request_duration_seconds_count",
        "kneeswarm_target_inference_duration_seconds_count",
        "kneeswarm_target_batch_size_count",
        "kneeswarm_target_workers",
    ):
        assert name in m, name
    assert m["kneeswarm_target_workers"] == 4
    assert not any(k.endswith("_created") for k in m)


def test_micro_batching_batches_and_keeps_answers(tmp_path):
    with running_target(
        tmp_path, "--work", "2", "--request-threads", "1", "--batch-max", "8",
        "--batch-wait-ms", "20",
    ) as target:
        url = f"{target.url}/v2/models/demo/infer"
        expected = requests.post(url, json=infer_body(), timeout=REQUEST_TIMEOUT_S).json()
        result = closed_loop(target.url, users=8, duration_s=1.0, body=infer_body())
        assert set(result.statuses) == {200} and not result.errors
        after = requests.post(url, json=infer_body(), timeout=REQUEST_TIMEOUT_S).json()
        assert after["outputs"][0]["data"] == pytest.approx(
            expected["outputs"][0]["data"], rel=1e-4, abs=1e-5
        )
        m = metrics(target.url)
    runs, rows = m["kneeswarm_target_batch_size_count"], m["kneeswarm_target_batch_size_sum"]
    assert rows == result.statuses[200] + 2
    assert rows / runs > 1.5  # requests really were run together
    # Triton's names tell the same: items inferred vs model executions.
    assert m['nv_inference_count{model="demo",version="1"}'] == rows
    assert m['nv_inference_exec_count{model="demo",version="1"}'] == runs
    assert m['nv_inference_request_success{model="demo",version="1"}'] == result.statuses[200] + 2


# -- knee mode and the bounded queue ------------------------------------------------------------
def test_knee_mode_serves_slots_over_service_time(tmp_path):
    slots, service_ms, users, duration = 4, 50, 16, 3.0
    with running_target(
        tmp_path, "--mode", "knee", "--slots", str(slots), "--service-ms", str(service_ms)
    ) as target:
        t0 = time.monotonic()
        result = closed_loop(target.url, users=users, duration_s=duration, body=infer_body())
        m = metrics(target.url)
    assert not result.errors and set(result.statuses) == {200}
    # Throughput in a window clear of the start, while all users were still sending.
    lo, hi = t0 + 0.5, t0 + duration - 0.2
    window = [t for t in result.ok_times if lo <= t < hi]
    qps = len(window) / (hi - lo)
    print(f"knee mode: {qps:.1f} req/s measured, {slots * 1000 / service_ms:.1f} expected")
    expected = slots * 1000 / service_ms
    assert qps == pytest.approx(expected, rel=0.15)
    assert m['kneeswarm_target_requests_total{code="200"}'] == result.statuses[200]
    assert m["kneeswarm_target_rejected_total"] == 0
    assert m["kneeswarm_target_inflight"] == 0 and m["kneeswarm_target_queue_length"] == 0


def test_knee_mode_accepts_any_inputs_and_answers_without_delayed_ack_stalls(tmp_path):
    with running_target(tmp_path, "--mode", "knee", "--service-ms", "1") as target:
        url = f"{target.url}/v2/models/demo/infer"
        meta = requests.get(f"{target.url}/v2/models/demo", timeout=5).json()
        assert meta["platform"] == "kneeswarm_knee"
        assert requests.post(url, data=b"nope", timeout=5).status_code == 400
        latencies = []
        with requests.Session() as s:
            for _ in range(15):
                started = time.perf_counter()
                body = {"inputs": [{"name": "whatever", "data": [1, 2, 3]}]}
                r = s.post(url, json=body, timeout=5)
                latencies.append(time.perf_counter() - started)
                assert r.status_code == 200 and r.json()["outputs"][0]["name"] == "output"
    # Without TCP_NODELAY on accepted sockets every response stalls ~40 ms on delayed ACK.
    assert sorted(latencies)[len(latencies) // 2] < 0.035, latencies


@pytest.mark.parametrize(
    "args",
    [
        ["--mode", "knee", "--slots", "1", "--service-ms", "40", "--queue-size", "2"],
        ["--work", "10", "--request-threads", "1", "--queue-size", "1"],
    ],
    ids=["knee", "onnx"],
)
def test_full_queue_answers_503_and_counts_rejections(tmp_path, args):
    with running_target(tmp_path, *args) as target:
        result = closed_loop(target.url, users=12, duration_s=1.5, body=infer_body())
        m = metrics(target.url)
    assert not result.errors
    assert result.statuses[503] > 0 and result.statuses[200] > 0
    assert set(result.statuses) == {200, 503}
    assert m["kneeswarm_target_rejected_total"] == result.statuses[503]
    assert m['kneeswarm_target_requests_total{code="503"}'] == result.statuses[503]
    assert m['kneeswarm_target_requests_total{code="200"}'] == result.statuses[200]
    assert m["kneeswarm_target_queue_capacity"] == int(args[args.index("--queue-size") + 1])


# -- process life -------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_cleanly_with_exit_0(tmp_path, sig):
    with running_target(tmp_path, "--mode", "knee") as target:
        assert requests.get(f"{target.url}/v2/health/ready", timeout=5).status_code == 200
        target.proc.send_signal(sig)
        assert target.proc.wait(STOP_TIMEOUT_S) == 0, target.stderr()
        assert "Traceback" not in target.stderr()


@pytest.mark.parametrize(
    "args", [["--slots", "0"], ["--mode", "gpu"], ["--service-ms", "-5"], ["--port", "x"],
             ["--mode", "usl", "--sigma", "1.5"], ["--mode", "usl", "--kappa", "-0.1"], ["--warmup-s", "-1"],
             ["--mode", "prefork", "--workers", "0"], ["--mode", "prefork", "--cpu-ms", "0"]]
)
def test_bad_arguments_exit_2_with_one_line(args):
    proc = subprocess.run(
        [sys.executable, "-m", "kneeswarm.target", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0]


def test_help_documents_the_knobs():
    proc = subprocess.run(
        [sys.executable, "-m", "kneeswarm.target", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    for flag in ("--mode", "--port", "--request-threads", "--queue-size", "--intra-op-threads",
                 "--inter-op-threads", "--batch-max", "--batch-wait-ms", "--slots", "--service-ms",
                 "--work", "--model-name", "--ttft-ms", "--itl-ms", "--output-tokens", "--api-key-env",
                 "--fail-rate", "--reset-rate", "--truncate-rate", "--stall-ms", "--stall-every", "--fail-above",
                 "--sigma", "--kappa", "--warmup-s", "--warmup-extra-ms",
                 "--kv-tokens", "--max-batch", "--prefill-ms-per-token", "--decode-ms", "--decode-ms-per-seq"):
        assert flag in proc.stdout


def test_main_is_importable_without_onnx_side_effects():
    code = (
        "import sys, kneeswarm.target.server as s;"
        "print(callable(s.main), 'onnxruntime' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False"]


# -- the other protocols, the API key and injected faults -----------------------------------------
ROW = [round(((i * 13) % 17) / 17.0, 3) for i in range(64)]


@pytest.fixture(scope="module")
def llm_target(tmp_path_factory) -> Iterator[Target]:
    with running_target(tmp_path_factory.mktemp("llm"), "--work", "1", "--hidden", "64", "--tokens", "1",
                        "--output-tokens", "3", "--itl-ms", "1") as target:
        yield target


def sse_events(text: str) -> list[str]:
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def test_openai_stream_follows_vllm_chunks_and_counts_tokens(llm_target):
    url = llm_target.url
    before = metrics(url)
    body = {"model": "demo", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True}}
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert len(texts) == 3 and all(texts)  # --output-tokens 3 ends the generation before max_tokens
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    after = metrics(url)
    assert after["vllm:prompt_tokens_total"] - before.get("vllm:prompt_tokens_total", 0) == 4
    assert after["vllm:generation_tokens_total"] - before.get("vllm:generation_tokens_total", 0) == 3


def test_openai_whole_answers_pin_length_and_refuse_unknown_models(llm_target):
    url = llm_target.url
    r = requests.post(f"{url}/v1/completions", json={"model": "demo", "prompt": "a b", "max_tokens": 6,
                                                      "ignore_eos": True}, timeout=REQUEST_TIMEOUT_S).json()
    assert r["usage"]["completion_tokens"] == 6 and len(r["choices"][0]["text"].split()) == 6
    assert r["choices"][0]["finish_reason"] == "length"
    r = requests.post(f"{url}/v1/completions", json={"model": "demo", "prompt": "a", "max_tokens": 6,
                                                      "min_tokens": 5}, timeout=REQUEST_TIMEOUT_S).json()
    assert r["usage"]["completion_tokens"] == 5
    assert requests.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"] == "demo"
    missing = requests.post(f"{url}/v1/chat/completions", json={"model": "x", "messages": [{"content": "a"}]},
                            timeout=5)
    assert missing.status_code == 404 and "x" in missing.json()["message"]
    for bad in ({"model": "demo"}, {"model": "demo", "messages": [{"content": "a"}], "max_tokens": 0}):
        assert requests.post(f"{url}/v1/chat/completions", json=bad, timeout=5).status_code == 400


def test_torchserve_and_tfserving_answer_with_the_same_model(llm_target):
    url = llm_target.url
    ts = requests.post(f"{url}/predictions/demo", json={"data": [ROW, ROW]}, timeout=REQUEST_TIMEOUT_S)
    tf = requests.post(f"{url}/v1/models/demo:predict", json={"instances": [ROW]}, timeout=REQUEST_TIMEOUT_S)
    kserve = requests.post(f"{url}/v2/models/demo/infer", json=infer_body(ROW), timeout=REQUEST_TIMEOUT_S)
    assert ts.status_code == tf.status_code == kserve.status_code == 200
    expected = kserve.json()["outputs"][0]["data"]
    assert ts.json()["predictions"][1] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert tf.json()["predictions"][0] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert requests.get(f"{url}/ping", timeout=5).json() == {"status": "Healthy"}
    ts_served = metrics(url)['ts_inference_requests_total{model_name="demo",model_version="default"}']
    assert ts_served >= 1 and metrics(url)['ts_inference_latency_microseconds{model_name="demo",model_version="default"}'] > 0
    status = requests.get(f"{url}/v1/models/demo", timeout=5).json()["model_version_status"][0]
    assert status["state"] == "AVAILABLE"
    assert requests.post(f"{url}/predictions/nope", json={"data": [ROW]}, timeout=5).status_code == 404
    assert requests.post(f"{url}/v1/models/nope:predict", json={"instances": [ROW]}, timeout=5).status_code == 404
    assert requests.get(f"{url}/v1/models/nope", timeout=5).status_code == 404
    assert requests.post(f"{url}/predictions/demo", json={"data": [[1, 2]]}, timeout=5).status_code == 400


def test_api_key_is_required_except_for_health_and_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("KS_TARGET_KEY", "k-123")
    with running_target(tmp_path, "--mode", "knee", "--service-ms", "1", "--api-key-env", "KS_TARGET_KEY") as t:
        url = f"{t.url}/v2/models/demo/infer"
        assert requests.post(url, json=infer_body(), timeout=5).status_code == 401
        assert requests.post(url, json=infer_body(), headers={"Authorization": "Bearer nope"}, timeout=5).status_code == 401
        assert requests.post(url, json=infer_body(), headers={"Authorization": "Bearer k-123"}, timeout=5).status_code == 200
        assert requests.get(f"{t.url}/v2/health/ready", timeout=5).status_code == 200
        m = metrics(t.url)
    assert m['kneeswarm_target_auth_total{result="rejected"}'] == 2 and m['kneeswarm_target_auth_total{result="ok"}'] == 1


def test_faults_fail_reset_and_stall_are_counted(tmp_path):
    with running_target(tmp_path, "--mode", "knee", "--service-ms", "1", "--fail-rate", "0.3",
                        "--reset-rate", "0.3", "--fault-seed", "3") as t:
        seen: Counter = Counter()
        for _ in range(60):
            try:
                r = requests.post(f"{t.url}/v2/models/demo/infer", json=infer_body(), timeout=5)
                seen[r.status_code] += 1
            except requests.ConnectionError:
                seen["reset"] += 1
        m = metrics(t.url)
    assert seen["reset"] == m['kneeswarm_target_faults_total{kind="reset"}'] > 0
    assert seen[500] == m['kneeswarm_target_faults_total{kind="fail"}'] > 0
    assert seen[200] + seen[500] + seen["reset"] == 60
    with running_target(tmp_path, "--mode", "knee", "--service-ms", "1", "--stall-ms", "300",
                        "--stall-every", "0.6") as t:
        times: list[float] = []
        end = time.perf_counter() + 1.5  # covers two or three stall windows
        while time.perf_counter() < end:
            started = time.perf_counter()
            requests.post(f"{t.url}/v2/models/demo/infer", json=infer_body(), timeout=5)
            times.append(time.perf_counter() - started)
        m = metrics(t.url)
    stalled = sum(1 for x in times if x > 0.05)
    assert stalled == m['kneeswarm_target_faults_total{kind="stall"}'] >= 2


@pytest.mark.parametrize("args", [["--fail-rate", "1.5"], ["--itl-ms", "-1"], ["--output-tokens", "x"],
                                  ["--kv-tokens", "1"], ["--max-batch", "0"], ["--decode-ms", "0"],
                                  ["--decode-ms-per-seq", "-1"], ["--prefill-ms-per-token", "x"]])
def test_bad_fault_and_llm_arguments_exit_2(args):
    proc = subprocess.run([sys.executable, "-m", "kneeswarm.target", *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


# -- pre-fork mode -------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    import psutil

    return sorted(c.pid for c in psutil.Process(pid).children())


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return sum(int(x) for x in text[text.rfind(")") + 2:].split()[11:13])


def test_prefork_workers_are_processes_each_request_costing_its_cpu(tmp_path):
    """N worker processes under the listener, one thread each; a request costs a worker at least
    --cpu-ms of its own CPU (the kernel's utime + stime, not a sleep); --max-requests recycles."""
    with running_target(tmp_path, "--mode", "prefork", "--workers", "3", "--cpu-ms", "40", "--max-requests", "5") as t:
        assert t.first_line.endswith(f"mode=prefork pid={t.proc.pid}")
        workers = _children(t.proc.pid)
        assert len(workers) == 3 and all(len(os.listdir(f"/proc/{w}/task")) == 1 for w in workers)
        before = {w: _ticks(w) for w in workers}
        body = {"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.0, 1.0]}]}
        for _ in range(4):
            r = requests.post(f"{t.url}/v2/models/demo/infer", json=body, timeout=REQUEST_TIMEOUT_S)
            assert r.status_code == 200 and r.headers["Connection"] == "close"
            assert r.json()["outputs"][0]["shape"] == [1, 1]
        used = sum(_ticks(w) - before[w] for w in workers)
        assert used >= 4 * 4 - 2, used  # 40 ms each, in 10 ms ticks (a tick lost to rounding per worker)
        assert requests.get(f"{t.url}/v2/health/ready", timeout=5).status_code == 200
        assert requests.post(f"{t.url}/v2/models/other/infer", json=body, timeout=5).status_code == 404
        for _ in range(15):  # 19 inference requests in all: at least one worker served its 5 and left
            requests.post(f"{t.url}/predictions/demo", json={"data": [[1]]}, timeout=REQUEST_TIMEOUT_S)
        deadline = time.monotonic() + 10
        while set(_children(t.proc.pid)) & set(workers) == set(workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        now = _children(t.proc.pid)
        assert len(now) == 3 and set(now) != set(workers)  # replaced, and still three
        t.proc.send_signal(signal.SIGTERM)
        assert t.proc.wait(STOP_TIMEOUT_S) == 0
        assert not any(os.path.exists(f"/proc/{w}") and _state(w) != "Z" for w in now)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
