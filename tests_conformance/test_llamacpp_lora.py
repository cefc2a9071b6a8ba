"""A LoRA adapter mix against llama.cpp's `llama-server`: one base model and two adapters, each
request naming its adapter in llama-server's own per-request ``lora`` field, driven by a real
`kneeswarm run` with ``[[request.classes]]`` and checked against the server's own record of which
adapters each request ran with.

The server: the suite's llama-server (servers.llama_cpp) serving the tiny llama GGUF of
tiny_gguf.py with two LoRA adapters of it (tiny_gguf.write_lora: random A and B on every weight
matrix of every layer, the same rank, different seeds), loaded with ``--lora A,B`` (ids 0 and 1);
``-lv 5`` (debug) for its per-request record below.  A request without a ``lora`` field runs with
the server's global adapter list -- every adapter at scale 1, and ``--lora-init-without-apply``
does not change that in this build (it only leaves the context unapplied at start; GET
/lora-adapters still says 1.0, and such a request's greedy answer is the one with both adapters:
test_no_lora_field_runs_every_adapter) -- so the base class names adapter 0 at scale 0: the
server then sets every adapter it does not name to 0 (construct_lora_list).

The server's own record, per request (tools/server/server-context.cpp of that tree):
- which adapters a request ran with: a slot logs ``launching slot : {json}`` at debug level when
  it takes a task, with the json of ``server_slot::to_json``: the slot's task, or when it has none
  yet -- and it has none at that moment, the line comes before ``slot.task`` is set -- the task it
  ran before (``task_prev``), its id and its parsed ``params``, ``lora`` included (the request's
  ``{id, scale}`` list as the server parsed it; an empty list: no adapter).  So each such line
  records the slot's PREVIOUS task, and the last task of each slot is read from ``GET /slots``
  after the run (the same json).  No per-request line at info level names an adapter, and
  /metrics has no per-adapter counter;
- when each request ended and how long the server worked on it: its timing block at info level
  ("task N | prompt eval time = ...", "eval time = ..."), stamped by this test as it arrives --
  joined to the adapter record by the task id.

Requests with different adapters are never in one batch: a decode runs the slots whose adapter
list equals the first generating slot's (``can_batch_with``), slots taken in index order, and
switching the context's adapters makes it reserve its compute graph again
(llama_context::set_adapters_lora).  The server's own gauge of that is
``llamacpp:n_busy_slots_per_decode`` (summary step ``decode_batch``); ``test_adapters_split_the_batch``
compares one adapter with two at the same users.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import requests

from conftest import (
    FIGURES, assert_every_step_valid, class_counts, kneeswarm_run, plan_text, read_summary,
    row_ends, rows_and_steps, Run, scrape, target_of)
from servers import Installed, Server, free_port, llama_cpp

SERVER_INSTALL = llama_cpp  # installed with the others before the first test (conftest.py)

pytestmark = pytest.mark.slow

SLOTS = 4
LAYERS = 16  # a request of MAX_TOKENS ~10-20 ms: enough requests for the shares (SHARE_ABS)
RANK = 16  # both adapters: the same cost per token, so two adapters against one differ by the split alone
MAX_TOKENS = 16  # pinned (ignore_eos)
CTX_PER_SLOT = 128
STEPS = (1, 2, 4)
HOLD_S = 12.0
# class -> (weight, its request's lora list as (id, scale)): base sets adapter 0 to 0 (and so every
# adapter: module docstring), the others name one adapter each
CLASSES = {"base": (2, ((0, 0.0),)), "lora-a": (1, ((0, 1.0),)), "lora-b": (1, ((1, 1.0),))}
SHARE_ABS = 0.03  # each class's share of the rows within 3 points of its weight's
SPLIT_USERS = 4  # one adapter against two at the same users (test_adapters_split_the_batch)
# tokens per decode over the busy slots at each decode: one adapter's decodes hold every busy slot
# (measured 0.99-1.00), two adapters' about two in three (0.67-0.72)
FULL_BATCH, SPLIT_BATCH = 0.95, 0.85

LAUNCH = re.compile(r"launching slot : (\{.*\})\s*$")
PROMPT = re.compile(r"\| task (\d+) \| prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
RESERVE = "sched_reserve: reserving ..."  # llama_context::sched_reserve, at info level
EVAL = re.compile(r"\| task (\d+) \|\s+eval time =\s*([\d.]+) ms /\s*(\d+) tokens \(\s*([\d.]+) ms per token")


def applied(lora: list[dict]) -> tuple[int, ...]:
    """The ids of a lora list ({id, scale} objects) whose scale is not 0."""
    return tuple(sorted(int(a["id"]) for a in lora if float(a["scale"]) != 0.0))


def adapters_of(params: dict, listed: list[dict]) -> tuple[int, ...]:
    """The adapter ids a task ran with, as launch_slot_with_task decides: its parsed ``lora`` list
    (the adapters it does not name at 0), or where it named none the server's global list (LISTED:
    GET /lora-adapters)."""
    return applied(params.get("lora") or listed)


def expected(lora: tuple[tuple[int, float], ...]) -> tuple[int, ...]:
    return applied([{"id": i, "scale": sc} for i, sc in lora])


@dataclass
class Timing:
    t: float  # when its "eval time" line arrived (this machine's clock = the master's)
    prompt_ms: float
    gen_ms: float
    gen_n: int
    per_token_ms: float

    @property
    def total_ms(self) -> float:
        return self.prompt_ms + self.gen_ms


@dataclass
class ServerRecord:
    timings: dict[int, Timing]  # task -> its timing block
    adapters: dict[int, tuple[int, ...]]  # task -> the adapters it ran with (launch lines + /slots)
    launch_lines: int
    from_slots: int
    reserves: list[float]  # when the context reserved its compute graph again (an adapter switch, or start-up)

    def by_adapters(self) -> dict[tuple[int, ...], list[Timing]]:
        out: dict[tuple[int, ...], list[Timing]] = {}
        for task, t in self.timings.items():
            out.setdefault(self.adapters[task], []).append(t)
        return out


def server_record(server: Server, slots: list[dict], listed: list[dict]) -> ServerRecord:
    prompts: dict[int, float] = {}
    timings: dict[int, Timing] = {}
    adapters: dict[int, tuple[int, ...]] = {}
    launches, reserves = 0, []
    for t, line in server.lines:
        if RESERVE in line:
            reserves.append(t)
        elif (m := LAUNCH.search(line)) is not None:
            slot = json.loads(m[1])
            if "id_task" in slot:  # a slot's first task has no task before it
                adapters[int(slot["id_task"])] = adapters_of(slot["params"], listed)
                launches += 1
        elif (m := PROMPT.search(line)) is not None:
            prompts[int(m[1])] = float(m[2])
        elif (m := EVAL.search(line)) is not None:
            task = int(m[1])
            timings[task] = Timing(t, prompts.pop(task), float(m[2]), int(m[3]), float(m[4]))
    last = 0
    for slot in slots:
        if "id_task" in slot:
            adapters[int(slot["id_task"])] = adapters_of(slot["params"], listed)
            last += 1
    return ServerRecord(timings, adapters, launches, last, reserves)


@dataclass
class LoraRun:
    installed: Installed
    run: Run
    record: ServerRecord
    listed: list[dict]  # GET /lora-adapters before the run
    before: dict[str, float]
    after: dict[str, float]
    cpu_s: float  # the server's user + system CPU seconds over the run, the kernel's (/proc/PID/stat)
    adapter_files: list[Path] = field(default_factory=list)


def gguf(llama: Installed, out: Path, *args: str) -> Path:
    subprocess.run([sys.executable, str(Path(__file__).with_name("tiny_gguf.py")), str(out), "--layers", str(LAYERS),
                    *args], check=True, timeout=120, env={**os.environ, "PYTHONPATH": str(llama.paths["gguf_py"])})
    return out


@pytest.fixture(scope="module")
def llama() -> Installed:
    return llama_cpp()


@pytest.fixture(scope="module")
def files(llama, tmp_path_factory) -> tuple[Path, list[Path]]:
    """The base model and its two adapters (ids 0 and 1 in the order given to the server)."""
    d = tmp_path_factory.mktemp("gguf-lora")
    return gguf(llama, d / "tiny.gguf"), [gguf(llama, d / f"lora-{n}.gguf", "--lora", str(RANK), "--seed", str(s))
                                          for n, s in (("a", 1), ("b", 2))]


def start_llama(llama: Installed, model: Path, adapters: list[Path], *more: str) -> Server:
    port = free_port()
    # one --lora with the paths comma-separated (given twice, this build warns that only the last is used)
    return Server([str(llama.paths["server"]), "-m", str(model), "--lora", ",".join(map(str, adapters)),
                   "--host", "127.0.0.1", "--port", str(port), "--parallel", str(SLOTS), "-c", str(SLOTS * CTX_PER_SLOT),
                   "-t", "1", "-tb", "1", "--metrics", "--alias", "tiny", "--no-warmup", "-lv", "5", *more],
                  f"http://127.0.0.1:{port}", "/health")


def lora_toml(lora: tuple[tuple[int, float], ...]) -> str:
    """The plan's ``lora`` line: each (id, scale) of LORA (none: no line)."""
    return f"lora = [{', '.join(f'{{id = {i}, scale = {sc}}}' for i, sc in lora)}]\n" if lora else ""


