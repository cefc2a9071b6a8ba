"""kneeswarm.analysis.measure.target knows the /metrics names of the servers people run (names differ per server).

Each fixture under tests/fixtures/scrapes/ holds two expositions of one server some seconds
apart: recorded from the real server where it could be installed here (the kneeswarm demo
target, KServe's Python model server, TorchServe, Triton), or an example written from the server's
documentation/source where it could not (vLLM, TGI, SGLang: GPU and model weights), its
header says which. Each is replayed through the real path -- prometheus.jsonl as the scraper
writes it, kneeswarm.collectors.prometheus into prometheus.csv, kneeswarm.analysis.measure.inputs.read_prometheus, then
kneeswarm.analysis.measure.target -- and every key's value is checked against a number computed here from the
fixture's own text by a few lines of independent parsing (no prometheus_client, no
kneeswarm.analysis.measure.target), with which server's names were used and where those names come from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kneeswarm.analysis.measure.inputs import read_prometheus
from kneeswarm.analysis.measure.target import (DOCS, SCRAPE, TARGET_METRICS, source_lines, target_series_used, target_timeline, target_windows)
from kneeswarm.collectors.prometheus import write_prometheus_csv

FIXTURES = Path(__file__).parent / "fixtures" / "scrapes"
REPO = Path(__file__).resolve().parent.parent
T0 = 1_796_000_000.0
REL = 1e-6  # epoch seconds near 1.8e9 hold ~2e-7 s: a rate over 3 s is exact to ~1e-7
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)\s*$")


# -- the independent truth: the fixture's numbers, read with a regular expression ----------------
def split_fixture(path: Path) -> tuple[list[str], list[tuple[float, str]]]:
    """(header lines, [(seconds after scrape 1, exposition text)])."""
    header, scrapes, cur = [], [], None
    for line in path.read_text().splitlines():
        m = re.match(r"^#### scrape t=([0-9.]+)$", line)
        if m:
            cur = [float(m.group(1)), []]
            scrapes.append(cur)
        elif cur is None:
            header.append(line)
        else:
            cur[1].append(line)
    return header, [(t, "\n".join(lines) + "\n") for t, lines in scrapes]


def samples(text: str) -> list[tuple[str, str, float]]:
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            out.append((m.group(1), m.group(2) or "", float(m.group(3))))
    return out


class Truth:
    """Gauges as the mean of the two scrapes (llama.cpp's deferred requests: their highest, see
    the flickering-queue tests below), counters as increase / seconds, ratios as increase /
    increase: what a reader computes by hand from the two expositions."""

    def __init__(self, path: Path):
        _, ((t1, a), (t2, b)) = split_fixture(path)
        self.dt = t2 - t1
        self.a, self.b = samples(a), samples(b)

    @staticmethod
    def _vals(ss: list[tuple[str, str, float]], name: str, having: str) -> list[float]:
        return [v for n, lab, v in ss if n == name and re.search(having, lab)]

    def gauge(self, name: str, combine=np.sum, having: str = "", over=np.mean) -> float:
        """The gauge's samples combined per scrape, then over the scrapes (mean; max for a peak)."""
        return float(over([combine(self._vals(s, name, having)) for s in (self.a, self.b)]))

    def inc(self, name: str, having: str = "") -> float:
        return sum(self._vals(self.b, name, having)) - sum(self._vals(self.a, name, having))

    def rate(self, name: str, having: str = "") -> float:
        return self.inc(name, having) / self.dt

    def ratio(self, num: str, den: str, scale: float = 1.0) -> float:
        return self.inc(num) / self.inc(den) * scale


# -- the real path ------------------------------------------------------------------------------
def replay(path: Path, tmp: Path):
    """The fixture's scrapes as the conductor's scraper records them, parsed by the collector."""
    raw = tmp / "raw" / "prometheus.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    _, scrapes = split_fixture(path)
    with raw.open("w") as f:
        for t, text in scrapes:
            f.write(json.dumps({"t": T0 + t, "url": "http://127.0.0.1:8000/metrics", "text": text}) + "\n")
    csv = tmp / "prometheus.csv"
    info = write_prometheus_csv(raw, csv)
    assert info["rows"] == len(scrapes) == 2 and info["skipped"] == 0, info
    df = read_prometheus(csv)
    assert df is not None and len(df) == 2
    return df


