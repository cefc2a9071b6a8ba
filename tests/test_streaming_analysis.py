"""kneeswarm.analysis.measure.streaming through the real analysis (analysis.analyze on a run directory): TTFT, ITL and
TPOT percentiles, tokens/s, goodput, the token-count check, the tokens/s knee, items/s and open-loop
rates, checked against numpy on the very rows written; and runs written before the streaming
columns existed still analyse.

Rows are generated closed loop (each user's next request starts when its previous one ends), so
Little's law holds and the steps are valid unless a check under test says otherwise.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kneeswarm.analysis import analyze
from kneeswarm.analysis.measure.streaming import COUNT_MISMATCH_MAX, TOKENIZER_SLACK, GapSample
from kneeswarm.contracts.rundir import REQUEST_SCHEMA, RunDir

T0 = 1_700_000_000.0
RAMP, HOLD, SETTLE = 1.0, 20.0, 1.0
USERS = (1, 2, 4)
OLD_COLUMNS = ("t_start", "latency_ms", "ttft_ms", "tokens_in", "tokens_out", "bytes", "ok", "status", "error",
               "step", "users", "worker", "name")  # REQUEST_SCHEMA before the streaming columns were added


def stream_rows(rng: np.random.Generator, step: int, users: int, t_ramp: float, t_end: float, *,
                usage_offset: int = 0, usage: bool = True, fail: float = 0.0, per_chunk: int = 1,
                pinned: bool = False, tokenizer=None, no_text: float = 0.0) -> dict[str, list]:
    """Closed-loop streamed requests of one step: n tokens in ceil(n / per_chunk) text chunks, TTFT,
    a gap per later chunk, latency = TTFT + gaps.  ``pinned``: the request pinned n; ``tokenizer``:
    (rng, n) -> the client tokenizer's count (None: no tokenizer); ``no_text``: the share of requests
    that stream their tokens without a text chunk (no TTFT, no gaps)."""
    cols: dict[str, list] = {k: [] for k in ("t_start", "latency_ms", "ttft_ms", "tokens_out", "ok", "status",
                                             "error", "step", "users", "worker", "name", "itl_ms",
                                             "tokens_counted", "usage_out", "chunks_out", "tokens_tokenizer",
                                             "tokens_pinned")}
    for u in range(users):
        t = t_ramp + rng.uniform(0, 0.05)
        while t < t_end:
            n = int(rng.integers(2, 24))
            chunks = -(-n // per_chunk)
            ttft = float(rng.lognormal(np.log(40.0 * users), 0.3))
            gaps = rng.lognormal(np.log(8.0 * users * per_chunk), 0.4, chunks - 1).astype(np.float32)
            lat = ttft + float(gaps.astype(float).sum()) + 0.3
            ok = rng.random() >= fail
            if rng.random() < no_text:
                ttft, gaps, chunks = None, np.empty(0, dtype=np.float32), 0
            for k, v in (("t_start", t), ("latency_ms", lat), ("ttft_ms", ttft), ("ok", ok), ("status", 200 if ok else 0),
                         ("error", None if ok else "stream_truncated"), ("step", step), ("users", users),
                         ("worker", "w1"), ("name", "infer"), ("itl_ms", gaps.tolist()), ("chunks_out", chunks),
                         ("usage_out", n + usage_offset if usage else None), ("tokens_counted", not usage),
                         ("tokens_out", n + usage_offset if usage else chunks),
                         ("tokens_tokenizer", None if tokenizer is None else tokenizer(rng, n)),
                         ("tokens_pinned", n if pinned else None)):
                cols[k].append(v)
            t += lat / 1000.0
    return cols


def make_stream_run(tmp_path, *, sla: str = "", usage_offset=lambda step: 0, usage: bool = True,
                    fail: float = 0.0, seed: int = 1, old_schema: bool = False, extra_plan: str = "",
                    **shape) -> RunDir:
    rng = np.random.default_rng(seed)
    rd = RunDir.create(tmp_path, "stream")
    rd.plan_path.write_text(f'name = "stream"\nprotocol = "openai"\n[load]\nsteps = {list(USERS)}\nramp = {RAMP}\n'
                            f"hold = {HOLD}\nsettle = {SETTLE}\n{extra_plan}[analysis]\nmin_requests = 50\n"
                            f"generator_cpu_max = 90.0\n{sla}")
    steps, t = [], T0
    for i, users in enumerate(USERS):
        t_ramp, t_end = t, t + RAMP + HOLD
        steps.append([i, users, t_ramp, t_ramp + RAMP, t_end])
        cols = stream_rows(rng, i, users, t_ramp, t_end, usage_offset=usage_offset(i), usage=usage, fail=fail,
                           **{k: v(i) if k == "tokenizer" and v is not None else v for k, v in shape.items()})
        if old_schema:  # a part as kneeswarm wrote it before the streaming columns
            schema = pa.schema([REQUEST_SCHEMA.field(c) for c in OLD_COLUMNS])
            pq.write_table(pa.table({c: pa.array(cols.get(c, [None] * len(cols["t_start"])), type=schema.field(c).type)
                                     for c in OLD_COLUMNS}, schema=schema), rd.requests_dir / f"part-{i:06d}.parquet")
        else:
            rd.write_request_part(cols, seq=i)
        t = t_end
    rd.write_steps(steps)
    rd.update_meta(run_id="stream", complete=True, ended="completed")
    return rd


def window(rd: RunDir, step: int) -> tuple[dict, "pd.DataFrame"]:  # noqa: F821
    """The step's summary record and its steady rows (numpy's truth)."""
    summary = json.loads((rd.report_dir / "summary.json").read_text())
    rows = rd.read_requests()
    s = summary["steps"][step]
    win = rows[(rows["t_start"] >= s["t_lo"]) & (rows["t_start"] < s["t_hi"])]
    return s, win


def test_streaming_percentiles_tokens_s_and_tpot_are_numpys_on_the_rows(tmp_path):
    rd = make_stream_run(tmp_path, fail=0.02)
    summary = analyze(rd.path)
    for i in range(len(USERS)):
        s, win = window(rd, i)
        ok = win[win["ok"]]
        w = s["t_hi"] - s["t_lo"]
        gaps = np.concatenate([np.asarray(g, dtype=np.float32) for g in ok["itl_ms"]]).astype(float)
        tpot = (ok["latency_ms"] - ok["ttft_ms"]) / (ok["tokens_out"] - 1)
        for name, values in (("ttft", ok["ttft_ms"]), ("itl", gaps), ("tpot", tpot)):
            for q in (50, 95, 99):
                assert s[f"{name}_p{q}_ms"] == pytest.approx(np.percentile(values, q), rel=1e-5), (name, q)
        assert s["tokens_s"] == pytest.approx(ok["tokens_out"].sum() / w)
        assert s["streaming_requests"] == len(ok) and s["itl_gaps"] == len(gaps) and s["itl_sampled"] is False
        # one token per chunk: the per-token ITL is the per-chunk one; no independent count, nothing compared
        assert s["tokens_per_chunk"] == 1.0 and s["itl_token_p50_ms"] == pytest.approx(s["itl_p50_ms"])
        assert s["tokens_counted_share"] == 0.0 and s["tokens_compared"] == 0 and s["tokens_mismatch_share"] is None
        assert s["no_text_requests"] == 0
        assert not any("token counts" in r for r in s["reasons"]), s["reasons"]
    assert summary["steps"][0]["valid"], summary["steps"][0]["reasons"]
    # latency grows with users here (TTFT and gaps ∝ users): tokens/s never scaled past 1 user
    assert summary["tokens_knee"]["users"] == 1
    assert summary["tokens_knee"]["tokens_s"] == pytest.approx(summary["steps"][0]["tokens_s"])
    md = (rd.report_dir / "summary.md").read_text()
    html = (rd.report_dir / "index.html").read_text()
    assert "**Streaming" in md and "TTFT P99" in md and "from the server's `usage` on every streamed request" in md
    assert "Streaming (ms; tokens/s of output)" in html and "TPOT P50" in html
    assert "closed loop" in md and "**Tokens/s knee:** 1 user at" in md
    assert "usage not checked (no pinned length, no tokenizer in the plan)" in md and "no text" not in md
    assert set(summary["itl_columns"]) == {"itl", "itl_token"} and "ITL/chunk P50" in md and "ITL/token P50" in md


def test_goodput_is_the_share_of_requests_meeting_every_limit(tmp_path):
    # limits near the middle of the first step's distributions: about half the requests meet them
    rd = make_stream_run(tmp_path, sla="[sla]\np99_ms = 200.0\nttft_ms = 48.0\nitl_ms = 18.0\n", fail=0.05)
    summary = analyze(rd.path)
    assert summary["goodput"] == {"limits": {"ttft_ms": 48.0, "itl_ms": 18.0, "p99_ms": 200.0}}
    shares = []
    for i in range(len(USERS)):
        s, win = window(rd, i)
        itl_max = np.array([max(g) if len(g) else -np.inf for g in win["itl_ms"]], dtype=float)
        meets = (win["ok"].to_numpy() & (win["latency_ms"].to_numpy() <= 200.0)
                 & (win["ttft_ms"].to_numpy() <= 48.0) & (itl_max <= np.float32(18.0)))
        assert s["goodput_share"] == pytest.approx(meets.mean())
        assert s["goodput_rps"] == pytest.approx(meets.sum() / (s["t_hi"] - s["t_lo"]))
        shares.append(s["goodput_share"])
    assert 0.2 < shares[0] < 0.8, shares  # the limits really split the first step
    assert "**Goodput:**" in (rd.report_dir / "summary.md").read_text()


def test_usage_off_its_pinned_length_is_a_reason_only_where_it_exceeds_5_percent(tmp_path):
    """Every request pins its length (ignore_eos): usage 3 over it at 2 users is a reason there."""
    rd = make_stream_run(tmp_path, usage_offset=lambda step: 3 if step == 1 else 0, pinned=True)
    summary = analyze(rd.path)
    ok_step, bad_step = summary["steps"][0], summary["steps"][1]
    _, win = window(rd, 1)
    win = win[win["ok"]]
    reason = [r for r in bad_step["reasons"] if "token counts disagree" in r]
    assert len(reason) == 1 and not bad_step["valid"]
    assert f"usage says a median of {np.median(win['usage_out']):g} output tokens" in reason[0]
    assert f"the requests pinned a median of {np.median(win['tokens_pinned']):g}" in reason[0]
    assert bad_step["tokens_mismatch_share"] == pytest.approx(np.mean(win["usage_out"] != win["tokens_pinned"])) == 1.0
    assert bad_step["tokens_compared"] == len(win)
    assert ok_step["tokens_mismatch_share"] == 0.0 and not any("token counts" in r for r in ok_step["reasons"])
    assert ok_step["valid"], ok_step["reasons"]
    md = (rd.report_dir / "summary.md").read_text()
    assert "usage **disagrees** with pinned lengths in 1 step(s)" in md


def test_usage_against_the_tokenizer_disagrees_beyond_its_slack(tmp_path):
    """The client's tokenizer re-counts the text: off by one token here and there (re-encoding), which
    the slack forgives on long answers and not on short ones; numpy on the rows says which."""
    def tokenizer(step):
        return lambda rng, n: n + int(rng.integers(-1, 2)) if step == 1 else n

    rd = make_stream_run(tmp_path, tokenizer=tokenizer)
    summary = analyze(rd.path)
    for i, s in enumerate(summary["steps"]):
        _, win = window(rd, i)
        win = win[win["ok"]]
        u, t = win["usage_out"].to_numpy(float), win["tokens_tokenizer"].to_numpy(float)
        truth = np.abs(u - t) > TOKENIZER_SLACK * np.maximum(u, t)
        assert s["tokens_compared"] == len(win) and s["tokens_mismatch_share"] == pytest.approx(truth.mean())
        assert s["tokenizer_out_median"] == np.median(t)
        flagged = any("the plan's tokenizer counted a median of" in r for r in s["reasons"])
        assert flagged == (truth.mean() > COUNT_MISMATCH_MAX), (i, truth.mean(), s["reasons"])
    assert summary["steps"][0]["tokens_mismatch_share"] == 0.0
    assert summary["steps"][1]["tokens_mismatch_share"] > COUNT_MISMATCH_MAX  # short answers: 1 token is > 10 %


def test_chunks_against_usage_is_information_never_a_reason(tmp_path):
    """Four tokens per chunk and no independent count: chunks never match usage, yet every step is
    valid, even with a usage that is off (nothing here can contradict it); tokens per chunk and the
    per-token ITL are numpy's on the rows."""
    rd = make_stream_run(tmp_path, per_chunk=4, usage_offset=lambda step: 2 if step == 2 else 0)
    summary = analyze(rd.path)
    for i, s in enumerate(summary["steps"]):
        _, win = window(rd, i)
        ok = win[win["ok"]]
        usage, chunks = ok["usage_out"].to_numpy(float), ok["chunks_out"].to_numpy(float)
        assert (usage != chunks).mean() > 0.5 and s["valid"], s["reasons"]
        assert not any("token" in r for r in s["reasons"])
        assert s["tokens_per_chunk"] == pytest.approx(usage.sum() / chunks.sum())
        assert s["chunks_out_median"] == np.median(chunks) and s["tokens_compared"] == 0
        per_token = np.concatenate([np.asarray(g, dtype=np.float32).astype(float) * c / u
                                    for g, c, u in zip(ok["itl_ms"], chunks, usage)])
        chunk_gaps = np.concatenate([np.asarray(g, dtype=np.float32) for g in ok["itl_ms"]]).astype(float)
        for q in (50, 95, 99):
            assert s[f"itl_token_p{q}_ms"] == pytest.approx(np.percentile(per_token, q), rel=1e-5)
            assert s[f"itl_p{q}_ms"] == pytest.approx(np.percentile(chunk_gaps, q), rel=1e-5)
        tpot = (ok["latency_ms"] - ok["ttft_ms"]) / (ok["usage_out"] - 1)  # TPOT from the true count
        assert s["tpot_p50_ms"] == pytest.approx(np.percentile(tpot, 50), rel=1e-5)
    md = (rd.report_dir / "summary.md").read_text()
    assert "tokens per chunk 3." in md and "ITL/token: each gap between text chunks divided by" in md


