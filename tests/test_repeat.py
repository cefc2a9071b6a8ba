"""Repeat as a first-class run: the merged result of one plan run several times (kneeswarm.analysis.runs.repeat),
its pages, `kneeswarm merge` / `analyze FOLDER`, and compare and history taking a repeated run as one
point with its interval.

The runs here are synthetic run directories from a ground-truth model (tests/synthetic_run.py),
each analysed by the real analysis; the expected figures come from those runs' own summaries and
rows, with numpy and scipy computing what the merge must say, and summaries written by hand where
the keys of a later analysis (knee intervals, marginal findings, verdicts) are needed.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

from kneeswarm import analysis
from kneeswarm.analysis.runs.compare import compare_runs
from kneeswarm.analysis.runs.history import run_history
from kneeswarm.analysis.runs.repeat import merge_runs, write_repeat
from kneeswarm.analysis.schema.comparison import INTERVAL_BETWEEN_RUNS
from kneeswarm.contracts import outcome
from kneeswarm.contracts.plan import PlanError
from kneeswarm.contracts.planfile import load_plan
from kneeswarm.contracts.rundir import REPEAT_JSON, REPEAT_MD, REPORT_HTML, RunDir
from kneeswarm.launch import cli

from synthetic_run import SETTLE, T0, closed_loop, make_run, retrograde, strict_json

OLD_RUN = Path(__file__).parent / "fixtures" / "run-72ed389"


def _run(root: Path, name: str, model, seed: int, t0: float = T0, **kw) -> Path:
    """A synthetic run analysed, moved to ``root/name`` (meta.json with its start, as a real run's)."""
    rd = make_run(root / f".{name}", model, seed=seed, t0=t0, **kw)
    dest = root / name
    shutil.move(str(rd.path), dest)
    shutil.rmtree(root / f".{name}")
    RunDir(dest).update_meta(started=t0, run_id=name)
    analysis.analyze(dest)
    return dest


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> list[Path]:
    """Three runs of one 4-slot server: the third loses 20 % of its QPS past the knee (retrograde)."""
    root = tmp_path_factory.mktemp("series")
    return [_run(root, "r1", closed_loop(k=4), 1, noise=0.05), _run(root, "r2", closed_loop(k=4), 2, noise=0.05),
            _run(root, "r3", retrograde(k=4, drop=0.2), 3, noise=0.05)]


def summary(run: Path) -> dict:
    return json.loads(RunDir(run).summary_path.read_text())


# -- the plan ------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, says", [
    ({"load.repeat": 0}, "load.repeat must be >= 1"),
    ({"load.repeat": 2.5}, "load.repeat must be int"),
    ({"load.cooldown": -1.0}, "load.cooldown must be >= 0"),
    ({"load.repeat": 2, "load.shapes": [[8, 8]], "protocol": "openai"}, "load.repeat and load.shapes"),
    ({"load.repeat": 2, "load.mode": "soak", "load.users": 1, "load.duration": 60.0, "load.window": 10.0,
      "load.steps": []}, "a soak's windows are its repetitions"),
])
def test_bad_repeat_keys_are_one_line(overrides, says):
    with pytest.raises(PlanError) as e:
        load_plan(None, overrides)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_repeat_and_cooldown_round_trip_through_plan_toml(tmp_path):
    p = load_plan(None, {"load.repeat": 3, "load.cooldown": 1.5})
    (tmp_path / "plan.toml").write_text(p.to_toml())
    back = load_plan(tmp_path / "plan.toml")
    assert (back.load.repeat, back.load.cooldown) == (3, 1.5)
    assert (load_plan(None).load.repeat, load_plan(None).load.cooldown) == (1, 5.0)