def analyse(path: Path, tmp: Path) -> tuple[dict[str, float], dict]:
    df = replay(path, tmp)
    dt = split_fixture(path)[1][1][0]
    got = target_windows(df, np.array([T0 - 0.5]), np.array([T0 + dt + 0.5]))[0]
    return got, target_series_used(df)


def expected(fixture: str, x: Truth) -> dict[str, tuple[float, str]]:
    """{key: (value, server whose names)} for each fixture, written out by hand."""
    ms, us_ms = 1000.0, 1e-3
    if fixture == "kneeswarm-0.1.0.txt":
        return {
            "queue_length": (x.gauge("kneeswarm_target_queue_length"), "kneeswarm"),
            "in_flight": (x.gauge("kneeswarm_target_inflight"), "kneeswarm"),
            "rejected_s": (x.rate("kneeswarm_target_rejected_total"), "kneeswarm"),
            "failures_s": (x.rate("kneeswarm_target_requests_total", r'code="[45]'), "kneeswarm"),
            "queue_wait_ms": (x.ratio("kneeswarm_target_queue_wait_seconds_sum",
                                      "kneeswarm_target_queue_wait_seconds_count", ms), "kneeswarm"),
            "queue_time_us_s": (x.rate("nv_inference_queue_duration_us"), "triton"),
            "requests_s": (x.rate("kneeswarm_target_requests_total"), "kneeswarm"),
            "server_latency_ms": (x.ratio("kneeswarm_target_request_duration_seconds_sum",
                                          "kneeswarm_target_request_duration_seconds_count", ms), "kneeswarm"),
            "ttft_ms": (x.ratio("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                                ms), "vllm"),
            "itl_ms": (x.ratio("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
                               ms), "vllm"),
            "gen_tokens_s": (x.rate("vllm:generation_tokens_total"), "vllm"),
            "prompt_tokens_s": (x.rate("vllm:prompt_tokens_total"), "vllm"),
            "batch_size": (x.ratio("kneeswarm_target_batch_size_sum", "kneeswarm_target_batch_size_count"),
                           "kneeswarm"),
            "llm_running": (x.gauge("vllm:num_requests_running"), "vllm"),
            "llm_waiting": (x.gauge("vllm:num_requests_waiting"), "vllm"),
        }
    if fixture == "llamacpp-0.3.36.txt":
        return {
            "queue_length": (x.gauge("llamacpp:requests_deferred", over=np.max), "llamacpp"),  # its peak
            "in_flight": (x.gauge("llamacpp:requests_processing"), "llamacpp"),
            "tpot_ms": (x.ratio("llamacpp:tokens_predicted_seconds_total", "llamacpp:tokens_predicted_total", ms),
                        "llamacpp"),
            "gen_tokens_s": (x.rate("llamacpp:tokens_predicted_total"), "llamacpp"),
            "prompt_tokens_s": (x.rate("llamacpp:prompt_tokens_total"), "llamacpp"),
            "llm_running": (x.gauge("llamacpp:requests_processing"), "llamacpp"),
            "llm_waiting": (x.gauge("llamacpp:requests_deferred", over=np.max), "llamacpp"),
            "decode_batch": (x.ratio("llamacpp:tokens_predicted_total", "llamacpp:n_decode_total"), "llamacpp"),
            "prefix_hit_pct": (100 * x.inc("llamacpp:prompt_tokens_cached_total")
                               / (x.inc("llamacpp:prompt_tokens_total") + x.inc("llamacpp:prompt_tokens_cached_total")),
                               "llamacpp"),
        }
    if fixture == "kserve-0.21.0.txt":
        return {
            "requests_s": (x.rate("request_predict_seconds_count"), "kserve"),
            "predict_ms": (x.ratio("request_predict_seconds_sum", "request_predict_seconds_count", ms), "kserve"),
            "preprocess_ms": (x.ratio("request_preprocess_seconds_sum", "request_preprocess_seconds_count", ms),
                              "kserve"),
            "postprocess_ms": (x.ratio("request_postprocess_seconds_sum", "request_postprocess_seconds_count", ms),
                               "kserve"),
        }
    if fixture == "torchserve-0.12.0.txt":
        return {
            "failures_s": (x.rate("Requests4XX") + x.rate("Requests5XX"), "torchserve"),
            "queue_wait_ms": (x.ratio("ts_queue_latency_microseconds", "ts_inference_requests_total", us_ms),
                              "torchserve"),
            "queue_time_us_s": (x.rate("ts_queue_latency_microseconds"), "torchserve"),
            "queue_time_ms": (x.gauge("QueueTime", np.mean), "torchserve"),
            "requests_s": (x.rate("ts_inference_requests_total"), "torchserve"),
            "server_latency_ms": (x.ratio("ts_inference_latency_microseconds", "ts_inference_requests_total",
                                          us_ms), "torchserve"),
        }
    if fixture == "vllm-docs.txt":
        return {
            "queue_length": (x.gauge("vllm:num_requests_waiting"), "vllm"),
            "in_flight": (x.gauge("vllm:num_requests_running"), "vllm"),
            "preempted_s": (x.rate("vllm:num_preemptions_total"), "vllm"),
            "kv_cache_usage_pct": (100 * x.gauge("vllm:kv_cache_usage_perc", np.mean), "vllm"),
            "queue_wait_ms": (x.ratio("vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
                                      ms), "vllm"),
            "requests_s": (x.rate("vllm:request_success_total"), "vllm"),
            "server_latency_ms": (x.ratio("vllm:e2e_request_latency_seconds_sum",
                                          "vllm:e2e_request_latency_seconds_count", ms), "vllm"),
            "ttft_ms": (x.ratio("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                                ms), "vllm"),
            "itl_ms": (x.ratio("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
                               ms), "vllm"),
            "tpot_ms": (x.ratio("vllm:request_time_per_output_token_seconds_sum",
                                "vllm:request_time_per_output_token_seconds_count", ms), "vllm"),
            "gen_tokens_s": (x.rate("vllm:generation_tokens_total"), "vllm"),
            "prompt_tokens_s": (x.rate("vllm:prompt_tokens_total"), "vllm"),
            "llm_running": (x.gauge("vllm:num_requests_running"), "vllm"),
            "llm_waiting": (x.gauge("vllm:num_requests_waiting"), "vllm"),
            "llm_queue_ms": (x.ratio("vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
                                     ms), "vllm"),
        }
    if fixture == "tgi-docs.txt":
        return {
            "queue_length": (x.gauge("tgi_queue_size"), "tgi"),
            "in_flight": (x.gauge("tgi_batch_current_size"), "tgi"),
            "rejected_s": (x.rate("tgi_request_failure", 'err="overloaded"'), "tgi"),
            "failures_s": (x.rate("tgi_request_failure"), "tgi"),
            "queue_wait_ms": (x.ratio("tgi_request_queue_duration_sum", "tgi_request_queue_duration_count", ms),
                              "tgi"),
            "requests_s": (x.rate("tgi_request_success"), "tgi"),
            "server_latency_ms": (x.ratio("tgi_request_duration_sum", "tgi_request_duration_count", ms), "tgi"),
            "tpot_ms": (x.ratio("tgi_request_mean_time_per_token_duration_sum",
                                "tgi_request_mean_time_per_token_duration_count", ms), "tgi"),
            "gen_tokens_s": (x.rate("tgi_request_generated_tokens_sum"), "tgi"),
            "prompt_tokens_s": (x.rate("tgi_request_input_length_sum"), "tgi"),
            "llm_running": (x.gauge("tgi_batch_current_size"), "tgi"),
            "llm_waiting": (x.gauge("tgi_queue_size"), "tgi"),
            "llm_queue_ms": (x.ratio("tgi_request_queue_duration_sum", "tgi_request_queue_duration_count", ms), "tgi"),
        }
    if fixture == "sglang-docs.txt":
        return {
            "queue_length": (x.gauge("sglang:num_queue_reqs"), "sglang"),
            "in_flight": (x.gauge("sglang:num_running_reqs"), "sglang"),
            "failures_s": (x.rate("sglang:num_aborted_requests_total"), "sglang"),
            "preempted_s": (x.rate("sglang:num_retracted_requests_total"), "sglang"),
            "kv_cache_usage_pct": (100 * x.gauge("sglang:token_usage", np.mean), "sglang"),
            "queue_wait_ms": (x.ratio("sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count", ms),
                              "sglang"),
            "requests_s": (x.rate("sglang:num_requests_total"), "sglang"),
            "server_latency_ms": (x.ratio("sglang:e2e_request_latency_seconds_sum",
                                          "sglang:e2e_request_latency_seconds_count", ms), "sglang"),
            "ttft_ms": (x.ratio("sglang:time_to_first_token_seconds_sum", "sglang:time_to_first_token_seconds_count",
                                ms), "sglang"),
            "itl_ms": (x.ratio("sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count",
                               ms), "sglang"),
            "gen_tokens_s": (x.rate("sglang:generation_tokens_total"), "sglang"),
            "prompt_tokens_s": (x.rate("sglang:prompt_tokens_total"), "sglang"),
            "gen_throughput": (x.gauge("sglang:gen_throughput"), "sglang"),
            "llm_running": (x.gauge("sglang:num_running_reqs"), "sglang"),
            "llm_waiting": (x.gauge("sglang:num_queue_reqs"), "sglang"),
            "llm_queue_ms": (x.ratio("sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count", ms), "sglang"),
        }
    if fixture in ("triton-2.51.0.txt", "triton-docs.txt"):
        return {
            "queue_length": (x.gauge("nv_inference_pending_request_count"), "triton"),
            "rejected_s": (x.rate("nv_inference_request_failure", 'reason="REJECTED"'), "triton"),
            "failures_s": (x.rate("nv_inference_request_failure"), "triton"),
            "queue_wait_ms": (x.ratio("nv_inference_queue_duration_us", "nv_inference_request_success", us_ms),
                              "triton"),
            "queue_time_us_s": (x.rate("nv_inference_queue_duration_us"), "triton"),
            "requests_s": (x.rate("nv_inference_request_success"), "triton"),
            "server_latency_ms": (x.ratio("nv_inference_request_duration_us", "nv_inference_request_success",
                                          us_ms), "triton"),
            "batch_size": (x.ratio("nv_inference_count", "nv_inference_exec_count"), "triton"),
        }
    raise KeyError(fixture)


RECORDED = ["kneeswarm-0.1.0.txt", "kserve-0.21.0.txt", "torchserve-0.12.0.txt", "triton-2.51.0.txt",
            "llamacpp-0.3.36.txt"]
FROM_DOCS = ["vllm-docs.txt", "tgi-docs.txt", "sglang-docs.txt", "triton-docs.txt"]
NAMES_SOURCE = {"kneeswarm": SCRAPE, "kserve": SCRAPE, "torchserve": SCRAPE, "triton": SCRAPE, "llamacpp": SCRAPE,
                "vllm": DOCS, "tgi": DOCS, "sglang": DOCS, "llamacpp-old": DOCS}


@pytest.mark.parametrize("fixture", RECORDED + FROM_DOCS)
def test_each_key_from_a_fixture_equals_the_hand_computed_value(fixture, tmp_path):
    path = FIXTURES / fixture
    want = expected(fixture, Truth(path))
    got, used = analyse(path, tmp_path)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for key, (value, server) in want.items():
        assert np.isfinite(value), (key, value)
        assert got[key] == pytest.approx(value, rel=REL), key
        assert used[key]["server"] == server, (key, used[key])
        assert used[key]["source"] == NAMES_SOURCE[server], (key, used[key])
    assert any(v for v, _ in want.values()), "a fixture whose counters never moved checks nothing"


@pytest.mark.parametrize("fixture", RECORDED + FROM_DOCS)
def test_fixture_header_says_where_it_comes_from(fixture):
    header, scrapes = split_fixture(FIXTURES / fixture)
    assert len(scrapes) == 2 and scrapes[0][0] == 0.0 and scrapes[1][0] > 1.0
    src = next(line for line in header if line.startswith("#### source: "))
    if fixture in RECORDED:
        assert src.startswith("#### source: scrape.") and "record.py" in header[0]
    else:
        assert src.startswith("#### source: docs.") and "NOT a recorded scrape" in header[0]
        assert "made up" in "\n".join(header)


def test_every_candidate_names_its_source():
    """A scrape source is a fixture that exists (and is recorded); a docs source names its page."""
    seen = set()
    for m in TARGET_METRICS:
        for c in m.candidates:
            seen.add(c.server)
            assert c.source in (SCRAPE, DOCS), c
            assert c.source == NAMES_SOURCE[c.server], c
            if c.source == SCRAPE:
                assert (REPO / c.ref).is_file() and Path(c.ref).name in RECORDED, c
            else:
                assert "/" in c.ref and len(c.ref) > 20, c  # repository path or documentation page
    assert seen == set(NAMES_SOURCE)


def test_counters_without_total_suffix_are_found_after_the_parser_adds_it(tmp_path):
    """Triton, TGI and TorchServe expose counters without ``_total``; prometheus_client's parser
    (kneeswarm.collectors.prometheus) names their samples ``<name>_total``: both spellings must match."""
    df = replay(FIXTURES / "triton-docs.txt", tmp_path)
    assert any(c.startswith("nv_inference_request_success_total{") for c in df.columns)
    assert not any(c.startswith("nv_inference_request_success{") for c in df.columns)
    x = Truth(FIXTURES / "triton-docs.txt")
    got = target_windows(df, np.array([T0 - 0.5]), np.array([T0 + x.dt + 0.5]))[0]
    assert got["requests_s"] == pytest.approx((1400 + 260 - 1000 - 200) / 4.0)


def test_an_old_and_a_new_name_are_not_counted_twice(tmp_path):
    """vLLM exports the deprecated and the new name of KV-cache usage and of the inter-token
    gap side by side: one series is used for each, and the value is the new name's alone."""
    path = FIXTURES / "vllm-docs.txt"
    got, used = analyse(path, tmp_path)
    assert used["kv_cache_usage_pct"]["series"] == ['vllm:kv_cache_usage_perc{engine="0",model_name="m"}']
    assert used["itl_ms"]["series"] == ['vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"}']
    assert used["itl_ms"]["denominator"] == ['vllm:inter_token_latency_seconds_count{engine="0",model_name="m"}']
    # request_success counts every finished_reason once: (205 + 27 + 1 - 180 - 20 - 0) / 5 s
    assert got["requests_s"] == pytest.approx(33 / 5.0)
    # the _created samples prometheus_client adds are not counters to rate
    assert not any("_created" in s for d in used.values() for s in d["series"])


def test_source_lines_say_which_names_and_where_from(tmp_path):
    _, used = analyse(FIXTURES / "kserve-0.21.0.txt", tmp_path / "k")
    lines = source_lines(used)
    assert lines == ["kserve names from a recorded real scrape (tests/fixtures/scrapes/kserve-0.21.0.txt): "
                     "server req/s, predict ms, preprocess ms, postprocess ms"]
    _, used = analyse(FIXTURES / "kneeswarm-0.1.0.txt", tmp_path / "d")
    lines = source_lines(used)
    assert lines[0].startswith("kneeswarm names from a recorded real scrape "
                               "(tests/fixtures/scrapes/kneeswarm-0.1.0.txt): queue, ")
    assert any(line.startswith("vllm names from its documentation (vllm-project/vllm ") and line.endswith(
        "server TTFT ms, server ITL ms, server gen tok/s, server prompt tok/s, engine running, engine waiting")
        for line in lines), lines


def test_older_llamacpp_kv_cache_usage_is_read_as_kv_cache_usage(tmp_path):
    """llama.cpp's server exported llamacpp:kv_cache_usage_ratio (0..1) until mid-2025; the recorded
    0.3.36 scrape has no KV series, so an example written from its documentation stands in."""
    text = ("# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio {v}\n"
            "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n")
    path = tmp_path / "llamacpp-old.txt"
    path.write_text("# example written from llama.cpp's server README (before mid-2025), made up values\n"
                    f"#### scrape t=0\n{text.format(v=0.25)}#### scrape t=2\n{text.format(v=0.75)}")
    got, used = analyse(path, tmp_path)
    assert got["kv_cache_usage_pct"] == pytest.approx(50.0)
    assert used["kv_cache_usage_pct"]["server"] == "llamacpp-old" and used["kv_cache_usage_pct"]["source"] == DOCS


# -- llama.cpp's flickering queue gauge ------------------------------------------------------------
# One step of a real llama-server run (tests_conformance/test_llamacpp.py): 6 users on 4 slots
# (--parallel 4), the raw scrapes at 1 Hz.  Every slot was busy throughout and the 2 requests beyond
# the slots waited the whole step, but llamacpp:requests_deferred read the whole wait or 0.
LLAMA_USERS, LLAMA_SLOTS = 6, 4
LLAMA_DEFERRED = (0, 2, 0, 0, 0, 0, 0, 2, 2, 2)
LLAMA_PROCESSING = (4,) * len(LLAMA_DEFERRED)


def replay_gauges(tmp: Path, fixture: str, values: dict[str, tuple[float, ...]]) -> pd.DataFrame:
    """The fixture's first (real) exposition, scraped once a second with the gauges in VALUES set
    to the given readings, through the real path (prometheus.jsonl -> prometheus.csv -> the table
    analysis reads)."""
    _, ((_, text), _) = split_fixture(FIXTURES / fixture)
    n = len(next(iter(values.values())))
    raw = tmp / "raw" / "prometheus.jsonl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    with raw.open("w") as f:
        for i in range(n):
            scrape = text
            for name, v in values.items():
                scrape, k = re.subn(rf"^{re.escape(name)}(\{{[^}}]*\}})? \S+$", rf"{name}\g<1> {v[i]}", scrape,
                                    flags=re.M)
                assert k >= 1, name
            f.write(json.dumps({"t": T0 + i, "url": "http://127.0.0.1:8080/metrics", "text": scrape}) + "\n")
    write_prometheus_csv(raw, tmp / "prometheus.csv")
    df = read_prometheus(tmp / "prometheus.csv")
    assert df is not None and len(df) == n
    return df


def test_llamacpp_queue_is_the_wait_not_the_mean_of_a_flickering_gauge(tmp_path):
    """The step's queue is the 2 requests beyond the slots, which waited the whole step -- not the
    scrapes' mean (0.8), which a level gauge would give; llama-server's busy slots stay a mean."""
    df = replay_gauges(tmp_path, "llamacpp-0.3.36.txt", {"llamacpp:requests_deferred": LLAMA_DEFERRED,
                                                         "llamacpp:requests_processing": LLAMA_PROCESSING})
    step = target_windows(df, np.array([T0 - 0.5]), np.array([T0 + len(LLAMA_DEFERRED)]))[0]
    waiting = LLAMA_USERS - LLAMA_SLOTS
    assert step["queue_length"] == waiting and step["llm_waiting"] == waiting, step
    assert step["in_flight"] == LLAMA_SLOTS and step["llm_running"] == LLAMA_SLOTS, step
    # a window whose scrapes all read 0 (the first one alone) has no queue to show
    first = target_windows(df, np.array([T0 - 0.5]), np.array([T0 + 0.5]))[0]
    assert first["queue_length"] == 0.0, first
    used = target_series_used(df)
    assert used["queue_length"]["step"] == "peak" and used["llm_waiting"]["step"] == "peak", used
    assert used["in_flight"]["step"] == "mean", used
    # the report says the figure is the highest scrape, not a mean
    note = source_lines(used)[-1]
    assert note.startswith("queue (llamacpp:requests_deferred); engine waiting (llamacpp:requests_deferred): "
                           "each step's highest scrape, not a mean"), note
    # the timeline in 2-s bins: each bin's highest reading
    line = target_timeline(df, T0, 2.0)
    want = [max(LLAMA_DEFERRED[i:i + 2]) for i in range(0, len(LLAMA_DEFERRED), 2)]
    assert line["queue_length"].tolist() == want, line


def test_a_level_queue_gauge_stays_the_step_mean(tmp_path):
    """vLLM's waiting sequences are a level (the scheduler's waiting list): the same readings give
    their mean, as before."""
    df = replay_gauges(tmp_path, "vllm-docs.txt", {"vllm:num_requests_waiting": LLAMA_DEFERRED})
    step = target_windows(df, np.array([T0 - 0.5]), np.array([T0 + len(LLAMA_DEFERRED)]))[0]
    assert step["queue_length"] == pytest.approx(np.mean(LLAMA_DEFERRED)), step
    assert target_series_used(df)["queue_length"]["step"] == "mean"