def request_lines(lora: tuple[tuple[int, float], ...] = ()) -> str:
    return (f'model = "tiny"\nendpoint = "chat"\nmax_tokens = {MAX_TOKENS}\nignore_eos = true\n'
            "prompt_tokens = 16\ntimeout = 30.0\n" + lora_toml(lora))


def classes_toml(classes: dict[str, tuple[int, tuple[tuple[int, float], ...]]]) -> str:
    out = ""
    for name, (weight, lora) in classes.items():
        out += f'\n[[request.classes]]\nname = "{name}"\nweight = {weight}\n' + lora_toml(lora)
    return out


def lora_run(llama: Installed, files: tuple[Path, list[Path]], out: Path, name: str, steps: tuple[int, ...],
             hold: float, classes: dict[str, tuple[int, tuple[tuple[int, float], ...]]] | None = None,
             lora: tuple[tuple[int, float], ...] = ()) -> LoraRun:
    model, adapters = files
    server = start_llama(llama, model, adapters)
    try:
        listed = requests.get(server.url + "/lora-adapters", timeout=5).json()
        plan = plan_text(name, server.url, "openai", f"{server.url}/metrics", steps, hold, request_lines(lora),
                         workers=1) + (classes_toml(classes) if classes else "")
        proc = psutil.Process(server.pid)
        before, cpu0 = scrape(server.url + "/metrics"), proc.cpu_times()
        run = kneeswarm_run(plan, out, "--pid", str(server.pid))
        time.sleep(1.0)  # the last answers' log lines
        after, cpu1 = scrape(server.url + "/metrics"), proc.cpu_times()
        slots = requests.get(server.url + "/slots", timeout=5).json()
    finally:
        server.stop()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return LoraRun(llama, run, server_record(server, slots, listed), listed, before, after, cpu, adapters)


