"""The plan's [endpoint] through a real TLS-terminating proxy (Debian's nginx, tests/tls_proxy.py)
in front of the real demo target, all on loopback: a private CA, a virtual server routed by Host
under a gateway prefix with a secret header, a server that requires a client certificate, and one
whose certificate names the service only.

Truth is the target's own request counter (read from the target directly, not through the
proxy) and nginx's access log (which Host each request carried)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kneeswarm.launch import cli, conductor
from kneeswarm.launch.cli import start_target, stop_target
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import load_plan, plan_from_dict
from kneeswarm.contracts.rundir import RunDir

from conftest import KNEESWARM, REPO, one_error_line, read_summary, side_by_side
from tls_proxy import BASE_PATH, DEMO_HOST, TOKEN, TOKEN_HEADER, TlsProxy, make_pki

TOKEN_ENV = "KS_TEST_GATEWAY_TOKEN"
#: The knee target's service time (KServe) and token gap (OpenAI, 8 tokens): requests of 30-40 ms,
#: long enough that a worker clock's error bound (a few ms on a busy machine) stays under 10 % of
#: P50 (kneeswarm.analysis.measure.trust).  1 user then makes ~30 requests/s, ~60 in a 2 s steady window: a step is
#: trusted from 40.
SERVICE_MS, ITL_MS = 30, 5
SMALL_STEPS = {"min_requests": 40}
SERVED = "kneeswarm_target_requests_total"


class Proxied:
    def __init__(self, tmp: Path):
        self.pki = make_pki(tmp / "pki")
        self.target, self.target_url = start_target(["--mode", "knee", "--slots", "4", "--service-ms",
                                                      str(SERVICE_MS), "--itl-ms", str(ITL_MS)])
        try:
            self.proxy = TlsProxy.start(tmp / "nginx", self.pki, int(self.target_url.rsplit(":", 1)[1]))
        except BaseException:
            stop_target(self.target)
            raise

    def served(self) -> float:
        """Inference requests the target answered 200 (its own counter, read directly)."""
        import requests

        from kneeswarm.collectors.prometheus import parse_exposition

        m = parse_exposition(requests.get(self.target_url + "/metrics", timeout=5).text)
        return sum(v for k, v in m.items() if k.startswith(SERVED) and 'code="200"' in k)

    def stop(self) -> None:
        self.proxy.stop()
        stop_target(self.target)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    p = Proxied(tmp_path_factory.mktemp("tls"))
    yield p
    p.stop()


def routed_plan(p: Proxied, path: Path, **endpoint: object) -> Path:
    """A plan for the Host-routed server: CA, Host, secret token header, base path (``endpoint``
    keys replace these; None drops one)."""
    e = {"ca_bundle": str(p.pki.ca), "headers": {"Host": DEMO_HOST}, "headers_env": {TOKEN_HEADER: TOKEN_ENV},
         "base_path": BASE_PATH, **endpoint}
    return write_plan(path, p.proxy.url, {k: v for k, v in e.items() if v is not None},
                      metrics_url=p.proxy.url + BASE_PATH + "/metrics", analysis=SMALL_STEPS)


def write_plan(path: Path, target: str, endpoint: dict, steps: list[int] = (1, 2), hold: float = 3.0,
               **top: object) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps({"name": "tls", "target": target, "protocol": "kserve", **top,
                                   "load": {"steps": list(steps), "hold": hold, "ramp": 1.0, "settle": 1.0, "workers": 1},
                                   "endpoint": endpoint}))
    return path


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)


@pytest.fixture
def quick_health(monkeypatch):
    monkeypatch.setattr(conductor, "HEALTH_TIMEOUT", 2.0)


# -- real runs through the proxy ------------------------------------------------------------
@pytest.mark.slow
def test_runs_through_the_tls_proxy_count_what_the_target_served(proxied, tmp_path):
    """Two real runs side by side (one after the other would cost twice): the Host-routed server
    (private CA, Host, secret header, base path, /metrics through the proxy; KServe v2) and the
    client-certificate server with verify = false (OpenAI chat, streamed).  Every step valid; the target's own
    counter moved by the rows; each request reached nginx with the plan's Host; the secret is
    nowhere in the run directory; the report says which TLS each run had."""
    routed = routed_plan(proxied, tmp_path / "routed.toml")
    mtls = write_plan(tmp_path / "mtls.toml", proxied.proxy.mtls_url,
                      {"verify": False, "client_cert": str(proxied.pki.client_cert),
                       "client_key": str(proxied.pki.client_key)}, steps=[1], hold=4.0, analysis=SMALL_STEPS,
                      protocol="openai", request={"max_tokens": 8})  # streamed (SSE) through TLS
    before, logged = proxied.served(), len(proxied.proxy.access_log())
    env = {**os.environ, "PYTHONPATH": str(REPO), TOKEN_ENV: TOKEN}
    with side_by_side() as runs:
        for name, plan in (("routed", routed), ("mtls", mtls)):
            runs[name] = subprocess.Popen([KNEESWARM, "run", str(plan), "--out", str(tmp_path / name), "-q"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
        done = {name: p.communicate(timeout=180) for name, p in runs.items()}
        codes = {name: p.returncode for name, p in runs.items()}
    assert codes == {"routed": 0, "mtls": 0}, {n: d[1][-2000:] for n, d in done.items()}
    served = proxied.served() - before
    ok, rows = 0, 0
    for name, steps in (("routed", 2), ("mtls", 1)):
        (run_dir,) = [d for d in (tmp_path / name).iterdir() if d.is_dir()]
        s = read_summary(run_dir)
        assert s["complete"] is True and len(s["steps"]) == steps
        assert all(st["valid"] for st in s["steps"]), [st["reasons"] for st in s["steps"]]
        table = RunDir(run_dir).read_requests()
        assert table["ok"].all() and len(table) > 50, table["error"].value_counts()
        if name == "mtls":  # every answer streamed: its first token timed through the proxy
            assert table["ttft_ms"].notna().all() and (table["tokens_out"] == 8).all()
        ok, rows = ok + int(table["ok"].sum()), rows + len(table)
        for f in run_dir.rglob("*"):  # the token's value is never written; its variable's name is
            assert not f.is_file() or TOKEN.encode() not in f.read_bytes(), f
        md = (run_dir / "report" / "summary.md").read_text()
        if name == "routed":
            assert TOKEN_ENV in (run_dir / "plan.toml").read_text()
            assert s["endpoint"] == {"scheme": "https", "tls": "verified", "ca_bundle": str(proxied.pki.ca),
                                     "client_cert": False, "headers": sorted(["Host", TOKEN_HEADER]),
                                     "base_path": BASE_PATH, "server_name": None}
            metrics = json.loads((run_dir / "meta.json").read_text())["target_metrics"]
            # /metrics through the proxy too: every scrape answered, but one cut at its 0.8 s
            # deadline (two runs side by side on 2 busy cores) is the scraper's rule, not a TLS fault
            slow = [e for e in metrics["errors"] if "timed out" in e or "not complete within" in e]
            assert metrics["ok"] >= 5 and set(metrics["errors"]) == set(slow), metrics
            assert "TLS verified against" in md
        else:
            assert s["endpoint"]["tls"] == "unverified" and s["endpoint"]["client_cert"] is True
            assert "**unverified TLS**" in md
    infer = [line for line in proxied.proxy.access_log()[logged:] if "/infer" in line or "/completions" in line]
    abandoned = len(infer) - ok
    print(f"target served {served:.0f}, rows ok {ok}, rows {rows}, nginx saw {len(infer)}")
    # Every request the target served is a row, but those the users abandoned when the load
    # stopped (nginx saw them, most logged 499: the client closed), at most one per user (2 + 1).
    assert ok <= served <= len(infer) and 0 <= abandoned <= 3, (served, ok, rows, len(infer))
    # and every request went through nginx with the plan's Host, under the base path
    routed = [x for x in infer if x.startswith(f"{DEMO_HOST} ") and f'"POST {BASE_PATH}/v2/models/demo/infer' in x]
    mtls = [x for x in infer if x.startswith("127.0.0.1 ") and '"POST /v1/chat/completions' in x]
    assert len(routed) + len(mtls) == len(infer) and len(routed) > 50 and len(mtls) > 25, infer[:5]
    assert all(" 200 " in x or " 499 " in x for x in infer), [x for x in infer if " 200 " not in x]


# -- each wrong setting: one line naming what failed, exit 2, before any load, no run dir ----
WRONG = [
    ("no CA given", {"ca_bundle": None},
     "TLS: the server's certificate is signed by a CA not trusted here (give that CA in endpoint.ca_bundle) "
     "(unable to get local issuer certificate)"),
    ("another CA", {"ca_bundle": "OTHER_CA"}, "TLS: the server's certificate is signed by a CA not trusted here"),
    ("wrong Host", {"headers": {"Host": "wrong.kneeswarm.test"}},
     "-> HTTP 404 (404 Not Found)"),
    ("no gateway token", {"headers_env": None}, "-> HTTP 401"),
    ("no base path", {"base_path": None}, "-> HTTP 404"),
]


@pytest.mark.parametrize("case, endpoint, said", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_endpoint_setting_is_one_line_before_any_load(proxied, tmp_path, capsys, token, quick_health,
                                                              case, endpoint, said):
    endpoint = {k: (str(proxied.pki.other_ca) if v == "OTHER_CA" else v) for k, v in endpoint.items()}
    plan = routed_plan(proxied, tmp_path / "p.toml", **endpoint)
    before, lines = proxied.served(), len(proxied.proxy.access_log())
    assert cli.main(["run", str(plan), "--out", str(tmp_path / "runs")]) == 2
    line = one_error_line(capsys)
    assert said in line, line
    assert proxied.proxy.url in line, line
    if case == "wrong Host":
        assert ("model 'demo' is not served" in line and "sent Host: wrong.kneeswarm.test (endpoint.headers): "
                "does the server route that name and path (endpoint.base_path)?" in line), line
    assert TOKEN not in line
    assert not (tmp_path / "runs").exists()
    assert proxied.served() == before  # not one inference request
    assert not [x for x in proxied.proxy.access_log()[lines:] if "/infer" in x]


def test_a_missing_client_certificate_is_named(proxied, tmp_path, capsys, quick_health):
    plan = write_plan(tmp_path / "p.toml", proxied.proxy.mtls_url, {"ca_bundle": str(proxied.pki.ca)})
    assert cli.main(["run", str(plan), "--out", str(tmp_path / "runs")]) == 2
    line = one_error_line(capsys)
    assert line == (f"kneeswarm: error: target {proxied.proxy.mtls_url}: health check "
                    f"{proxied.proxy.mtls_url}/v2/health/ready -> HTTP 400 (400 No required SSL certificate was sent): "
                    f"the server requires a client certificate (endpoint.client_cert)"), line
    assert not (tmp_path / "runs").exists()


def test_unverified_tls_still_fails_in_one_line(proxied, tmp_path):
    """verify = false: no warning from the HTTP library beside the one line (a real process:
    pytest would keep a warning from stderr)."""
    from conftest import run_cli

    plan = write_plan(tmp_path / "p.toml", proxied.proxy.mtls_url, {"verify": False})
    res = run_cli("run", str(plan), "--out", str(tmp_path / "runs"), timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.strip().endswith("the server requires a client certificate (endpoint.client_cert)")
    assert not (tmp_path / "runs").exists()


def test_an_unset_header_variable_is_named(proxied, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert cli.main(["run", str(routed_plan(proxied, tmp_path / "p.toml")), "--out", str(tmp_path / "runs")]) == 2
    assert one_error_line(capsys) == (f"kneeswarm: error: endpoint.headers_env: environment variable {TOKEN_ENV} "
                                      f"(header {TOKEN_HEADER}) is not set (or empty)")
    assert not (tmp_path / "runs").exists()


# -- the plan's keys ------------------------------------------------------------------------
def test_endpoint_files_are_checked(tmp_path):
    pki = make_pki(tmp_path / "pki")
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    cases = [
        ({"ca_bundle": str(tmp_path / "nope.pem")}, f"endpoint.ca_bundle: {tmp_path / 'nope.pem'}: no such file"),
        ({"ca_bundle": str(not_pem)}, f"endpoint.ca_bundle: {not_pem}: no PEM certificate in it"),
        ({"client_cert": str(pki.client_cert)}, f"endpoint.client_cert: {pki.client_cert}: not a PEM certificate "
                                                f"with its private key"),
        ({"client_cert": str(pki.client_cert), "client_key": str(pki.server_key)},
         "not a PEM certificate with its private key (KEY_VALUES_MISMATCH)"),
    ]
    for endpoint, said in cases:
        plan = write_plan(tmp_path / "p.toml", "https://127.0.0.1:1", endpoint)
        with pytest.raises(PlanError) as e:
            load_plan(plan)
        assert str(e.value).startswith(str(plan)) and said in str(e.value), (endpoint, str(e.value))
    os.chmod(not_pem, 0)
    if not os.access(not_pem, os.R_OK):  # root reads anything
        with pytest.raises(PlanError, match="not readable"):
            load_plan(write_plan(tmp_path / "p.toml", "https://127.0.0.1:1", {"ca_bundle": str(not_pem)}))
    plan = load_plan(write_plan(tmp_path / "p.toml", "https://127.0.0.1:1", {
        "client_cert": str(pki.client_cert), "client_key": str(pki.client_key), "ca_bundle": str(pki.ca)}))
    assert plan.endpoint.client_key == str(pki.client_key)


@pytest.mark.parametrize("target, endpoint, said", [
    ("https://h:1", {"verify": False, "ca_bundle": "x.pem"}, "endpoint.verify = false checks no certificate"),
    ("https://h:1", {"client_key": "k.pem"}, "endpoint.client_key needs endpoint.client_cert"),
    ("http://h:1", {"ca_bundle": "x.pem"}, "endpoint.ca_bundle is for TLS, but the target is not https://"),
    ("http://h:1", {"verify": False}, "endpoint.verify is for TLS"),
    ("https://h:1", {"base_path": "serving"}, "endpoint.base_path must be a path starting with '/'"),
    ("https://h:1", {"headers": {"Bad Name": "x"}}, "endpoint.headers: 'Bad Name' is not a valid header name"),
    ("https://h:1", {"headers": {"Host": "a\r\nX: y"}}, "endpoint.headers.Host must be a one-line string"),
    ("https://h:1", {"headers": {"Host": 3}}, "endpoint.headers.Host must be a one-line string"),
    ("https://h:1", {"headers_env": {"X-Token": "not a name"}}, "endpoint.headers_env.X-Token must name an environment variable"),
    ("https://h:1", {"headers": {"host": "a"}, "headers_env": {"Host": "H"}}, "header 'Host' is given twice"),
    ("https://h:1", {"headers": 3}, "endpoint.headers must be a table"),
    ("https://h:1", {"cafile": "x"}, "unknown key 'endpoint.cafile'"),
    ("https://h:1", {"server_name": "a b"}, "endpoint.server_name must be a DNS name"),
    ("http://h:1", {"server_name": "a.example"}, "endpoint.server_name is for TLS"),
])
def test_endpoint_keys_are_validated(target, endpoint, said):
    with pytest.raises(PlanError) as e:
        plan_from_dict({"target": target, "endpoint": endpoint})
    assert said in str(e.value), str(e.value)


def test_the_endpoint_travels_to_workers_and_plan_toml_without_secrets(monkeypatch):
    monkeypatch.setenv("KS_T", "s3cr3t-value")
    plan = plan_from_dict({"target": "https://h:8443/", "endpoint": {
        "verify": False, "headers": {"Host": "m.example"}, "headers_env": {"X-Token": "KS_T"},
        "base_path": "/serving/m/"}})
    again = plan_from_dict(plan.to_dict())  # what a worker gets from the master
    assert again.endpoint == plan.endpoint and again.base_url == "https://h:8443/serving/m"
    assert "s3cr3t-value" not in plan.to_toml() and "KS_T" in plan.to_toml()
    assert plan.endpoint.resolved_headers() == {"Host": "m.example", "X-Token": "s3cr3t-value"}
    # the scrape of metrics_url gets the headers only on the target's own origin
    plan.metrics_url = "https://h:8443/serving/m/metrics"
    assert plan.metrics_headers() == {"Host": "m.example", "X-Token": "s3cr3t-value"}
    plan.metrics_url = "http://h:9090/metrics"
    assert plan.metrics_headers() == {}


# -- the load's own client: InferenceUser in a Locust environment (a child process) ---------
USERS_SCRIPT = r"""
import json, os, sys
from locust.env import Environment  # first: Locust monkey-patches before requests loads ssl
import gevent
from kneeswarm.contracts.planfile import plan_from_dict
from kneeswarm.locustfiles import state
from kneeswarm.locustfiles.users import InferenceUser

