"""The run history per request class of a traffic mix (`kneeswarm history` on runs with a ``mix``).

The runs: copies of the old real run in tests/fixtures/run-72ed389 (its meta.json, plan.toml,
request rows and summary), each given its own start time and run id; the mix runs' summaries get
a ``mix`` section written here (no fixture holds a real mix run's directory: tests/test_mix_runs.py
makes them live, as long tests), with the classes' figures chosen by the test: a class "slow"
whose P99 at 2 users rises 10 % a run while the whole and the class "cheap" hold.  Expected values
come from those summaries as written, read back here (numpy / scipy on their figures), never from
the history's code.

Runs without a mix: history.json and history.md stay what the history wrote before it had classes,
byte for byte (tests/fixtures/history/, recorded by the code before the per-class series;
``python tests/test_mix_history.py`` records them again after a deliberate change).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from scipy import stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.conftest import run_cli  # noqa: E402

FIXTURE = HERE / "fixtures" / "run-72ed389"
EXPECTED = HERE / "fixtures" / "history"
T0 = 1_796_000_000.0  # the copies' start times: T0 + 600 s x their index
NONMIX_RUNS = 6
FILES = ("history.json", "history.md")


def make_runs(root: Path, n: int, edit: Callable[[dict[str, Any], int], None],
              plan_edit: Callable[[str, int], str] | None = None) -> list[Path]:
    """``n`` copies of the fixture run under ``root`` (run-00 ...), each summary passed through ``edit``."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        d = root / f"run-{i:02d}"
        shutil.copytree(FIXTURE, d)
        meta = json.loads((d / "meta.json").read_text())
        (d / "meta.json").write_text(json.dumps({**meta, "started": T0 + 600 * i, "run_id": d.name}))
        summary = json.loads((d / "report" / "summary.json").read_text())
        summary["run_id"] = d.name
        edit(summary, i)
        (d / "report" / "summary.json").write_text(json.dumps(summary))
        if plan_edit:
            (d / "plan.toml").write_text(plan_edit((d / "plan.toml").read_text(), i))
        out.append(d)
    return out


def _slower(summary: dict[str, Any], i: int) -> None:
    """The whole's latencies 4 % higher each run (a drift with a change point to name)."""
    for s in summary["steps"]:
        for k in ("p50_ms", "p95_ms", "p99_ms", "p999_ms"):
            s[k] *= 1 + 0.04 * i + (0.1 if i >= 3 else 0.0)


def _longer_prompts(text: str, i: int) -> str:
    return text.replace("prompt_tokens = 32", "prompt_tokens = 64") if i >= 3 else text


def nonmix_written(tmp: Path) -> dict[str, str]:
    """history.json and history.md of NONMIX_RUNS copies without a mix, the runs' folder as ROOT."""
    from kneeswarm.analysis.runs.history import run_history

    root = (tmp / "runs").resolve()
    make_runs(root, NONMIX_RUNS, _slower, _longer_prompts)
    run_history([root], out=str(tmp / "out"))
    return {f: (tmp / "out" / f).read_text().replace(str(root), "ROOT") for f in FILES}


def test_history_of_runs_without_a_mix_is_what_it_wrote_before(tmp_path):
    got = nonmix_written(tmp_path)
    for f in FILES:
        assert got[f] == (EXPECTED / f"nonmix.{f}").read_text(), f"{f} changed"
    assert '"classes"' not in got["history.json"] and "class " not in got["history.md"]


# -- runs with a mix -----------------------------------------------------------------------------------
MIX_RUNS = 6
SLOW_P99_AT_2 = [80.0 * 1.1 ** i for i in range(MIX_RUNS)]  # +10 % a run: the class that regressed
CHEAP_P99_AT_2 = [20.0, 21.0, 19.5, 20.5, 19.8, 20.2]  # no order: it holds
CLASS_REQUESTS = 2000  # per class and step: 20 beyond its P99, so its P99 enters the drift test


