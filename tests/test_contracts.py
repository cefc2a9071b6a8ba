"""The shared spellings have one owner each, and nothing types them again.

kneeswarm.contracts.outcome owns meta.json's ``ended`` values (``Ended``) and the exit codes of every
command; kneeswarm.contracts.rundir owns the run directory's file names.  These tests read the sources
(ast) and the docs' exit-code table (docs/cli.md), so that a new bare "completed", a new ``EXIT_X = 5`` or a new
``/ "index.html"`` elsewhere fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kneeswarm.contracts import outcome, rundir
from test_layout import ROOT, module_name, sources

ENDED = {e.value for e in outcome.Ended}
#: every file name rundir spells (COMPARE_DIR, "compare", is also the subcommand's name: left out)
FILE_NAMES = {v for k, v in vars(rundir).items()
              if k.isupper() and isinstance(v, str) and "." in v and k != "COMPARE_DIR"}
#: the agent runs on the server with the standard library alone (its names are its own)
EXEMPT = {"kneeswarm.agents.remote"}


def checked_sources() -> list[Path]:
    return [p for p in sources() if not module_name(p).startswith("kneeswarm.target")
            and not any(module_name(p) == e or module_name(p).startswith(e + ".") for e in EXEMPT)]


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings (prose may name a file)."""
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            out.add(id(body[0].value))
    return out


def string_constants(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]


def test_the_file_names_are_found():
    assert {"plan.toml", "meta.json", "steps.csv", "summary.json", "summary.md", "index.html", "junit.xml",
            "prometheus.jsonl", "recorder.json", "compare.json"} <= FILE_NAMES


