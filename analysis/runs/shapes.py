"""A length x concurrency sweep (``[load] shapes``: knees move with lengths): one run per [input, output] shape, a knee
per shape, and the Pareto chart capacity planners ask for.

``kneeswarm run`` runs the step plan once per shape (a run directory each, prompts of ``input``
tokens, ``max_tokens`` = ``output`` with ``ignore_eos``), then :func:`write_sweep` reads their
summaries into ``<out>/<stamp>-<name>-shapes/``: ``sweep.json`` (:class:`Sweep`) and ``index.html``.

The chart: per shape, one curve over its valid steps, output tokens/s per user (x: what one user
sees, ``tokens_s / users``) against output tokens/s in total (y: what the server delivers); moving
right along a curve means fewer users, each served faster.  The shape's knee (its QPS knee, else its
tokens/s knee) is marked: beyond it, more users buy no more total throughput, only slower answers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, TypedDict

import plotly.graph_objects as go

from kneeswarm.contracts.rundir import REPORT_HTML, SWEEP_JSON, RunDir

logger = logging.getLogger(__name__)



class SweepPoint(TypedDict):
    users: float
    tokens_s: float  # output tokens/s in total
    tokens_s_per_user: float
    valid: bool


class SweepShape(TypedDict, total=False):
    input_tokens: int
    output_tokens: int
    run_id: str
    run_dir: str
    complete: bool
    knee_users: float | None  # the run's knee (QPS), else its tokens/s knee
    peak_tokens_s: float | None
    points: list[SweepPoint]


class Sweep(TypedDict):
    name: str
    shapes: list[SweepShape]


def shape_facts(shape: list[int], run_dir: Path) -> SweepShape:
    """One shape's knee and curve from its run's report/summary.json (empty curve when unreadable)."""
    try:
        summary = json.loads(RunDir(run_dir).summary_path.read_text())
    except (OSError, ValueError):
        summary = {}
    points: list[SweepPoint] = []
    for s in summary.get("steps") or []:
        users, tokens = s.get("users"), s.get("tokens_s")
        if isinstance(users, (int, float)) and users > 0 and isinstance(tokens, (int, float)):
            points.append({"users": float(users), "tokens_s": float(tokens),
                           "tokens_s_per_user": float(tokens) / float(users), "valid": s.get("valid") is True})
    knee = (summary.get("knee") or {}).get("users")
    if knee is None:
        knee = (summary.get("tokens_knee") or {}).get("users")
    valid = [p["tokens_s"] for p in points if p["valid"]]
    return {"input_tokens": int(shape[0]), "output_tokens": int(shape[1]), "run_id": run_dir.name,
            "run_dir": str(run_dir), "complete": summary.get("complete") is True, "knee_users": knee,
            "peak_tokens_s": max(valid) if valid else None, "points": sorted(points, key=lambda p: p["users"])}


def pareto_figure(sweep: Sweep) -> go.Figure:
    fig = go.Figure()
    for sh in sweep["shapes"]:
        pts = [p for p in sh["points"] if p["valid"]]
        label = f"{sh['input_tokens']} in / {sh['output_tokens']} out"
        fig.add_trace(go.Scatter(x=[p["tokens_s_per_user"] for p in pts], y=[p["tokens_s"] for p in pts],
                                 mode="lines+markers", name=label, text=[f"{p['users']:g} users" for p in pts],
                                 hovertemplate="%{text}: %{x:.1f} tok/s per user, %{y:.0f} tok/s<extra>" + label
                                 + "</extra>"))
        knee = [p for p in pts if sh.get("knee_users") is not None and p["users"] == sh["knee_users"]]
        if knee:
            fig.add_trace(go.Scatter(x=[knee[0]["tokens_s_per_user"]], y=[knee[0]["tokens_s"]], mode="markers",
                                     marker={"symbol": "star", "size": 16}, name=f"knee {label}",
                                     showlegend=False, hovertemplate=f"knee: {knee[0]['users']:g} users<extra></extra>"))
    fig.update_layout(title="Output tokens/s per user against in total, one curve per shape (knee: star)",
                      xaxis_title="output tokens/s per user", yaxis_title="output tokens/s in total",
                      template="plotly_white")
    return fig


def _cell(v: Any, fmt: str) -> str:
    return "–" if v is None else fmt.format(v)


def sweep_html(sweep: Sweep) -> str:
    rows = "".join(f"<tr><td>{sh['input_tokens']}</td><td>{sh['output_tokens']}</td>"
                   f"<td>{_cell(sh.get('knee_users'), '{:g}')}</td><td>{_cell(sh.get('peak_tokens_s'), '{:.0f}')}</td>"
                   f"<td><a href=\"../{sh['run_id']}/report/{REPORT_HTML}\">{sh['run_id']}</a></td></tr>"
                   for sh in sweep["shapes"])
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>kneeswarm shapes "
            f"{sweep['name']}</title></head><body><h1>Length x concurrency sweep: {sweep['name']}</h1>"
            "<table border=\"1\" cellpadding=\"4\"><tr><th>input tokens</th><th>output tokens</th>"
            f"<th>knee (users)</th><th>peak output tok/s</th><th>run</th></tr>{rows}</table>"
            + pareto_figure(sweep).to_html(full_html=False, include_plotlyjs=True, div_id="pareto")
            + "</body></html>")


def write_sweep(out_dir: Path, name: str, runs: list[tuple[list[int], Path]]) -> Path:
    """``out_dir``/sweep.json and index.html for the runs of one sweep; returns out_dir."""
    sweep: Sweep = {"name": name, "shapes": [shape_facts(shape, path) for shape, path in runs]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SWEEP_JSON).write_text(json.dumps(sweep, indent=2, allow_nan=False) + "\n")
    (out_dir / REPORT_HTML).write_text(sweep_html(sweep))
    return out_dir