# -- the merge -----------------------------------------------------------------------------------
def test_each_step_is_the_runs_mean_with_students_t_between_them(series, tmp_path):
    rep = write_repeat(tmp_path / "m", "syn", series)
    sums = [summary(r) for r in series]
    assert rep["planned"] == rep["merged"] == 3 and rep["complete"] is True
    assert [s["users"] for s in rep["steps"]] == [1, 2, 4, 8, 16]
    for step in rep["steps"]:
        for key in ("qps", "p50_ms", "p99_ms"):
            values = [next(s[key] for s in sm["steps"] if s["users"] == step["users"]) for sm in sums]
            fig = step[key]
            assert fig["values"] == pytest.approx(values) and fig["mean"] == pytest.approx(np.mean(values))
            lo, hi = stats.t.interval(0.95, 2, loc=np.mean(values), scale=stats.sem(values))
            assert fig["between"] == pytest.approx([max(0.0, lo), hi])
            assert fig["sd"] == pytest.approx(np.std(values, ddof=1))
    on_disk = strict_json(tmp_path / "m" / REPEAT_JSON)
    assert on_disk["steps"][2]["qps"]["between"] == pytest.approx(rep["steps"][2]["qps"]["between"])
    assert (tmp_path / "m" / REPEAT_MD).is_file() and (tmp_path / "m" / REPORT_HTML).is_file()


def test_within_run_intervals_come_from_each_runs_own_rows(series):
    """The QPS interval of a step is about the normal one of its rows' counts per 0.5 s bin, and the
    P50/P99 intervals hold the percentiles numpy takes of the same rows."""
    rep = merge_runs(series, "syn")
    for k, run in enumerate(series):
        rows = pq.read_table(RunDir(run).request_parts()).to_pandas()
        steps = RunDir(run).read_steps()
        for i, st in enumerate(rep["steps"]):
            s = steps.iloc[i]
            lo, hi = s["t_steady"] + SETTLE, s["t_end"]
            win = rows[(rows.t_start >= lo) & (rows.t_start < hi) & rows.ok]
            counts = np.bincount(((win.t_start - lo) / ((hi - lo) / 40)).astype(int).clip(0, 39), minlength=40)
            half = 1.96 * counts.std(ddof=1) / np.sqrt(40) / ((hi - lo) / 40)
            q = st["qps"]["within"][k]
            assert (q[1] - q[0]) / 2 == pytest.approx(half, rel=0.35), (st["users"], k)
            for key, pct in (("p50_ms", 50), ("p99_ms", 99)):
                w = st[key]["within"][k]
                assert w[0] <= np.percentile(win.latency_ms, pct) <= w[1]


def test_knee_spread_and_findings_counted_over_the_runs(series):
    rep = merge_runs(series, "syn")
    sums = [summary(r) for r in series]
    knees = [s["knee"]["users"] for s in sums]
    assert rep["knee"]["users"] == knees and rep["knee"]["mode"] == 4 and rep["knee"]["mode_runs"] == knees.count(4)
    assert rep["knee"]["text"].startswith(f"knee 4 users in {knees.count(4)} of 3 runs")
    truth = {}
    for i, s in enumerate(sums, 1):
        for f in s["findings"]:
            truth.setdefault(f["id"], set()).add(i)
    assert "retrograde" in truth and truth["retrograde"] == {3}  # the model's drop, in the third run only
    assert {c["id"]: set(c["confirmed_in"]) for c in rep["findings"]} == truth
    for c in rep["findings"]:
        assert c["label"] == f"{len(truth[c['id']])} of 3" and c["stable"] == (len(truth[c["id"]]) == 3)
        assert c["marginal"] == 0
    retro = next(c for c in rep["findings"] if c["id"] == "retrograde")
    assert retro["severity"] == "critical" and not retro["stable"]


def test_the_pages_mark_the_findings_that_did_not_repeat(series, tmp_path):
    write_repeat(tmp_path / "m", "syn", series)
    md = (tmp_path / "m" / REPEAT_MD).read_text()
    assert "`retrograde` | critical | 1 of 3 | 1 of 3: **did not repeat**" in md
    assert "**Findings that did not repeat:** `retrograde` (1 of 3)" in md
    page = (tmp_path / "m" / REPORT_HTML).read_text()
    assert '<tr class="unstable" data-finding="retrograde">' in page and 'id="repeat-chart"' in page
    assert all(f'href="../{r.name}/report/{REPORT_HTML}"' in page for r in series)