@pytest.mark.parametrize("path", checked_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_file_names_are_spelled_only_in_rundir(path):
    if module_name(path) == "kneeswarm.contracts.rundir":
        return
    found = [f"line {line}: {text!r}" for line, text in string_constants(path) if text in FILE_NAMES]
    assert not found, f"{path.relative_to(ROOT)}: use the kneeswarm.contracts.rundir names: " + "; ".join(found)


def _ended_literals(path: Path) -> list[str]:
    """Where a str literal that is an Ended value is given to, or compared with, an ``ended``."""
    tree = ast.parse(path.read_text())
    found = []

    def named_ended(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return "ended" in name.lower()

    def literal(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in ENDED

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "ended":
            if any(literal(n) for n in ast.walk(node.value)):
                found.append(f"line {node.value.lineno}: ended=<literal>")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named_ended(s) for s in sides) and any(literal(s) for s in sides):
                found.append(f"line {node.lineno}: compared with a literal")
        elif isinstance(node, ast.Assign) and any(named_ended(t) for t in node.targets) and literal(node.value):
            found.append(f"line {node.lineno}: assigned a literal")
    return found


@pytest.mark.parametrize("path", checked_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_ended_values_come_from_the_enum(path):
    found = _ended_literals(path)
    assert not found, f"{path.relative_to(ROOT)}: use kneeswarm.contracts.outcome.Ended: " + "; ".join(found)


def test_the_ended_check_catches_a_bare_string(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(run, ended):\n    run.update_meta(ended="completed")\n    return ended == "stopped"\n')
    assert len(_ended_literals(probe)) == 2


@pytest.mark.parametrize("path", checked_sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_exit_codes_are_defined_only_in_outcome(path):
    if module_name(path) == "kneeswarm.contracts.outcome":
        return
    tree = ast.parse(path.read_text())
    found = [f"line {n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in n.targets)
             and isinstance(n.value, ast.Constant) and isinstance(n.value.value, int)]
    assert not found, f"{path.relative_to(ROOT)}: an exit code spelled outside kneeswarm.contracts.outcome: {found}"


def documented_exit_codes(page: str) -> list[int]:
    """The codes of the table under docs/cli.md's "## Exit codes" (its rows' first cells), in order."""
    section = page.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    return [int(n) for n in re.findall(r"^\| `(\d+)` \|", section, re.M)]


def test_the_docs_list_every_exit_code():
    page = (ROOT / "docs" / "cli.md").read_text()
    listed = documented_exit_codes(page)
    assert sorted(listed) == sorted(set(outcome.EXIT_CODES.values())), listed  # each once, none missing or extra
    assert len(set(outcome.EXIT_CODES.values())) == len(outcome.EXIT_CODES)  # no two meanings share a code
    # and the check can fail: a row dropped from the table is missed
    dropped = page.replace("| `4` | a regression", "| four | a regression")
    assert dropped != page and 4 not in documented_exit_codes(dropped)


#: tunables shared by several parts, and their one owner
SHARED_TUNABLES = {"FETCH_PERIOD": "kneeswarm.launch.lifecycle", "HEARTBEAT_TIMEOUT": "kneeswarm.agents.remote.defaults"}


def test_shared_tunables_are_defined_once():
    owners: dict[str, list[str]] = {}
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id in SHARED_TUNABLES:
                        owners.setdefault(t.id, []).append(module_name(path))
    assert owners == {name: [owner] for name, owner in SHARED_TUNABLES.items()}


def test_the_remote_agents_heartbeat_fallback_is_the_plans(tmp_path):
    """The agent (standard library only, cannot import the plan) falls back to the same heartbeat
    timeout as the plan's default when agent.json gives none: the plan imports the agent's."""
    from kneeswarm.agents.remote import Agent
    from kneeswarm.agents.settings import AgentSettings
    from kneeswarm.contracts.plan import HEARTBEAT_TIMEOUT, MonitorPlan

    assert Agent(str(tmp_path), {}).heartbeat_timeout == HEARTBEAT_TIMEOUT
    assert MonitorPlan().heartbeat_timeout == AgentSettings().heartbeat_timeout == HEARTBEAT_TIMEOUT


# -- summary.json: every key written is declared (kneeswarm.analysis.summary.build.Summary and its parts) ------------
def _summaries(tmp_path, knee_run) -> dict[str, dict]:
    """Summaries of different shapes: a synthetic closed loop with host samples and GPU power, a
    streamed open-loop batch run with an SLA (tokens, goodput, rate, items/s), and the session's
    real run (conductor, Locust, the knee target, pidstat/vmstat, its /metrics)."""
    import numpy as np

    from kneeswarm import analysis
    from conftest import read_summary
    from kneeswarm.contracts.rundir import write_csv
    from synthetic_run import HOLD, RAMP, T0, closed_loop, make_run
    from test_streaming_analysis import make_stream_run

    rd = make_run(tmp_path / "closed", closed_loop(k=4))
    write_csv(rd.host_dir("server-1") / "gpu.csv", ("t", "gpu", "sm_pct", "power_w"),
              [(t, 0, 50.0, 150.0) for t in np.arange(T0, T0 + 5 * (RAMP + HOLD), 1.0)])
    closed = analysis.analyze(rd.path)
    stream = analysis.analyze(make_stream_run(
        tmp_path / "stream", sla="[sla]\np99_ms = 5000.0\nttft_ms = 1000.0\n",
        extra_plan='mode = "open"\nrates = [2.0, 4.0, 8.0]\nsource_rate = 2.0\narrival = "constant"\n'
                   "[request]\nbatch = 8\n").path)
    return {"closed": closed, "stream": stream, "real": read_summary(knee_run.run_dir)}


@pytest.mark.slow
def test_every_key_written_to_summary_json_is_declared(tmp_path, knee_run):
    from kneeswarm.analysis.schema.summary import undeclared_keys

    summaries = _summaries(tmp_path, knee_run)
    assert "tokens_knee" in summaries["stream"] and "goodput" in summaries["stream"]  # the shapes are covered
    assert "rate" in summaries["stream"]["steps"][0] and summaries["real"]["steps"][0]["server"]
    assert "energy_j_per_request" in summaries["closed"]["steps"][0]
    for name, summary in summaries.items():
        assert undeclared_keys(summary) == [], f"{name}: keys no contract declares (kneeswarm.analysis.summary.build.Summary)"


def test_an_undeclared_summary_key_is_named():
    from kneeswarm.analysis.schema.summary import undeclared_keys

    summary = {"run_id": "r", "complete": True, "bogus": 1, "steps": [{"users": 1, "qps": 2.0, "qpz": 3}],
               "knee": {"users": 4, "method": "saturation", "why": "x"}, "totals": {"requests": 1, "lost": 0}}
    assert undeclared_keys(summary) == ["bogus", "steps[0].qpz", "knee.why", "totals.lost"]


# -- typed contracts of the run directory and the processes' messages ----------------------------
OLD_RUN = ROOT / "tests" / "fixtures" / "run-72ed389"


def test_an_old_run_directory_still_analyses(tmp_path):
    """A run directory written by kneeswarm before the contracts were typed (main at 72ed389):
    `kneeswarm analyze` on a copy exits 0, and each step's requests are the request rows that
    completed in its steady window [t_steady + settle, t_end) (pyarrow and numpy on the rows),
    as that version's own summary said."""
    import shutil

    import numpy as np
    import pyarrow.parquet as pq
    import tomllib

    from conftest import read_summary
    from kneeswarm.launch import cli

    run = Path(shutil.copytree(OLD_RUN, tmp_path / OLD_RUN.name))
    then = read_summary(run)
    assert cli.main(["analyze", str(run)]) == outcome.EXIT_OK
    now = read_summary(run)
    rows = pq.read_table(sorted((run / "requests").glob("*.parquet")), columns=["t_start", "latency_ms", "ok"])
    done = rows["t_start"].to_numpy() + rows["latency_ms"].to_numpy() / 1000.0
    ok = rows["ok"].to_numpy(zero_copy_only=False)
    settle = tomllib.loads((run / rundir.PLAN_FILE).read_text())["load"]["settle"]
    steps = rundir.RunDir(run).read_steps()
    truth = [int(np.sum(ok & (done >= s.t_steady + settle) & (done < s.t_end))) for s in steps.itertuples()]
    assert [s["requests"] for s in now["steps"]] == truth == [s["requests"] for s in then["steps"]]
    assert now["totals"]["requests"] == len(rows) and now["complete"] is True and now["ended"] == outcome.Ended.COMPLETED
    assert [s["valid"] for s in now["steps"]] == [True, True]


def test_the_knee_tabs_columns_are_the_live_rows_keys():
    from kneeswarm.locustfiles.webui import HOST_COLUMNS, STEP_COLUMNS, LiveHost, LiveStep

    assert {k for k, _ in STEP_COLUMNS} <= LiveStep.__required_keys__
    assert {k for k, _ in HOST_COLUMNS} <= LiveHost.__optional_keys__


def meta_keys_written(path: Path) -> list[tuple[int, str]]:
    """(line, key) of every keyword given to ``update_meta(...)`` / ``_record_meta(...)`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("update_meta", "_record_meta"):
            out += [(node.lineno, k.arg) for k in node.keywords if k.arg is not None]
    return out


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_meta_key_written_is_declared(path):
    # rundir.Meta declares meta.json (update_meta takes Unpack[Meta]: mypy checks the writers' types)
    wrong = [f"line {line}: {key}" for line, key in meta_keys_written(path) if key not in rundir.Meta.__annotations__]
    assert not wrong, f"{path.relative_to(ROOT)}: meta.json keys kneeswarm.contracts.rundir.Meta does not declare: {wrong}"


def test_the_meta_check_catches_an_undeclared_key(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("run.update_meta(complete=True, finsihed=1.0)\n")
    assert [k for _, k in meta_keys_written(probe) if k not in rundir.Meta.__annotations__] == ["finsihed"]


def test_an_old_meta_json_reads_whole():
    """Every key the old run's meta.json holds is declared with its type: it reads back as the
    json module parses it, with nothing added to its warnings."""
    import json

    raw = json.loads((OLD_RUN / rundir.META_FILE).read_text())
    assert rundir.RunDir(OLD_RUN).read_meta() == raw


def test_a_meta_value_of_the_wrong_type_is_left_out_and_said(tmp_path):
    """A hand-edited meta.json: a declared key whose value has another JSON type is left out of
    what readers get and said in its warnings (which reach summary.json); an integer time is a
    number; an undeclared key is not read; the file itself is left as it was."""
    import json

    from kneeswarm import analysis
    from synthetic_run import closed_loop, make_run

    rd = make_run(tmp_path, closed_loop(k=4), users=(1, 2))
    on_disk = {**json.loads(rd.meta_path.read_text()), "started": 1_800_000_000, "complete": 1, "hosts": [],
               "workers": True, "ended": None, "warnings": ["an old warning"], "not_a_key": {"x": 1}}
    rd.meta_path.write_text(json.dumps(on_disk))
    meta = rd.read_meta()
    assert meta == {"run_id": rd.path.name, "started": 1_800_000_000, "warnings": [
        "an old warning",
        "meta.json: 'complete' is a JSON number, not true/false; left out",
        "meta.json: 'ended' is a JSON null, not string; left out",
        "meta.json: 'hosts' is a JSON array, not object; left out",
        "meta.json: 'workers' is a JSON true/false, not number; left out"]}  # in the file's order
    assert json.loads(rd.meta_path.read_text()) == on_disk
    summary = analysis.analyze(rd.path)
    assert summary["complete"] is False and set(meta["warnings"]) <= set(summary["warnings"])
    assert summary["meta"] == {"started": 1_800_000_000}


def test_summary_meta_keys_are_meta_json_keys_of_the_same_type():
    """summary.json "meta" copies keys of meta.json as they are: each is declared in both
    contracts with one type (a rename or retype in rundir.Meta fails here)."""
    import typing

    from kneeswarm.analysis.schema.summary import SummaryMeta

    meta, copied = typing.get_type_hints(rundir.Meta), typing.get_type_hints(SummaryMeta)
    assert {k: meta.get(k) for k in copied} == copied