@pytest.fixture(scope="module")
def mix(llama, files, tmp_path_factory) -> LoraRun:
    return lora_run(llama, files, tmp_path_factory.mktemp("llama-lora-mix"), "llamacpp-lora-mix", STEPS, HOLD_S,
                    classes=CLASSES)


@pytest.fixture(scope="module")
def one_adapter(llama, files, tmp_path_factory) -> LoraRun:
    return lora_run(llama, files, tmp_path_factory.mktemp("llama-lora-one"), "llamacpp-lora-one", (SPLIT_USERS,),
                    HOLD_S, lora=((0, 1.0),))


@pytest.fixture(scope="module")
def two_adapters(llama, files, tmp_path_factory) -> LoraRun:
    return lora_run(llama, files, tmp_path_factory.mktemp("llama-lora-two"), "llamacpp-lora-two", (SPLIT_USERS,),
                    HOLD_S, classes={"lora-a": (1, ((0, 1.0),)), "lora-b": (1, ((1, 1.0),))})


def weight_share(name: str, classes: dict = CLASSES) -> float:
    return classes[name][0] / sum(w for w, _ in classes.values())


# -- the server loaded both adapters; a request naming none runs with both ----------------------------
def test_server_lists_both_adapters(mix):
    assert [(a["id"], Path(a["path"]).name, a["scale"]) for a in mix.listed] == [
        (0, "lora-a.gguf", 1.0), (1, "lora-b.gguf", 1.0)], mix.listed


