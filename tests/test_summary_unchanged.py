"""What the analysis writes stays what it wrote: summary.json and summary.md of fixed runs, byte for byte.

The expected files in tests/fixtures/summaries/ were written by the analysis as it stood before its
summary was typed from end to end (the TypedDicts of kneeswarm.analysis.schema built and read instead
of plain dicts), so that retyping the analysis cannot change a figure, a key, their order or a line of
the Markdown.  The runs: the old run directory in tests/fixtures/run-72ed389 (two steps of the demo
target) and three synthetic runs from tests/synthetic_run.py's ground-truth models, seeded, chosen for
what they reach: a retrograde server with [sla] and [capacity] (the knee, findings, USL, capacity and
gates), a four-slot server with errors and a busy generator (invalid steps, error categories, the
generator finding), and a soak (its windows, trends and series).  A synthetic run's directory is named
by the time it was made: its name is replaced by RUN before the comparison.

summary.md is compared byte for byte; summary.json key for key, in order, every string, integer and
null as it was and every float within FLOAT_REL (relative) or FLOAT_ABS: the last bits of a float
are the machine's.  numpy's sums take the SIMD path the CPU has and scipy's USL fit stops where its
arithmetic lands: on a fresh machine (AMD EPYC, AVX2, no AVX-512) a mean came out 96.83290225845336
where the files say ...339, and the fit's lambda 129.96888934824523 for 129.96888919705643.

A deliberate change of the output records the files again: ``python tests/test_summary_unchanged.py``.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from kneeswarm.analysis import analyze
from kneeswarm.contracts.rundir import RunDir
from synthetic_run import closed_loop, make_run, retrograde

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "fixtures" / "summaries"
OLD_RUN = HERE / "fixtures" / "run-72ed389"
RUNS = ("run-72ed389", "retrograde-sla-capacity", "four-slots-errors", "soak")
FILES = ("summary.json", "summary.md")
FLOAT_REL, FLOAT_ABS = 1e-6, 1e-9  # a USL sigma fitted to zero is 5.14e-32 on one CPU, 5.12e-32 on another


def replan(rd: RunDir, **tables: dict) -> None:
    """Add or change tables of a synthetic run's plan.toml."""
    plan = tomllib.loads(rd.plan_path.read_text())
    for name, keys in tables.items():
        plan.setdefault(name, {}).update(keys)
    rd.plan_path.write_text(tomli_w.dumps(plan))


def make(name: str, tmp_path: Path) -> Path:
    """The run directory ``name`` under ``tmp_path``, not yet analysed."""
    if name == "run-72ed389":
        return Path(shutil.copytree(OLD_RUN, tmp_path / name))
    if name == "retrograde-sla-capacity":
        rd = make_run(tmp_path, retrograde(), users=(1, 2, 4, 8, 16, 32), seed=1)
        replan(rd, sla={"p99_ms": 25.0, "error_rate": 0.01}, capacity={"peak_qps": 5000.0})
    elif name == "four-slots-errors":
        rd = make_run(tmp_path, closed_loop(4), users=(1, 2, 4, 8, 16), seed=2,
                      error_plan={3: {"http_5xx": 30, "timeout": 5}}, generator_cpu={4: 95.0})
    else:
        rd = make_run(tmp_path, closed_loop(8), users=(8,) * 8, seed=3)
        replan(rd, load={"mode": "soak", "users": 8, "duration": 112.0, "window": 14.0})
    return rd.path


def written(name: str, tmp_path: Path) -> dict[str, str]:
    """summary.json and summary.md as the analysis writes them for run ``name`` (its directory's
    name as RUN)."""
    run = make(name, tmp_path)
    analyze(run)
    report = RunDir(run).report_dir
    return {f: (report / f).read_text().replace(run.name, "RUN") for f in FILES}


def differences(got: object, want: object, where: str = "") -> list[str]:
    """Where ``got`` is not ``want`` (JSON values): a key, its order, a type, a length, a value; floats
    within FLOAT_REL or FLOAT_ABS of each other are equal."""
    if isinstance(want, float) and isinstance(got, float):
        return [] if math.isclose(got, want, rel_tol=FLOAT_REL, abs_tol=FLOAT_ABS) else [f"{where}: {got!r} != {want!r}"]
    if type(got) is not type(want):
        return [f"{where}: {type(got).__name__} {got!r} != {type(want).__name__} {want!r}"]
    if isinstance(want, dict):
        if list(got) != list(want):
            return [f"{where}: keys {list(got)} != {list(want)}"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items != {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want)) for d in differences(g, w, f"{where}[{i}]")]
    return [] if got == want else [f"{where}: {got!r} != {want!r}"]


def test_float_differences_are_the_only_ones_let_through():
    want = {"a": 1.0, "b": [1, "x", None], "c": 5.14e-32}
    assert differences({"a": 1.0 + 1e-9, "b": [1, "x", None], "c": 5.12e-32}, want) == []
    assert differences({"a": 1.001, "b": [1, "x", None], "c": 0.0}, want) == [".a: 1.001 != 1.0"]
    assert differences({"b": [1, "x", None], "a": 1.0, "c": 0.0}, want)  # the order of keys
    assert differences({"a": 1.0, "b": [1.0, "x", None], "c": 0.0}, want)  # an int became a float
    assert differences({"a": 1.0, "b": [1, "x"], "c": 0.0}, want)


@pytest.mark.parametrize("name", RUNS)
def test_the_summary_is_what_the_analysis_wrote_before(name, tmp_path):
    got = written(name, tmp_path)
    assert got["summary.md"] == (EXPECTED / f"{name}.summary.md").read_text(), f"{name}: summary.md changed"
    changed = differences(json.loads(got["summary.json"]), json.loads((EXPECTED / f"{name}.summary.json").read_text()))
    assert not changed, f"{name}: summary.json changed: {changed[:10]}"


if __name__ == "__main__":  # record the expected files again (a deliberate change of the output)
    import tempfile

    EXPECTED.mkdir(parents=True, exist_ok=True)
    for run_name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            for f, text in written(run_name, Path(tmp)).items():
                (EXPECTED / f"{run_name}.{f}").write_text(text)
    sys.exit(0)