def _hand_summary(run_id: str, knee: int, interval, confirmed: list[dict], marginal: list[dict] | None,
                  causes: list[str] | None, sla_passed: bool | None = None) -> dict:
    s = {"run_id": run_id, "complete": True, "ended": "completed",
         "knee": {"users": knee, "qps": 80.0, "method": "saturation", "interval": interval, "stability": 0.8},
         "peak": {"users": 8, "qps": 81.0},
         "steps": [{"users": u, "valid": True, "requests": 400, "qps": 20.0 * min(u, 4), "p50_ms": 50.0,
                    "p99_ms": 60.0, "t_lo": 1.0, "t_hi": 2.0} for u in (1, 2, 4, 8)],
         "findings": confirmed}
    if marginal is not None:
        s["findings_marginal"] = marginal
    if causes is not None:
        s["verdict"] = {"causes": causes, "text": "x"}
    if sla_passed is not None:
        s["sla"] = {"set": True, "passed": sla_passed}
    return s


def _hand_run(root: Path, name: str, summary: dict) -> Path:
    rd = RunDir(root / name)
    rd.report_dir.mkdir(parents=True)
    (rd.path / "requests").mkdir()
    rd.update_meta(run_id=name, complete=True)
    rd.summary_path.write_text(json.dumps(summary))
    return rd.path


def test_knee_intervals_marginal_findings_and_causes_when_the_summaries_have_them(tmp_path):
    """A later analysis' keys (written here by hand): the knee intervals and where they all meet,
    confirmed and marginal counted apart, each run's support kept, the verdict's causes counted."""
    def f(fid, support, by=None):
        return {"id": fid, "severity": "critical" if fid == "retrograde" else "warning", "text": f"{fid} said",
                "support": support, **({"explained_by": by} if by else {})}
    runs = [
        _hand_run(tmp_path, "a", _hand_summary("a", 4, [2, 4], [f("waiting_not_computing", 0.9), f("retrograde", 0.7)],
                                               [], ["waiting_not_computing"], True)),
        _hand_run(tmp_path, "b", _hand_summary("b", 4, [4, 8], [f("waiting_not_computing", 0.95)],
                                               [f("retrograde", 0.4, "waiting_not_computing")], ["waiting_not_computing"], True)),
        _hand_run(tmp_path, "c", _hand_summary("c", 2, [2, 4], [f("waiting_not_computing", 1.0)], [],
                                               ["waiting_not_computing"], False)),
    ]
    rep = merge_runs(runs, "hand")
    assert rep["knee"]["intervals"] == [[2, 4], [4, 8], [2, 4]] and rep["knee"]["overlap"] == [4, 4]
    assert rep["knee"]["text"] == "knee 4 users in 2 of 3 runs (2-4 over the runs, median 4)"
    by = {c["id"]: c for c in rep["findings"]}
    assert (by["waiting_not_computing"]["confirmed"], by["waiting_not_computing"]["label"]) == (3, "3 of 3")
    assert by["waiting_not_computing"]["stable"] and by["waiting_not_computing"]["support"] == [0.9, 0.95, 1.0]
    r = by["retrograde"]
    assert (r["confirmed"], r["marginal"], r["confirmed_in"], r["marginal_in"]) == (1, 1, [1], [2])
    assert not r["stable"] and r["explained_by"] == ["waiting_not_computing"] and r["severity"] == "critical"
    assert rep["causes"] == [{"id": "waiting_not_computing", "runs": 3, "label": "3 of 3"}]
    assert rep["sla"] == {"set": True, "passed": False, "passed_runs": 2, "runs": 3, "text": "met in 2 of 3 runs (not in run 3)"}
    assert [x["knee_interval"] for x in rep["runs"]] == [[2, 4], [4, 8], [2, 4]]
    assert rep["runs"][1]["findings_marginal"] == ["retrograde"]