def test_streams_without_text_are_counted_not_hidden(tmp_path):
    """A tenth of the requests stream their tokens with no text chunk: they have no TTFT, are left out
    of the percentiles, and each step counts and shows them."""
    rd = make_stream_run(tmp_path, no_text=0.1)
    summary = analyze(rd.path)
    for i, s in enumerate(summary["steps"]):
        _, win = window(rd, i)
        ok = win[win["ok"]]
        text = ok[ok["ttft_ms"].notna()]
        assert s["no_text_requests"] == int(ok["ttft_ms"].isna().sum()) > 0
        assert s["streaming_requests"] == len(text)
        assert s["ttft_p50_ms"] == pytest.approx(np.percentile(text["ttft_ms"], 50), rel=1e-5)
        assert s["tokens_s"] == pytest.approx(ok["tokens_out"].sum() / (s["t_hi"] - s["t_lo"]))
    md = (rd.report_dir / "summary.md").read_text()
    assert "**No text:**" in md and "no text" in md
    assert f"{summary['steps'][0]['no_text_requests']:,} at 1 users" in md


def test_tokens_counted_by_the_client_are_said_so(tmp_path):
    rd = make_stream_run(tmp_path, usage=False)
    summary = analyze(rd.path)
    assert all(s["tokens_counted_share"] == 1.0 and s["tokens_compared"] == 0 for s in summary["steps"])
    assert "counted by the client (the server sent no `usage`)" in (rd.report_dir / "summary.md").read_text()
    # neither usage nor tokenizer: tokens per chunk unknown, no per-token ITL
    assert all(s["tokens_per_chunk"] is None and s["itl_token_p50_ms"] is None for s in summary["steps"])


