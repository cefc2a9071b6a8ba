"""The conformance suite: real inference servers driven by a real `kneeswarm run`.

Run with ``make conformance`` (not part of ``make test``).  Each server's figures -- requests
counted by the client and by the server, P50 latency of both, the knee -- are collected in
``FIGURES`` by the tests and printed as one table at the end of the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest

REPO = Path(__file__).resolve().parent.parent
KNEESWARM = str(Path(sys.executable).with_name("kneeswarm"))  # the console script of this venv
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(REPO) not in sys.path:  # tests/treetruth.py: the kernel's account of a process tree, shared with tests/
    sys.path.append(str(REPO))

FIGURES: dict[str, dict[str, str]] = {}  # server -> column -> text, printed at the end
COLUMNS = ("server", "version", "protocol", "requests client/server", "P50 ms client/server", "knee (users)",
           "expected knee", "findings", "tree CPU s agent/kernel", "cold install s", "run s")


TEST_TIMEOUT_S = 3600  # a test's first fixture may build its server (pyproject's 300 s is for tests/)


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.conformance)
        item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session", autouse=True)
def servers_installed(request) -> None:
    """Every server the selected tests need (their module's ``SERVER_INSTALL``), installed side by
    side before the first test runs (servers.install_side_by_side): the cold installs overlap."""
    from servers import install_side_by_side

    wanted = []
    for item in request.session.items:
        install = getattr(item.module, "SERVER_INSTALL", None)
        if install is not None and install not in wanted:
            wanted.append(install)
    install_side_by_side(wanted)


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    tr = terminalreporter
    tr.section("conformance figures")
    tr.write_line("| " + " | ".join(COLUMNS) + " |")
    tr.write_line("|" + "---|" * len(COLUMNS))
    for row in FIGURES.values():
        tr.write_line("| " + " | ".join(row.get(c, "") for c in COLUMNS) + " |")
    out = os.environ.get("KNEESWARM_CONFORMANCE_FIGURES")
    if out:
        Path(out).write_text(json.dumps(FIGURES, indent=1))


@dataclass
class Run:
    run_dir: Path
    res: subprocess.CompletedProcess
    seconds: float


def plan_text(name: str, url: str, protocol: str, metrics_url: str, steps: Sequence[int], hold: float,
              request: str, workers: int = 2) -> str:
    """The plan of every conformance run: ``steps`` each held ``hold`` s after a 1 s ramp and a
    1 s settle, at least 30 requests a step; ``request``: the [request] table's lines."""
    return (f'name = "{name}"\ntarget = "{url}"\nprotocol = "{protocol}"\nmetrics_url = "{metrics_url}"\n\n'
            f'[load]\nsteps = [{", ".join(map(str, steps))}]\nramp = 1.0\nhold = {hold}\nsettle = 1.0\n'
            f"workers = {workers}\n\n[request]\n{request}\n[analysis]\nmin_requests = 30\n")


def kneeswarm_run(plan: str, out: Path, *args: str, timeout: float = 600) -> Run:
    """The installed `kneeswarm` console script on PLAN (TOML text), its run directory under OUT."""
    import time

    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.toml").write_text(plan)
    t0 = time.monotonic()
    res = subprocess.run([KNEESWARM, "run", str(out / "plan.toml"), "--out", str(out / "runs"), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    seconds = time.monotonic() - t0
    runs = sorted(p for p in (out / "runs").iterdir() if p.is_dir()) if (out / "runs").exists() else []
    assert res.returncode == 0 and len(runs) == 1, (res.returncode, runs, res.stderr[-4000:])
    return Run(runs[0], res, seconds)


def scrape(metrics_url: str) -> dict[str, float]:
    """The server's Prometheus exposition now, as {"name{labels}": value}."""
    import requests

    from kneeswarm.collectors.prometheus import parse_exposition

    return parse_exposition(requests.get(metrics_url, timeout=5).text)


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "report" / "summary.json").read_text())


COUNT_REL = 0.01  # requests per step: the client's rows vs the server's own count within 1 % ...
COUNT_EDGE = 2  # ... or two requests (ending within a few ms of a step's edge: the server's line and the
#                client's last byte may fall on either side of it)


def rows_and_steps(run_dir: Path):
    from kneeswarm.contracts.rundir import RunDir

    return RunDir(run_dir).read_requests(), RunDir(run_dir).read_steps()


def assert_every_step_valid(run_dir: Path, rows=None) -> dict:
    """The run complete, every request ok, every step valid (its reasons shown when not); the summary."""
    s = read_summary(run_dir)
    assert s["complete"] is True, s.get("warnings")
    if rows is None:
        rows, _ = rows_and_steps(run_dir)
    assert rows["ok"].all() and rows["error"].isna().all(), rows[~rows["ok"]].head()
    for st in s["steps"]:
        assert st["valid"] is True, (st["users"], st["reasons"])
        assert st["error_rate"] == 0.0
    return s


def record_counts(key: str, figs: list[tuple[int, int, int]], **columns: str) -> None:
    """The printed table's "requests client/server" in the row KEY (per_step_counts' figures), and
    other COLUMNS of that row (e.g. server="...": its name; a row no test names shows its KEY)."""
    row = FIGURES.setdefault(key, {})
    row["requests client/server"] = f"{sum(c for _, c, _ in figs)}/{sum(s for _, _, s in figs)}"
    row.update(columns)
    row.setdefault("server", key)


def class_counts(name: str, rows, steps, server_t, key: str, server: str, version: str, protocol: str) -> int:
    """One class of a mix against the server's record of its requests (``server_t``: when each
    ended): per step (per_step_counts, recorded in the table's row KEY), the whole run's server
    count at least the client's; returns the requests served but never recorded (in flight at the stop)."""
    mine = rows.loc[rows["class"] == name]
    figs = per_step_counts(mine, steps, server_t)
    record_counts(key, figs, server=server, version=version, protocol=protocol)
    print(f"{name}: client/server per step {figs}; whole run {len(mine)}/{len(server_t)}")
    assert len(server_t) >= len(mine), (name, len(server_t), len(mine))
    return len(server_t) - len(mine)


def row_ends(rows):
    """When each request ended (its answer's last byte), on the master's clock."""
    return rows["t_start"].to_numpy() + rows["latency_ms"].to_numpy() / 1000.0


def per_step_counts(rows, steps, server_t, by: str = "end") -> list[tuple[int, int, int]]:
    """[(users, client rows, server count)] per step, both counted by when the request ended
    (``by="start"``: when it began, for a server that stamps its line as a request arrives), over the
    whole step [t_ramp, t_end); asserts each within COUNT_REL (or COUNT_EDGE)."""
    import numpy as np

    ok = rows[rows["ok"]]
    ends, srv = (row_ends(ok) if by == "end" else ok["t_start"].to_numpy()), np.asarray(server_t)
    out = []
    for _, st in steps.iterrows():
        client = int(((ends >= st.t_ramp) & (ends < st.t_end)).sum())
        server = int(((srv >= st.t_ramp) & (srv < st.t_end)).sum())
        out.append((int(st.users), client, server))
        assert abs(client - server) <= max(COUNT_REL * server, COUNT_EDGE), (st.users, client, server)
    return out


def target_of(step: dict) -> dict:
    """The server's own metrics (analysis/measure/target.py keys) of one summary step, from its scrape."""
    for host in (step.get("server") or {}).values():
        if isinstance(host, dict) and host.get("target"):
            return host["target"]
    return {}


def record_tree(key: str, server: str, version: str, protocol: str, figures: dict) -> None:
    """The printed table's row KEY for a process-tree run (tests/treetruth.py check_tree_run's figures)."""
    FIGURES.setdefault(key, {}).update({
        "server": server, "version": version, "protocol": protocol, "knee (users)": str(figures["knee"]),
        "findings": ", ".join(figures["findings"]) or "none",
        "tree CPU s agent/kernel": f"{figures['tree_cpu_s']:.1f}/{figures['kernel_cpu_s']:.1f}"})
