"""The demo target's LLM engine model (kneeswarm/target/llmengine.py) against its closed form,
then a real target process against the same arithmetic (known delays: sleeps, not CPU)."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import pytest
import requests

from kneeswarm.target.llmengine import PromptTooLong, Scheduler, Seq

PREFILL_S, DECODE_S = 0.001, 0.01
LATE_S = 0.1  # how late a real target may release a token on a loaded 2-core host (tests share it)


def run_all(s: Scheduler) -> list[tuple[float, list[Seq]]]:
    """Step until idle: (end time of the step, the sequences that produced a token in it)."""
    t, out = 0.0, []
    while s.busy:
        r = s.step()
        t += r.duration_s
        out.append((t, r.produced))
    return out


def token_times(steps: list[tuple[float, list[Seq]]], seq: Seq) -> list[float]:
    return [t for t, produced in steps if seq in produced]


def test_one_request_first_token_after_its_prefill_then_one_per_decode_step():
    s = Scheduler(kv_tokens=1000, max_batch=8, prefill_s_per_token=PREFILL_S, decode_s=DECODE_S)
    a = Seq(prompt=40, n=5)
    s.add(a)
    times = token_times(run_all(s), a)
    ttft = DECODE_S + 40 * PREFILL_S
    assert times == pytest.approx([ttft + k * DECODE_S for k in range(5)])
    assert s.used == 0 and s.preemptions == 0


def test_requests_arriving_together_share_one_prefill_step_and_decode_together():
    s = Scheduler(kv_tokens=1000, max_batch=8, prefill_s_per_token=PREFILL_S, decode_s=DECODE_S)
    seqs = [Seq(prompt=10, n=4) for _ in range(3)]
    for q in seqs:
        s.add(q)
    steps = run_all(s)
    first = DECODE_S + 3 * 10 * PREFILL_S
    for q in seqs:
        assert token_times(steps, q) == pytest.approx([first + k * DECODE_S for k in range(4)])
    assert len(steps) == 4  # continuous batching: one step per token for the whole batch


def test_batch_beyond_max_batch_waits_for_a_free_place():
    s = Scheduler(kv_tokens=1000, max_batch=2, prefill_s_per_token=PREFILL_S, decode_s=DECODE_S)
    seqs = [Seq(prompt=10, n=3) for _ in range(3)]
    for q in seqs:
        s.add(q)
    steps = run_all(s)
    first_wave_end = DECODE_S + 20 * PREFILL_S + 2 * DECODE_S  # its prefill step, then 2 decodes
    assert token_times(steps, seqs[1])[-1] == pytest.approx(first_wave_end)
    third = token_times(steps, seqs[2])
    assert third[0] == pytest.approx(first_wave_end + DECODE_S + 10 * PREFILL_S)
    assert third == pytest.approx([third[0] + k * DECODE_S for k in range(3)])


def test_cache_full_preempts_the_last_admitted_which_recomputes_its_tokens():
    # Two sequences of 4 prompt + 6 output tokens in a 16-token cache: both fit while they hold
    # 8 tokens each; the 5th step needs 18 -> the second is preempted (its 8 freed), waits while the
    # first finishes, then prefills its 4 prompt + 4 produced tokens again.
    s = Scheduler(kv_tokens=16, max_batch=4, prefill_s_per_token=PREFILL_S, decode_s=DECODE_S)
    a, b = Seq(prompt=4, n=6), Seq(prompt=4, n=6)
    s.add(a)
    s.add(b)
    results = []
    while s.busy:
        results.append(s.step())
        assert s.used <= 16
    assert s.preemptions == 1 and b.preempted == 1 and a.preempted == 0
    assert [r.preempted for r in results] == [0, 0, 0, 0, 1, 0, 0, 0]
    assert [r.prefilled for r in results] == [8, 0, 0, 0, 0, 0, 8, 0]
    assert [len(r.produced) for r in results] == [2, 2, 2, 2, 1, 1, 1, 1]
    assert sum(r.duration_s for r in results) == pytest.approx(8 * DECODE_S + 16 * PREFILL_S)


@pytest.mark.parametrize("late_steps, preemptions", [(0, 1), (1, 1), (2, 1), (3, 1), (4, 0)])
def test_a_second_sequence_joining_later_is_preempted_once_until_the_first_is_nearly_done(late_steps, preemptions):
    # the same two sequences; the second arrives some steps after the first: within its first 4 steps
    # both still need 20 > 16 tokens at once, later the first finishes before the cache fills
    s = Scheduler(kv_tokens=16, max_batch=4, prefill_s_per_token=0.0, decode_s=DECODE_S)
    s.add(Seq(prompt=4, n=6))
    for _ in range(late_steps):
        s.step()
    s.add(Seq(prompt=4, n=6))
    while s.busy:
        s.step()
    assert s.preemptions == preemptions


def test_no_preemption_while_a_full_batch_fits_the_cache():
    p, n, batch = 6, 5, 4
    s = Scheduler(kv_tokens=batch * (p + n), max_batch=batch, prefill_s_per_token=0.0, decode_s=DECODE_S)
    for _ in range(3 * batch):
        s.add(Seq(prompt=p, n=n))
    peak = 0
    while s.busy:
        s.step()
        peak = max(peak, s.used)
    assert s.preemptions == 0 and peak <= batch * (p + n)


def test_a_request_that_cannot_fit_alone_is_refused():
    s = Scheduler(kv_tokens=10, max_batch=1, prefill_s_per_token=0.0, decode_s=DECODE_S)
    with pytest.raises(PromptTooLong):
        s.add(Seq(prompt=8, n=3))
    s.add(Seq(prompt=7, n=3))  # exactly the cache: fits


def test_abort_frees_the_cache():
    s = Scheduler(kv_tokens=100, max_batch=4, prefill_s_per_token=0.0, decode_s=DECODE_S)
    a, b = Seq(prompt=10, n=50), Seq(prompt=10, n=50)
    s.add(a)
    s.add(b)
    s.step()
    assert s.used == 22
    s.abort(a)
    assert s.used == 11 and s.running == [b]


# -- a real target process ----------------------------------------------------------------------
def stream_times(url: str, prompt_words: int, max_tokens: int) -> tuple[float, list[float]]:
    """(client TTFT s, arrival time of each text chunk) of one streamed completion."""
    body = {"model": "demo", "prompt": " ".join(["w"] * prompt_words), "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}
    t0 = time.perf_counter()
    times = []
    with requests.post(url + "/v1/completions", json=body, stream=True, timeout=30) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["text"]:
                times.append(time.perf_counter())
    return times[0] - t0, times


@pytest.mark.slow
def test_real_target_releases_tokens_on_the_model_schedule_and_counts_preemptions(start_demo_target):
    # Alone: first token after one step with a 50-token prefill (10 + 50 x 2 = 110 ms), then one
    # token per 10 ms step (known delays: a loaded host only adds lateness, bounded below).
    t = start_demo_target("--mode", "knee", "--kv-tokens", "16", "--max-batch", "4",
                          "--prefill-ms-per-token", "2", "--decode-ms", "50")
    with pytest.raises(requests.HTTPError):  # 14 + 3 tokens never fit 16 alone: 400
        stream_times(t.url, 14, 3)
    t2 = start_demo_target("--mode", "knee", "--kv-tokens", "1000", "--prefill-ms-per-token", "2",
                           "--decode-ms", "10")
    t0 = time.perf_counter()
    ttft, times = stream_times(t2.url, 50, 20)
    # no token leaves before its step ends; lateness (a loaded host) is bounded generously above
    assert 0.110 <= ttft < 0.110 + LATE_S
    assert 0.110 + 19 * 0.010 <= times[-1] - t0 < 0.110 + 19 * 0.010 + LATE_S
    assert len(times) == 20
    m2 = t2.metrics()  # the phases on the model's clock: exact, whatever the host's lateness
    assert m2["vllm:request_prefill_time_seconds_count"] == m2["vllm:request_decode_time_seconds_count"] == 1
    assert m2["vllm:request_prefill_time_seconds_sum"] == pytest.approx(0.010 + 50 * 0.002)
    assert m2["vllm:request_decode_time_seconds_sum"] == pytest.approx(19 * 0.010)
    assert 0 <= m2["vllm:request_queue_time_seconds_sum"] < LATE_S  # alone: scheduled on arrival
    # Two sequences of 4 + 6 tokens in a 16-token cache: together they need 20 -> exactly one
    # preemption, whichever of the first's first 4 steps the second one joins (50 ms steps: it may
    # start up to 150 ms late; see the unit test above for the arithmetic).
    with cf.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: stream_times(t.url, 4, 6), range(2)))
    m = t.metrics()
    assert m["vllm:num_preemptions_total"] == 1
    assert m["vllm:generation_tokens_total"] == 12
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["vllm:kv_cache_usage_perc"] == 0


def test_a_decode_step_that_grows_with_the_batch_saturates_throughput():
    # u sequences decoding together: each step d + c*u, so tokens/s = u / (d + c*u) -> 1/c
    d, c, n = 0.005, 0.002, 10
    for u in (1, 4, 16):
        s = Scheduler(kv_tokens=10_000, max_batch=64, prefill_s_per_token=0.0, decode_s=d, decode_s_per_seq=c)
        seqs = [Seq(prompt=5, n=n) for _ in range(u)]
        for q in seqs:
            s.add(q)
        steps = run_all(s)
        assert steps[-1][0] == pytest.approx(n * (d + c * u))
        assert u * n / steps[-1][0] == pytest.approx(u / (d + c * u))