def test_without_usage_the_tokenizer_gives_tokens_per_chunk_and_the_per_token_itl(tmp_path):
    """No usage from the server, three tokens per chunk, the plan's tokenizer counted each answer:
    tokens per chunk and the per-token gaps rest on the tokenizer's count (numpy on the rows)."""
    rd = make_stream_run(tmp_path, usage=False, per_chunk=3, tokenizer=lambda step: lambda rng, n: n)
    summary = analyze(rd.path)
    for i, s in enumerate(summary["steps"]):
        _, win = window(rd, i)
        ok = win[win["ok"]]
        tok, chunks = ok["tokens_tokenizer"].to_numpy(float), ok["chunks_out"].to_numpy(float)
        assert s["tokens_per_chunk"] == pytest.approx(tok.sum() / chunks.sum()) and s["tokens_compared"] == 0
        per_token = np.concatenate([np.asarray(g, dtype=np.float32).astype(float) * c / t
                                    for g, c, t in zip(ok["itl_ms"], chunks, tok)])
        assert s["itl_token_p99_ms"] == pytest.approx(np.percentile(per_token, 99), rel=1e-5)
        assert s["valid"], s["reasons"]


def test_a_run_written_before_the_streaming_columns_still_analyses(tmp_path):
    rd = make_stream_run(tmp_path, old_schema=True)
    assert "itl_ms" not in pq.read_schema(rd.request_parts()[0]).names
    summary = analyze(rd.path)
    s, win = window(rd, 0)
    ok = win[win["ok"]]
    assert s["ttft_p50_ms"] == pytest.approx(np.percentile(ok["ttft_ms"], 50))
    assert s["itl_p50_ms"] is None and s["itl_gaps"] == 0 and s["tokens_counted_share"] is None
    assert s["tokens_s"] == pytest.approx(ok["tokens_out"].sum() / (s["t_hi"] - s["t_lo"]))
    assert "source unknown" in (rd.report_dir / "summary.md").read_text()
    assert summary["steps"][0]["valid"], summary["steps"][0]["reasons"]