@pytest.mark.parametrize("intervals, overlap, said", [
    ([[4, None], [4, 8], [2, 4]], [4, 4], "Every run's knee interval holds 4-4 users."),
    ([[4, None], [2, None], [2, 8]], [4, 8], "Every run's knee interval holds 4-8 users."),
    ([[4, None], [6, None], [2, None]], [6, None], "Every run's knee interval holds 6 users and beyond."),
    ([[4, None], [2, 3], [2, 8]], None, None),
])
def test_a_knee_interval_open_above_is_kept_and_meets_the_others(tmp_path, intervals, overlap, said):
    """A run's knee interval whose high end is null (more than 5 % of its resamples found no knee in
    the tested range: the knee lies at its low end or beyond) is an interval, not a missing one: it
    holds every user count from its low end up, and the intervals meet where their ranges do."""
    runs = [_hand_run(tmp_path, n, _hand_summary(n, 4, iv, [], [], [])) for n, iv in zip("abc", intervals)]
    rep = write_repeat(tmp_path / "m", "open", runs)
    assert [r["knee_interval"] for r in rep["runs"]] == intervals
    assert rep["knee"]["intervals"] == intervals and rep["knee"]["overlap"] == overlap
    md = (tmp_path / "m" / REPEAT_MD).read_text()
    assert (said in md) if said else "Every run's knee interval holds" not in md
    assert "| [4, beyond] |" in md and "<td>[4, beyond]</td>" in (tmp_path / "m" / REPORT_HTML).read_text()


def test_summaries_without_the_later_keys_merge_all_the_same(tmp_path):
    """The run written before the contracts were typed (tests/fixtures/run-72ed389) twice: no knee
    interval, no marginal list, no verdict; its findings count as confirmed, as reported."""
    runs = [shutil.copytree(OLD_RUN, tmp_path / n) for n in ("old1", "old2")]
    rep = merge_runs(runs, "old")
    s = summary(runs[0])
    assert rep["merged"] == 2 and rep["knee"]["intervals"] == [None, None] and rep["knee"]["overlap"] is None
    assert rep["causes"] == [] and all(c["marginal"] == 0 for c in rep["findings"])
    assert {c["id"] for c in rep["findings"]} == {f["id"] for f in s["findings"]}
    assert all(c["label"] == "2 of 2" for c in rep["findings"])
    assert [st["users"] for st in rep["steps"]] == [st["users"] for st in s["steps"]]
    for st, orig in zip(rep["steps"], s["steps"]):  # the same run twice: no spread between the runs
        assert st["qps"]["mean"] == pytest.approx(orig["qps"]) and st["qps"]["sd"] == pytest.approx(0.0)


