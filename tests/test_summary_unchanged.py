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

A deliberate change of the output records the files again: ``python tests/test_summary_unchanged.py``.
"""

from __future__ import annotations

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


@pytest.mark.parametrize("name", RUNS)
def test_the_summary_is_what_the_analysis_wrote_before(name, tmp_path):
    got = written(name, tmp_path)
    for f in FILES:
        assert got[f] == (EXPECTED / f"{name}.{f}").read_text(), f"{name}: {f} changed"


if __name__ == "__main__":  # record the expected files again (a deliberate change of the output)
    import tempfile

    EXPECTED.mkdir(parents=True, exist_ok=True)
    for run_name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            for f, text in written(run_name, Path(tmp)).items():
                (EXPECTED / f"{run_name}.{f}").write_text(text)
    sys.exit(0)