def test_a_non_streaming_run_has_no_streaming_keys(tmp_path):
    from synthetic_run import closed_loop, make_run

    rd = make_run(tmp_path, closed_loop(4), users=(1, 2, 4))
    summary = analyze(rd.path)
    assert "ttft_p50_ms" not in summary["steps"][0] and "tokens_s" not in summary["steps"][0]
    assert "tokens_knee" not in summary and "goodput" not in summary
    assert "Streaming" not in (rd.report_dir / "summary.md").read_text()
    assert summary["load"] == {"loop": "closed", "batch": 1}
    assert "rate" not in summary["steps"][0] and "items_s" not in summary["steps"][0]


def test_items_s_for_batches_and_rate_for_open_loop(tmp_path):
    rd = make_stream_run(tmp_path, extra_plan='mode = "open"\nrates = [2.0, 4.0, 8.0]\nsource_rate = 2.0\n'
                                              'arrival = "constant"\n[request]\nbatch = 8\n')
    summary = analyze(rd.path)
    assert summary["load"] == {"loop": "open", "arrival": "constant", "source_rate": 2.0, "batch": 8}
    for s, users in zip(summary["steps"], USERS):
        assert s["rate"] == users * 2.0
        assert s["items_s"] == pytest.approx(s["qps"] * 8)
    md = (rd.report_dir / "summary.md").read_text()
    assert "open loop" in md and "rate req/s" in md and "items/s" in md


