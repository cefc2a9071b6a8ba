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


if __name__ == "__main__":  # record the expected files again (a deliberate change of the output)
    import tempfile

    EXPECTED.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for f, text in nonmix_written(Path(tmp)).items():
            (EXPECTED / f"nonmix.{f}").write_text(text)
    sys.exit(0)