def test_no_lora_field_runs_every_adapter(llama, files):
    """Greedy answers (temperature 0) of one prompt: a request without ``lora`` answers as one naming
    both adapters at scale 1, not as the base model (adapter 0 at 0, so every adapter at 0) -- even
    with --lora-init-without-apply, which this build documents as loading the adapters at scale 0."""
    model, adapters = files
    server = start_llama(llama, model, adapters, "--lora-init-without-apply")
    try:
        def answer(lora: list[dict] | None) -> str:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "hello world the model"}],
                    "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0}
            if lora is not None:
                body["lora"] = lora
            res = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30)
            return res.json()["choices"][0]["message"]["content"]

        listed = requests.get(server.url + "/lora-adapters", timeout=5).json()
        none, base = answer(None), answer([{"id": 0, "scale": 0.0}])
        both = answer([{"id": 0, "scale": 1.0}, {"id": 1, "scale": 1.0}])
        only_a = answer([{"id": 0, "scale": 1.0}])
    finally:
        server.stop()
    print(f"no lora {none!r}, base {base!r}, both {both!r}, a {only_a!r}; listed {listed}")
    assert [a["scale"] for a in listed] == [1.0, 1.0], listed
    assert none == both and len({base, both, only_a}) == 3, (none, base, both, only_a)


def test_every_step_valid_and_no_errors(mix):
    rows, _ = rows_and_steps(mix.run.run_dir)
    assert_every_step_valid(mix.run.run_dir, rows)
    assert (rows["usage_out"] == MAX_TOKENS).all(), rows["usage_out"].value_counts()
    assert set(rows["class"]) == set(CLASSES), rows["class"].value_counts()


# -- per class: the client's rows against the server's own record of each request's adapters ------
def test_each_class_count_is_the_servers_count_of_its_adapters(mix):
    rec = mix.record
    # every request the server finished has its adapters on record (a launch line or /slots), once
    missing = sorted(set(rec.timings) - set(rec.adapters))
    assert not missing, (missing[:10], len(rec.timings), rec.launch_lines, rec.from_slots)
    by = rec.by_adapters()
    assert set(by) <= {expected(lora) for _, lora in CLASSES.values()}, {k: len(v) for k, v in by.items()}
    rows, steps = rows_and_steps(mix.run.run_dir)
    unrecorded = 0
    for name, (_w, lora) in CLASSES.items():
        served = by.get(expected(lora), [])
        # per step, by when each request ended: the class's rows against the server's blocks of its adapters
        unrecorded += class_counts(name, rows, steps, [t.t for t in served], f"llama.cpp LoRA {name}",
                                   f"llama.cpp llama-server, LoRA mix: class {name}", mix.installed.version, "openai")
    # requests in flight when the load stopped were served but never recorded: at most one per user
    assert 0 <= unrecorded <= max(STEPS), unrecorded


def test_each_class_share_is_its_weights(mix):
    rows, _ = rows_and_steps(mix.run.run_dir)
    s = read_summary(mix.run.run_dir)
    shares = {name: float((rows["class"] == name).mean()) for name in CLASSES}
    print(f"rows {len(rows)}; shares {shares}")
    for name in CLASSES:
        assert abs(shares[name] - weight_share(name)) <= SHARE_ABS, (name, shares, len(rows))
    assert {c["name"]: c["weight_share"] for c in s["mix"]["classes"]} == pytest.approx(
        {n: weight_share(n) for n in CLASSES}, rel=1e-12)


# -- summary.json's mix: numpy's figures on the same rows ------------------------------------------
def _pct(values: np.ndarray, q: float) -> float | None:
    v = values[np.isfinite(values)]
    return float(np.percentile(v, q)) if len(v) else None