host, cases = sys.argv[1], json.loads(sys.argv[2])
out = {}
for name, plan in cases.items():
    host = plan.pop("_host", host)
    state.set_plan(plan_from_dict(plan, name))
    seen = {"ok": 0, "failed": 0, "errors": set()}

    def on_request(exception=None, **_kw):
        seen["failed" if exception else "ok"] += 1
        if exception:
            seen["errors"].add(str(exception)[:200])

    InferenceUser.host = host  # as Locust sets it from --host or the web UI's Host field
    env = Environment(user_classes=[InferenceUser], host=host)
    env.events.request.add_listener(on_request)
    runner = env.create_local_runner()
    runner.start(2, spawn_rate=100)
    gevent.sleep(1.0)
    runner.stop()
    out[name] = {"ok": seen["ok"], "failed": seen["failed"], "errors": sorted(seen["errors"])}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_load_verifies_tls_and_follows_the_host_locust_gives(proxied, token):
    """The load's client (geventhttpclient through InferenceUser) verifies the server's
    certificate against the plan's trust, where Locust's own default is not to verify; it sends
    to the host Locust gives it (the web UI's Host field, --host), with the plan's base path."""
    routed = {"target": "https://127.0.0.1:1",  # not used: Locust's host wins, as a web UI Host field does
              "load": {"steps": [2]},
              "endpoint": {"headers": {"Host": DEMO_HOST}, "headers_env": {TOKEN_HEADER: TOKEN_ENV},
                           "base_path": BASE_PATH}}
    cases = {
        "our CA": {**routed, "endpoint": {**routed["endpoint"], "ca_bundle": str(proxied.pki.ca)}},
        "another CA": {**routed, "endpoint": {**routed["endpoint"], "ca_bundle": str(proxied.pki.other_ca)}},
        "system CAs": routed,
        "verify = false": {**routed, "endpoint": {**routed["endpoint"], "verify": False}},
        # a certificate that names DEMO_HOST only, reached by its address: the name asked for (SNI)
        "server_name": {"_host": proxied.proxy.named_url, "target": "https://127.0.0.1:1", "load": {"steps": [2]},
                        "endpoint": {"ca_bundle": str(proxied.pki.ca), "server_name": DEMO_HOST}},
        "no server_name": {"_host": proxied.proxy.named_url, "target": "https://127.0.0.1:1", "load": {"steps": [2]},
                           "endpoint": {"ca_bundle": str(proxied.pki.ca)}},
    }
    res = subprocess.run([sys.executable, "-c", USERS_SCRIPT, proxied.proxy.url, json.dumps(cases)],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN})
    assert res.returncode == 0, res.stderr[-2000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    for name in ("our CA", "verify = false", "server_name"):
        assert seen[name]["ok"] > 5 and seen[name]["failed"] == 0, (name, seen[name])
    for name in ("another CA", "system CAs", "no server_name"):
        assert seen[name]["ok"] == 0 and seen[name]["failed"] > 0, (name, seen[name])
        assert all("CERTIFICATE_VERIFY_FAILED" in e for e in seen[name]["errors"]), seen[name]


# -- a monitored host's own scrape (the agent's sampler, as the agent builds it) ----------------
def test_a_hosts_own_scrape_goes_through_the_endpoint(proxied, token, tmp_path):
    """A host that lists the ``prometheus`` collector scrapes metrics_url itself (the one stdlib
    scraper, agents/remote/prometheus.py): it gets the plan's CA (as text: the file is on the load machine) and the plan's
    literal headers, never a headers_env value."""
    import threading
    import time

    from kneeswarm.agents import AgentSettings, remote
    from kneeswarm.collectors.base import HostContext
    from kneeswarm.collectors.prometheus import COLLECTOR

    plan = plan_from_dict({"target": proxied.proxy.url, "metrics_url": proxied.proxy.url + BASE_PATH + "/metrics",
                           "endpoint": {"ca_bundle": str(proxied.pki.ca), "headers": {"Host": DEMO_HOST},
                                        "headers_env": {TOKEN_HEADER: TOKEN_ENV}, "base_path": BASE_PATH}})
    settings = AgentSettings.from_plan(plan)
    spec = COLLECTOR.run_spec(HostContext({}, None, 1.0, settings.metrics_url, settings.metrics_tls))
    assert TOKEN not in json.dumps(spec.params) and spec.params["tls"]["headers"] == {"Host": DEMO_HOST}

    def scrape(**params):
        return remote.PrometheusSampler("prometheus", str(tmp_path / "p.jsonl"), 1.0, threading.Event(),
                                        **params).sample(time.time())[0]

    assert SERVED in scrape(**spec.params).get("text", ""), scrape(**spec.params)
    assert "CERTIFICATE_VERIFY_FAILED" in scrape(url=spec.params["url"])["error"]  # without the plan's CA
    no_host = {**spec.params, "tls": {"cadata": spec.params["tls"]["cadata"]}}
    assert scrape(**no_host)["error"] == "HTTP 404"  # without the plan's Host
    unverified = {**spec.params, "tls": {"verify": False, "headers": {"Host": DEMO_HOST}}}
    assert SERVED in scrape(**unverified).get("text", "")


@pytest.mark.long
@pytest.mark.slow
def test_the_web_ui_host_field_goes_through_the_endpoint(proxied, tmp_path):
    """Start pressed in the web UI (over HTTP) with the proxy typed into its Host field: the plan's
    [endpoint] (CA, Host, secret header, base path) carries the load there, and the run is valid."""
    import requests

    from conftest import answers_200, wait_for
    from kneeswarm.launch.conductor import free_port

    plan = write_plan(tmp_path / "plan.toml", "https://127.0.0.1:1",  # replaced by the Host field
                      {"ca_bundle": str(proxied.pki.ca), "headers": {"Host": DEMO_HOST},
                       "headers_env": {TOKEN_HEADER: TOKEN_ENV}, "base_path": BASE_PATH}, steps=[1], hold=3.0,
                      analysis=SMALL_STEPS)
    port, out, logged = free_port(), tmp_path / "runs", len(proxied.proxy.access_log())
    ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "swarm.py"),
                           "--web-host", "127.0.0.1", "--web-port", str(port), "--kneeswarm-plan", str(plan),
                           "--kneeswarm-out", str(out)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env={**os.environ, TOKEN_ENV: TOKEN})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers_200(base + "/"), 60, "the web UI")
        r = requests.post(base + "/swarm", data={"user_count": 1, "spawn_rate": 1, "host": proxied.proxy.url},
                          timeout=10)
        assert r.status_code == 200 and r.json()["success"], r.text
        wait_for(lambda: out.exists() and any(out.glob("*/report/summary.json")), 90, "the run's report")
    finally:
        ui.terminate()
        ui.wait(timeout=30)
    (run_dir,) = [d for d in out.iterdir() if d.is_dir()]
    s = read_summary(run_dir)
    assert s["complete"] is True and all(st["valid"] for st in s["steps"]), [st["reasons"] for st in s["steps"]]
    rows = RunDir(run_dir).read_requests()
    assert rows["ok"].all() and len(rows) > 25
    infer = [x for x in proxied.proxy.access_log()[logged:] if "/infer" in x]
    # every request went through the Host-routed server and base path; at most one, in flight when
    # the run stopped, was cut by the client (nginx's 499) and left no row
    served = [x for x in infer if x.startswith(f'{DEMO_HOST} 200 "POST {BASE_PATH}/v2/models/demo/infer')]
    cut = [x for x in infer if x not in served]
    assert len(cut) <= 1 and all(x.startswith(f'{DEMO_HOST} 499 "POST {BASE_PATH}/v2/models/demo/infer') for x in cut), cut
    assert 0 <= len(infer) - len(rows) <= 1
    assert s["endpoint"]["tls"] == "verified" and f"target = \"{proxied.proxy.url}\"" in (run_dir / "plan.toml").read_text()