def _class(name: str, i: int, p99_at_2: float, qps_per_user: float, took_off: int | None) -> dict[str, Any]:
    steps = [{"index": k, "users": u, "valid": True, "requests": CLASS_REQUESTS, "ok": CLASS_REQUESTS,
              "qps": qps_per_user * u * (1 + 0.01 * ((i + k) % 3)), "p50_ms": 10.0 * (1 + 0.01 * ((i + k) % 3)),
              "p95_ms": 15.0 * (1 + 0.01 * ((i + k) % 3)), "p99_ms": p99} for k, (u, p99) in enumerate(((1, 0.6 * p99_at_2 if name == "cheap" else 50.0 + i % 2),
                                                            (2, p99_at_2)))]
    return {"name": name, "weight_share": 0.5, "requests": 2 * CLASS_REQUESTS, "share": 0.5, "steps": steps,
            "knee": {"users": 2, "qps": steps[1]["qps"]}, "latency_knee": {"took_off_users": took_off}}


def _with_mix(summary: dict[str, Any], i: int, drop: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """A mix of "cheap" and "slow" (less the classes in ``drop``); the whole's steps unchanged."""
    for s in summary["steps"]:
        s["requests"] = 2 * CLASS_REQUESTS
    classes = [_class("cheap", i, CHEAP_P99_AT_2[i], 30.0, None),
               _class("slow", i, SLOW_P99_AT_2[i], 10.0, 2 if i >= 3 else None)]
    summary["mix"] = {"classes": [c for c in classes if c["name"] not in drop], "first_latency_knee": None, "text": ""}


def _summaries(runs: list[Path]) -> list[dict[str, Any]]:
    return [json.loads((d / "report" / "summary.json").read_text()) for d in runs]


def _drifts_worse_by_scipy(values: list[float], worse: int) -> bool:
    """Mann–Kendall (Kendall's tau against the run order) p < 0.05 and the Theil–Sen line moving
    >= 10 % of the median over the window, the slope's sign the worse one: the documented rule."""
    x = np.arange(len(values), dtype=float)
    tau, p = stats.kendalltau(x, values)
    slope = stats.theilslopes(values, x)[0]
    moved = slope * (len(values) - 1) / abs(float(np.median(values)))
    return bool(p < 0.05 and abs(moved) >= 0.10 and np.sign(slope) == worse)


def _group(result: dict[str, Any]) -> dict[str, Any]:
    (g,) = result["groups"]
    return g


def _class_of(g: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in g["classes"] if c["name"] == name)


def _figure(c: dict[str, Any], figure: str) -> dict[str, Any]:
    return next(s for s in c["series"] if s["figure"] == figure)


def test_a_class_whose_p99_rose_is_named_while_the_whole_holds(tmp_path):
    runs = make_runs(tmp_path / "runs", MIX_RUNS, _with_mix)
    res = run_cli("history", str(tmp_path / "runs"), "--fail-on-drift", "--out", str(tmp_path / "out"), timeout=120)
    from kneeswarm.contracts.outcome import EXIT_DRIFT

    assert res.returncode == EXIT_DRIFT, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("kneeswarm history: drifted worse: fixture class slow p99_ms at 2 users +"), res.stderr
    assert "cheap" not in res.stderr
    result = json.loads((tmp_path / "out" / "history.json").read_text())
    summaries = _summaries(runs)
    g = _group(result)
    # the whole held (its summaries' steps are the fixture's, unchanged): none of its figures drifted
    assert not [s for s in g["series"] if s["drift"]["drifting"]]
    assert [(d.get("class"), d["figure"]) for d in result["drift_worse"]] == [("slow", "class slow p99_ms at 2 users")]
    classes = {n: [next(c for c in s["mix"]["classes"] if c["name"] == n) for s in summaries] for n in ("cheap", "slow")}
    for name, written in classes.items():
        c = _class_of(g, name)
        assert c["gaps"] == []
        # its P99 at the step both runs had (2 users), as each summary wrote it
        truth = [next(st["p99_ms"] for st in w["steps"] if st["users"] == 2) for w in written]
        p99 = _figure(c, "p99_ms at 2 users")
        assert p99["values"] == truth
        assert (p99["drift"]["direction"] == "worse") == _drifts_worse_by_scipy(truth, +1) == (name == "slow")
        # its peak: the valid step of the highest QPS, numpy over each summary's class steps
        peak = _figure(c, "peak QPS")["values"]
        assert peak == [float(np.max([st["qps"] for st in w["steps"] if st["valid"]])) for w in written]
        assert c["peak_users"] == [w["steps"][int(np.argmax([st["qps"] for st in w["steps"]]))]["users"] for w in written]
        assert c["knee_users"] == [w["knee"]["users"] for w in written]
        assert c["knee_qps"] == [w["knee"]["qps"] for w in written]
        assert c["latency_knee_users"] == [w["latency_knee"]["took_off_users"] for w in written]
    slow = _figure(_class_of(g, "slow"), "p99_ms at 2 users")
    assert slow["drift"]["rel_change"] > 0.10 and slow["change_point"]["run"] in {d.name for d in runs}
    md = (tmp_path / "out" / "history.md").read_text()
    assert "### class slow" in md and "### class cheap" in md
    assert "plan `fixture`: class slow p99_ms at 2 users" in md
    html = (tmp_path / "out" / "history.html").read_text()
    assert "<h3>class slow</h3>" in html and "fixture class slow: latency at 2 users" in html


def test_a_class_missing_from_a_run_is_a_gap_said_not_a_crash(tmp_path):
    root = tmp_path / "runs"
    runs = make_runs(root, 5, lambda s, i: _with_mix(s, i, {"cheap"} if i == 2 else set()))
    plain = make_runs(tmp_path / "plain", 1, lambda s, i: None)[0]  # the same plan and target, no mix
    later = root / "run-05"
    shutil.move(plain, later)
    meta = json.loads((later / "meta.json").read_text())
    (later / "meta.json").write_text(json.dumps({**meta, "started": T0 + 600 * 5, "run_id": later.name}))
    res = run_cli("history", str(root), "--out", str(tmp_path / "out"), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    g = _group(json.loads((tmp_path / "out" / "history.json").read_text()))
    cheap = _class_of(g, "cheap")
    assert cheap["gaps"] == [{"run": runs[2].name, "reason": "the run's mix had no class cheap"},
                             {"run": later.name, "reason": "no traffic mix in this run"}]
    p99 = _figure(cheap, "p99_ms at 2 users")["values"]
    assert [v is None for v in p99] == [False, False, True, False, False, True]
    assert [v for v in p99 if v is not None] == [CHEAP_P99_AT_2[i] for i in (0, 1, 3, 4)]
    assert _class_of(g, "slow")["gaps"] == [{"run": later.name, "reason": "no traffic mix in this run"}]
    md = (tmp_path / "out" / "history.md").read_text()
    assert f"- gap: `{runs[2].name}` (the run's mix had no class cheap)" in md


def test_a_class_s_own_sla_boundary_and_a_torn_mix_section(tmp_path):
    """A class with [sla.classes.NAME] gets its figures at its own boundary (the step its summary's
    sla.classes names); a mix section of the wrong shapes is read as far as it goes, not a crash."""
    def edit(summary: dict[str, Any], i: int) -> None:
        _with_mix(summary, i)
        summary["sla"] = {**summary["sla"], "classes": {"slow": {"passed": True, "best": {"users": 1, "qps": 10.0}}}}
        if i == 4:
            summary["mix"]["classes"] += [{"name": "torn", "steps": "not a list", "knee": 3}, 5, {"steps": []}]

    runs = make_runs(tmp_path / "runs", 5, edit)
    res = run_cli("history", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    g = _group(json.loads((tmp_path / "out" / "history.json").read_text()))
    written = [next(c for c in s["mix"]["classes"] if c["name"] == "slow") for s in _summaries(runs)]
    at_sla = _figure(_class_of(g, "slow"), "p99_ms at the SLA boundary")["values"]
    assert at_sla == [next(st["p99_ms"] for st in w["steps"] if st["users"] == 1) for w in written]
    assert not any(s["figure"].endswith("SLA boundary") for s in _class_of(g, "cheap")["series"])
    torn = _class_of(g, "torn")
    assert torn["series"] == [] and torn["knee_users"] == [None] * 5 and len(torn["gaps"]) == 4


if __name__ == "__main__":  # record the expected files again (a deliberate change of the output)
    import tempfile

    EXPECTED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for f, text in nonmix_written(Path(tmp)).items():
            (EXPECTED / f"nonmix.{f}").write_text(text)
    sys.exit(0)