def test_mix_figures_are_numpys_on_the_rows(mix):
    rows, _ = rows_and_steps(mix.run.run_dir)
    s = read_summary(mix.run.run_dir)
    steps = {st["index"]: st for st in s["steps"]}
    t = rows["t_start"].to_numpy(dtype=float)
    totals: dict[str, int] = {}
    for c in s["mix"]["classes"]:
        for cs in c["steps"]:
            st = steps[cs["index"]]
            window = rows.loc[(t >= st["t_lo"]) & (t < st["t_hi"])]
            mine = window.loc[window["class"] == c["name"]]
            good = mine.loc[mine["ok"]]
            lat = good["latency_ms"].to_numpy(dtype=float)
            ttft = good["ttft_ms"].to_numpy(dtype=float)
            tok = good["tokens_out"].to_numpy(dtype=float)
            tpot = (lat - ttft) / (tok - 1)
            span = st["t_hi"] - st["t_lo"]
            want = {"requests": len(mine), "ok": len(good), "qps": len(good) / span,
                    "share_sent": len(mine) / len(window), "p50_ms": _pct(lat, 50), "p95_ms": _pct(lat, 95),
                    "p99_ms": _pct(lat, 99), "ttft_p99_ms": _pct(ttft, 99), "tpot_p99_ms": _pct(tpot[tok > 1], 99),
                    "tokens_s": float(np.nansum(tok)) / span, "error_rate": 0.0}
            got = {k: cs[k] for k in want}
            assert got == pytest.approx(want, rel=1e-9), (c["name"], cs["users"], got, want)
            totals[c["name"]] = totals.get(c["name"], 0) + len(mine)
        assert c["requests"] == totals[c["name"]], (c["name"], c["requests"], totals)
    everything = sum(totals.values())
    assert {c["name"]: c["share"] for c in s["mix"]["classes"]} == pytest.approx(
        {n: k / everything for n, k in totals.items()}, rel=1e-12)
    FIGURES.setdefault("llama.cpp LoRA base", {})["knee (users)"] = ", ".join(
        f"{c['name']} {(c.get('knee') or {}).get('users')}/{(c.get('latency_knee') or {}).get('users')}"
        for c in s["mix"]["classes"])
    print("class knees (QPS/P99):", FIGURES["llama.cpp LoRA base"]["knee (users)"], "whole",
          (s.get("knee") or {}).get("users"), "first latency knee", s["mix"].get("first_latency_knee"))


# -- latency: each class's P50 is never below the server's for its adapters ------------------------
def test_each_class_p50_at_least_the_servers(mix):
    rows, _ = rows_and_steps(mix.run.run_dir)
    s = read_summary(mix.run.run_dir)
    by = mix.record.by_adapters()
    steps = {st["index"]: st for st in s["steps"]}
    figs = []
    for c in s["mix"]["classes"]:
        lora = expected(CLASSES[c["name"]][1])
        for cs in c["steps"]:
            st = steps[cs["index"]]
            srv = [x for x in by[lora] if st["t_lo"] <= x.t < st["t_hi"]]
            server_p50 = float(np.percentile([x.total_ms for x in srv], 50))
            per_token = float(np.median([x.per_token_ms for x in srv]))
            figs.append(f"{c['name']} {cs['users']}u {cs['p50_ms']:.1f}/{server_p50:.1f} ({per_token:.2f} ms/token)")
            assert cs["p50_ms"] >= server_p50, (c["name"], cs["users"], cs["p50_ms"], server_p50)
    print("P50 ms client/server per class and step:", "; ".join(figs))


# -- adapters split the batch: one adapter against two at the same users ---------------------------
def window_increase(scrapes: pd.DataFrame, key: str, lo: float, hi: float) -> float:
    """A counter's increase between the first and the last scrape in [LO, HI] (no reset in a run)."""
    inside = scrapes.loc[(scrapes["t"] >= lo) & (scrapes["t"] <= hi), key].to_numpy(dtype=float)
    return float(inside[-1] - inside[0])