def test_a_certificate_for_another_name_is_named(proxied, tmp_path, capsys, token):
    """The server's certificate names 127.0.0.1 and DEMO_HOST, not localhost."""
    url = proxied.proxy.url.replace("127.0.0.1", "localhost")
    plan = write_plan(tmp_path / "p.toml", url, {"ca_bundle": str(proxied.pki.ca), "headers": {"Host": DEMO_HOST},
                                                 "headers_env": {TOKEN_HEADER: TOKEN_ENV}, "base_path": BASE_PATH})
    assert cli.main(["run", str(plan), "--out", str(tmp_path / "runs")]) == 2
    assert one_error_line(capsys) == (
        f"kneeswarm: error: target {url}: health check {url}{BASE_PATH}/v2/health/ready failed (TLS: the server's "
        f"certificate is not valid for the name asked for (the target's host, or endpoint.server_name) (Hostname "
        f"mismatch, certificate is not valid for 'localhost'.))")
    assert not (tmp_path / "runs").exists()


def test_server_name_asks_for_the_certificates_name(proxied, tmp_path, capsys, quick_health):
    """An ingress reached by its address whose certificate names the service only: without
    server_name one line says so; with it the health check and preflight pass."""
    base = {"target": proxied.proxy.named_url, "endpoint": {"ca_bundle": str(proxied.pki.ca)}}
    with pytest.raises(conductor.ConductorError) as e:
        conductor.check_target(plan_from_dict(base))
    assert str(e.value) == (f"target {proxied.proxy.named_url}: health check {proxied.proxy.named_url}/v2/health/ready "
                            f"failed (TLS: the server's certificate is not valid for the name asked for (the target's "
                            f"host, or endpoint.server_name) (IP address mismatch, certificate is not valid for "
                            f"'127.0.0.1'.))")
    before = proxied.served()
    named = plan_from_dict({**base, "endpoint": {**base["endpoint"], "server_name": DEMO_HOST}})
    assert conductor.check_target(named) is None
    assert proxied.served() == before  # a health check and a model's readiness: no inference