def test_gap_sample_is_exact_under_its_cap_and_uniform_over_it():
    rng = np.random.default_rng(0)
    gaps = [rng.lognormal(2.0, 0.5, 7_000).astype(np.float32) for _ in range(30)]
    exact = GapSample(cap=1_000_000)
    for g in gaps:
        exact.add(g)
    assert not exact.sampled and np.array_equal(np.sort(exact.values()), np.sort(np.concatenate(gaps)))
    small = GapSample(cap=20_000)
    for g in gaps:
        small.add(g)
    values = small.values()
    allv = np.concatenate(gaps).astype(float)
    assert small.sampled and len(values) == 20_000 and small.seen == len(allv)
    for q in (50, 95, 99):  # a uniform sample of 20k: percentiles within ~2 %
        assert np.percentile(values, q) == pytest.approx(np.percentile(allv, q), rel=0.03)


def test_a_streamed_answers_gaps_flag_and_counts_reach_the_part(tmp_path):
    """The recorder's wire columns: users.StreamInfo (itl_ms, tokens_counted, usage_out, chunks,
    tokens_tokenizer, tokens_pinned) in the request context becomes the row's columns of those names
    (chunks: chunks_out); a whole
    answer's row has nulls there.  (Plain tuples here: importing users.py would import Locust, whose
    gevent patching must not happen inside this test process.)"""
    from kneeswarm.locustfiles.recorder import RequestWriter, RowBuffer

    run = RunDir.create(tmp_path, "w")
    buf = RowBuffer()
    buf.on_request("POST", "infer", 90.0, 10, None, {"kneeswarm": (5, 4, 30.0),
                   "kneeswarm_stream": ([20.0, 0.0, 40.125], False, 4, 4)}, None, start_time=1.0)
    buf.on_request("POST", "infer", 80.0, 10, None, {"kneeswarm": (5, 3, 25.0),
                   "kneeswarm_stream": ([30.0, 25.0], True, None, 3, 9, 12)}, None, start_time=2.0)
    buf.on_request("POST", "infer", 12.0, 10, None, {"kneeswarm": (5, None, None)}, None, start_time=3.0)
    writer = RequestWriter(run, lambda: [(0.0, 1)])
    writer.add("worker-0", buf.take())
    assert writer.flush() == 3
    df = run.read_requests()
    assert [list(g) if g is not None else None for g in df["itl_ms"]] == [[20.0, 0.0, 40.125], [30.0, 25.0], None]
    assert df["tokens_counted"].tolist() == [False, True, None]
    assert df["usage_out"].iloc[0] == 4 and df["usage_out"].isna().tolist() == [False, True, True]
    assert df["chunks_out"].iloc[:2].tolist() == [4, 3] and df["chunks_out"].isna().tolist() == [False, False, True]
    # the independent counts (tokenizer, pinned length); a 4-field StreamInfo leaves them null
    assert df["tokens_tokenizer"].isna().tolist() == [True, False, True] and df["tokens_tokenizer"].iloc[1] == 9
    assert df["tokens_pinned"].isna().tolist() == [True, False, True] and df["tokens_pinned"].iloc[1] == 12