def test_an_incomplete_or_unreadable_run_is_listed_and_left_out(series, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    interrupted = shutil.copytree(series[1], tmp_path / "interrupted")
    s = summary(interrupted)
    s.update(complete=False, ended=outcome.Ended.INTERRUPTED)
    RunDir(interrupted).summary_path.write_text(json.dumps(s))
    rep = merge_runs([series[0], interrupted, broken], "syn", planned=4)
    assert [r["merged"] for r in rep["runs"]] == [True, False, False]
    assert rep["runs"][1]["left_out"] == "incomplete (ended: interrupted)"
    assert "not a kneeswarm run directory" in rep["runs"][2]["left_out"]
    assert rep["merged"] == 1 and rep["complete"] is False
    assert any("1 of the 4 planned runs did not run" in w for w in rep["warnings"])
    assert rep["steps"][0]["qps"]["values"] == [summary(series[0])["steps"][0]["qps"]]
    assert rep["steps"][0]["qps"]["between"] is None  # one run: no interval between runs


# -- the command line --------------------------------------------------------------------------------
def test_merge_and_analyze_commands(series, tmp_path, capsys):
    out = tmp_path / "merged"
    assert cli.main(["merge", *map(str, series), "--out", str(out), "--name", "syn"]) == outcome.EXIT_OK
    said = capsys.readouterr().out
    assert "kneeswarm repeat: syn, 3 of 3 runs merged" in said and f"repeat report: {out / REPORT_HTML}" in said
    (out / REPEAT_MD).unlink()
    assert cli.main(["analyze", str(out)]) == outcome.EXIT_OK  # merged again from its runs
    assert (out / REPEAT_MD).is_file() and json.loads((out / REPEAT_JSON).read_text())["merged"] == 3
    assert cli.main(["merge", str(series[0]), str(tmp_path / "nowhere")]) == outcome.EXIT_BAD_INPUT
    assert "nowhere: not a directory" in capsys.readouterr().err


def test_fail_on_sla_judges_the_merged_result(tmp_path, capsys):
    """The SLA met in 2 of 3 runs fails the gate (exit 3); met in every run passes it."""
    runs = [_hand_run(tmp_path, n, _hand_summary(n, 4, None, [], None, None, ok))
            for n, ok in (("a", True), ("b", True), ("c", False))]
    write_repeat(tmp_path / "m", "sla", runs)
    assert cli.main(["analyze", str(tmp_path / "m"), "--fail-on-sla"]) == outcome.EXIT_SLA_FAILED
    assert "SLA failed: met in 2 of 3 runs (not in run 3)" in capsys.readouterr().err
    write_repeat(tmp_path / "ok", "sla", runs[:2])
    assert cli.main(["analyze", str(tmp_path / "ok"), "--fail-on-sla"]) == outcome.EXIT_OK


# -- compare and history -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slower(tmp_path_factory) -> list[Path]:
    """Three runs of the same server 30 % slower."""
    root = tmp_path_factory.mktemp("slower")
    return [_run(root, f"s{i}", closed_loop(k=4, s_ms=13.0), 10 + i, noise=0.05) for i in range(3)]


def test_compare_two_repeated_runs_uses_welchs_interval(series, slower, tmp_path):
    write_repeat(tmp_path / "base", "syn", series[:2] + [series[0]])
    write_repeat(tmp_path / "new", "syn", slower)
    result = compare_runs(tmp_path / "base", tmp_path / "new")
    assert result["settings"]["interval"] == INTERVAL_BETWEEN_RUNS
    assert result["base"]["runs"] == result["new"]["runs"] == 3
    b = [summary(r) for r in series[:2] + [series[0]]]
    n = [summary(r) for r in slower]
    for st in result["steps"]:
        bq = [next(s["qps"] for s in x["steps"] if s["users"] == st["users"]) for x in b]
        nq = [next(s["qps"] for s in x["steps"] if s["users"] == st["users"]) for x in n]
        ci = stats.ttest_ind(nq, bq, equal_var=False).confidence_interval(0.95)
        assert st["qps"]["ci"] == pytest.approx([ci.low, ci.high])
        assert st["qps"]["delta"] == pytest.approx(np.mean(nq) - np.mean(bq))
    assert result["verdict"] == "regressed"  # 30 % slower: QPS -23 % at every step, far outside the runs' spread
    assert all(st["qps"]["direction"] == "worse" for st in result["steps"])
    assert result["knee"]["base"]["runs"] == 3
    from kneeswarm.analysis.reports.compare_report import compare_markdown

    assert "over 3 runs)" in compare_markdown(result)


def test_compare_a_single_run_against_a_repeated_one(series, tmp_path, capsys):
    """Against a single run the interval is the one for one more run of the repeated side: the
    pooled t interval of the runs' values against the single value (scipy, equal variances)."""
    write_repeat(tmp_path / "rep", "syn", series[:2] + [series[0]])
    single = series[1]
    result = compare_runs(single, tmp_path / "rep")
    reps = [summary(r) for r in series[:2] + [series[0]]]
    one = summary(single)
    for st in result["steps"]:
        rq = [next(s["qps"] for s in x["steps"] if s["users"] == st["users"]) for x in reps]
        sq = next(s["qps"] for s in one["steps"] if s["users"] == st["users"])
        ci = stats.ttest_ind(rq, [sq], equal_var=True).confidence_interval(0.95)
        assert st["qps"]["ci"] == pytest.approx([ci.low, ci.high])
    assert result["verdict"] == "no significant change"
    assert cli.main(["compare", str(single), str(tmp_path / "rep"), "-q"]) == outcome.EXIT_OK
    assert (tmp_path / "rep" / "compare" / "compare.json").is_file()  # beside the merged result
    md = (tmp_path / "rep" / "compare" / "compare.md").read_text()
    assert "(repeated: 3 runs merged)" in md and "between runs" in md


def test_history_takes_a_repeated_run_as_one_point_with_its_interval(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    singles = [_run(root, f"single{i}", closed_loop(k=4), 20 + i, t0=T0 + 1000 * i) for i in range(4)]
    members = [_run(root, f"member{i}", closed_loop(k=4), 30 + i, t0=T0 + 1000 * (4 + i)) for i in range(3)]
    rep = write_repeat(root / "x-repeat", "syn", members)
    result, _ = run_history([root], out=str(tmp_path / "hist"))
    (group,) = result["groups"]
    assert [r["run_id"] for r in group["runs"]] == [p.name for p in singles] + ["x-repeat"]  # members not again
    assert group["runs"][-1]["repeat"]["members"] == [p.name for p in members]
    qps4 = next(s for s in group["series"] if s["figure"] == "peak QPS")
    assert qps4["values"][-1] == pytest.approx(rep["peak"]["qps"]["mean"])
    assert qps4["intervals"][-1] == pytest.approx(rep["peak"]["qps"]["between"])
    assert qps4["intervals"][:4] == [None] * 4
    p50 = next(s for s in group["series"] if s["figure"] == "p50_ms at 2 users")
    step = next(s for s in rep["steps"] if s["users"] == 2)
    assert p50["values"][-1] == pytest.approx(step["p50_ms"]["mean"])
    assert p50["intervals"][-1] == pytest.approx(step["p50_ms"]["between"])
    md = (tmp_path / "hist" / "history.md").read_text()
    assert "`x-repeat`: 3 of 3 runs merged; knee 4 users in 3 of 3 runs" in md
    lo, hi = step["p50_ms"]["between"]
    assert f"| p50_ms at 2 users | {step['p50_ms']['mean']:.4g} [{lo:.4g}, {hi:.4g}] |" in md


# -- bench/stability.py: its table is read from the merged result ----------------------------------
def _stability_bench():
    """bench/stability.py as a module (bench/ is no package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("bench_stability", Path(__file__).parent.parent / "bench" / "stability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def _bench_rows(out: str) -> list[list[str]]:
    """The cells of the printed table's run rows."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line[:3] in {f"| {i}" for i in range(1, 10)}]


def _kept(root: Path, scenario: str, runs: list[Path]) -> None:
    """``runs`` laid out as bench/stability.py --keep leaves a scenario: merged under root/scenario/out."""
    write_repeat(root / scenario / "out" / f"x-{scenario}-repeat", scenario, runs)
    (root / scenario / "start.json").write_text(json.dumps({"loadavg": [2.5, 1.25, 0.5], "cpus": 2, "started": "then"}))


def test_the_stability_bench_prints_each_runs_knee_and_verdict_from_the_merged_result(series, tmp_path, capsys):
    """The three synthetic runs, merged and printed as the knee scenario: each row is what that run's
    own summary.json says (read here directly), and the two lines say whether they agree."""
    _kept(tmp_path, "knee", series)
    assert _stability_bench().main(["--from", str(tmp_path), "--only", "knee"]) == 0
    out = capsys.readouterr().out
    assert "load average at the start: 2.50, 1.25, 0.50 (1, 5, 15 min) on 2 CPUs" in out
    sums = [summary(r) for r in series]
    rows = _bench_rows(out)
    assert len(rows) == 3
    ids = lambda xs: ", ".join(xs) or "–"  # noqa: E731
    for i, (row, s) in enumerate(zip(rows, sums), 1):
        knee, causes = s["knee"], s["verdict"]["causes"]
        lo, hi = knee["interval"]
        assert row[:4] == [str(i), f"{knee['users']:g}", f"[{lo:g}, {'beyond' if hi is None else f'{hi:g}'}]",
                           f"{knee['stability']:.0%}"]
        assert row[4:7] == [ids(causes), ids([f["id"] for f in s["findings"]]),
                            ids([f["id"] for f in s["findings_marginal"]])]
        assert row[7] == ("yes" if knee["users"] == 4 and causes == ["waiting_not_computing"] else "no")
    same = all(s["verdict"]["causes"] == sums[0]["verdict"]["causes"] for s in sums)
    assert f"knee: same root cause in every run: {'yes' if same else 'no'} (" in out
    ivs = [s["knee"]["interval"] for s in sums]
    meet = max(iv[0] for iv in ivs) <= min(math.inf if iv[1] is None else iv[1] for iv in ivs)
    assert f"knee: knee intervals overlap in every run: {'yes' if meet else 'no'} (" in out


@pytest.mark.parametrize("knees, intervals, causes, same, meet", [
    ([4, 4, 2], [[2, 4], [4, 8], [2, 4]], [["waiting_not_computing"]] * 3, "yes (waiting_not_computing)",
     "yes (every run's interval holds [4, 4] users)"),
    ([2, 4, 4], [[2, 2], [4, 8], [4, None]], [["a"], ["a", "b"], ["a"]], "no (run 1: a; run 2: a, b; run 3: a)",
     "no (run 1: [2, 2]; run 2: [4, 8]; run 3: [4, beyond])"),
    ([4, 4, 4], [[4, None], [2, 8], [4, None]], [["a"]] * 3, "yes (a)", "yes (every run's interval holds [4, 8] users)"),
    ([4, None, 4], [[2, 4], None, [2, 4]], [[], [], []], "yes (no root cause in any run)", "no (no knee interval in run 2)"),
    ([None] * 3, [None] * 3, [["c"]] * 3, "yes (c)", "yes (no knee in any run, nor in 80%, 80%, 80% of their resamples)"),
])
def test_the_stability_bench_says_whether_causes_and_knee_intervals_repeat(tmp_path, capsys, knees, intervals, causes,
                                                                           same, meet):
    runs = [_hand_run(tmp_path / "runs", n, _hand_summary(n, k, iv, [], [], c))
            for n, k, iv, c in zip("abc", knees, intervals, causes)]
    _kept(tmp_path / "kept", "knee", runs)
    assert _stability_bench().main(["--from", str(tmp_path / "kept")]) == 0
    out = capsys.readouterr().out
    assert f"knee: same root cause in every run: {same}\n" in out
    assert f"knee: knee intervals overlap in every run: {meet}\n" in out


def test_the_stability_bench_lists_its_scenarios_and_refuses_an_unknown_one(capsys):
    bench = _stability_bench()
    assert bench.main(["--list"]) == 0
    listed = capsys.readouterr().out
    for name in ("half-cpu", "oversubscribed", "knee", "llm-kv", "usl-threshold", "usl-past", "knee-jitter"):
        assert f"\n{name}: " in "\n" + listed
    assert "(needs root)" in listed
    assert bench.main(["--only", "knee,nope"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "--only knee,nope: no scenario nope (there are half-cpu, oversubscribed, knee, llm-kv, usl-threshold, "
        "usl-past, knee-jitter)"]