def split_figures(r: LoraRun) -> dict[str, float]:
    s = read_summary(r.run.run_dir)
    st = s["steps"][0]
    lo, hi = st["t_lo"], st["t_hi"]
    srv = [x for x in r.record.timings.values() if lo <= x.t < hi]
    rows, _ = rows_and_steps(r.run.run_dir)
    win = rows.loc[(rows["t_start"] >= lo) & (rows["t_start"] < hi) & rows["ok"]]
    itl = np.concatenate([np.asarray(g, dtype=float) for g in win["itl_ms"] if g is not None and len(g)])
    # the server's own values as the run scraped them (read here from the file, not from the analysis)
    scrapes = pd.read_csv(Path(r.run.run_dir) / "hosts" / "target" / "prometheus.csv")
    during = scrapes.loc[(scrapes["t"] >= lo) & (scrapes["t"] <= hi)]
    generated = window_increase(scrapes, "llamacpp:tokens_predicted_total", lo, hi)
    decodes = window_increase(scrapes, "llamacpp:n_decode_total", lo, hi)
    # n_busy_slots_per_decode is the server's busy-slot count summed at every decode since it started
    # over n_decode_total (never reset): their product is that sum, a counter
    scrapes["busy_sum"] = scrapes["llamacpp:n_busy_slots_per_decode"] * scrapes["llamacpp:n_decode_total"]
    return {"qps": st["qps"], "p50_ms": st["p50_ms"], "p99_ms": st["p99_ms"],
            # its batch: tokens generated per llama_decode call, from its counters over the steady window
            "tokens_per_decode": generated / decodes,
            # its busy slots at each decode of the window, batched or not
            "busy_slots": window_increase(scrapes, "busy_sum", lo, hi) / decodes,
            # ... and its gauge as scraped (the mean since the server started)
            "busy_gauge": float(during["llamacpp:n_busy_slots_per_decode"].mean()),
            # the summary's "sequences per decode" (analysis/measure/target.py)
            "decode_batch": target_of(st).get("decode_batch", float("nan")),
            # tokens per second of the server's CPU (the kernel's count, the whole run): what the split
            # costs whatever else the host runs -- the two runs are one after the other, each QPS at the
            # host's load of its moment
            "tokens_per_cpu_s": (r.after["llamacpp:tokens_predicted_total"]
                                 - r.before.get("llamacpp:tokens_predicted_total", 0.0)) / r.cpu_s,
            "reserves_per_s": sum(lo <= t < hi for t in r.record.reserves) / (hi - lo),
            "gen_tokens_s": generated / (hi - lo),
            "server_ms_per_token": float(np.median([x.per_token_ms for x in srv])),
            "itl_p50_ms": float(np.percentile(itl, 50)), "itl_p99_ms": float(np.percentile(itl, 99)),
            # a request whose adapter is not the running batch's waits: its TTFT grows, and the
            # server's own prompt time with it
            "ttft_p50_ms": float(np.percentile(win["ttft_ms"].to_numpy(dtype=float), 50)),
            "server_prompt_ms": float(np.median([x.prompt_ms for x in srv]))}


def test_adapters_split_the_batch(one_adapter, two_adapters):
    """The same users, the same cost per token (both adapters of one rank): one adapter's requests
    decode together, two adapters' only with their own -- the server's own counters, tokens generated
    per llama_decode call, fall below its busy slots, and each change of adapters makes the context
    reserve its graph again.  Its gauge llamacpp:n_busy_slots_per_decode counts the busy slots at
    each decode, batched or not (and averages them since the server started): it does not show the
    split; the summary's decode_batch is the batch."""
    one, two = split_figures(one_adapter), split_figures(two_adapters)
    print(f"{SPLIT_USERS} users, one adapter / two: " + ", ".join(f"{k} {one[k]:.2f}/{two[k]:.2f}" for k in one))
    FIGURES.setdefault("llama.cpp LoRA split", {}).update({
        "server": f"llama.cpp llama-server, one adapter / two at {SPLIT_USERS} users",
        "version": one_adapter.installed.version, "protocol": "openai",
        "P50 ms client/server": f"QPS {one['qps']:.1f}/{two['qps']:.1f}, tokens per decode "
                                f"{one['tokens_per_decode']:.2f}/{two['tokens_per_decode']:.2f}"})
    # every change of the running batch's adapters reserves the context's graph again (info level,
    # RESERVE): never within one adapter's steady window, many times a second with two
    assert one["reserves_per_s"] == 0.0 and two["reserves_per_s"] >= 1.0, (one, two)
    # one adapter: every busy slot in each decode (a new request's prompt decodes with the others'
    # tokens and yields its first); two: a decode holds only the busy slots of one adapter
    assert one["tokens_per_decode"] >= FULL_BATCH * one["busy_slots"], one
    assert two["tokens_per_decode"] < SPLIT_BATCH * two["busy_slots"], two
    # the summary's sequences per decode is the batch, not the busy slots
    for f in (one, two):
        assert f["decode_batch"] == pytest.approx(f["tokens_per_decode"], rel=0.05), f