def test_capacitys_sla_check_reads_the_streaming_step_keys(tmp_path):
    rd = make_stream_run(tmp_path, sla="[sla]\nttft_ms = 1000.0\nitl_ms = 1000.0\n")
    summary = analyze(rd.path)
    sla = summary["sla"]
    assert sla["skipped"] == [] and sla["passed"]
    checks = {c["name"]: c for c in sla["checks"]}
    best = next(s for s in summary["steps"] if s["users"] == checks["ttft_ms"]["users"])
    assert checks["ttft_ms"]["value"] == best["ttft_p99_ms"] and checks["itl_ms"]["value"] == best["itl_p99_ms"]


def test_rows_in_memory_give_what_the_parts_give(tmp_path):
    """loadstats.step_stats (rows in a DataFrame) and the part-by-part scan agree on the streaming keys."""
    from kneeswarm.analysis.measure.inputs import read_steps
    from kneeswarm.analysis.measure.loadstats import step_stats
    from kneeswarm.analysis.measure.requestscan import scan_parts
    from kneeswarm.analysis.measure.streaming import STEP_KEYS

    rd = make_stream_run(tmp_path, usage_offset=lambda step: step, fail=0.03, per_chunk=3, pinned=True, no_text=0.05)
    sla = {"p99_ms": 200.0, "ttft_ms": 48.0}
    parts = scan_parts(rd, read_steps(rd), SETTLE, sla).stats
    frame = step_stats(rd.read_requests(), read_steps(rd), SETTLE)  # no SLA: no goodput
    for key in STEP_KEYS:
        if key.startswith("goodput"):
            assert parts[key].notna().all() and frame[key].isna().all()
        else:
            assert np.allclose(parts[key].to_numpy(float), frame[key].to_numpy(float), equal_nan=True), key
