"""What the LLM workload was, from the request rows: shared prefixes and conversations (the knee moves with them).

``summary["llm_workload"]`` (declared in kneeswarm.analysis.summary.build.LlmWorkload), for an OpenAI run whose plan
has ``[request.prefix]`` or ``[request.conversation]``; over the successful rows inside each step's
steady window:

* ``prefix``: the plan's ``tokens``, ``count`` and ``share``; ``rows_share`` (rows that started with
  a shared prefix, as sent) and ``expected_hit_pct``: the prompt tokens that a prefix cache could
  have served, ``100 x (rows with a prefix x tokens) / sum(tokens_in)`` -- the share times the
  cacheable fraction of the prompt tokens sent, counted in tokens as the servers' counters are
  (vLLM's prefix_cache_hits / prefix_cache_queries), measured on the rows.  A server caches whole
  blocks and computes at least a prompt's last token, so its hit rate can read up to a block per
  request below this; a cache also misses each prefix's first use.  ``per_step``: the same per step.
* ``trace`` (``[request] trace``, a Mooncake trace): ``path``, ``block_tokens``, ``requests`` and
  ``expected_hit_pct``, the hit rate its hash ids imply over one pass in file order (a block is
  found when the same run of ids led up to it in an earlier request; whole blocks only) -- absent
  when the file cannot be read here.  A trace sent round and round, or by several processes each
  from its start, hits more than one pass implies.
* ``turns``: one entry per turn number of the conversations: ``requests``, ``tokens_in_mean``,
  ``ttft_p50_ms`` and ``ttft_mean_ms`` (rows that streamed a first token).  Context grows turn by
  turn; so does prefill, and so does TTFT where the server recomputes the history.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from kneeswarm.analysis.schema.summary import LlmWorkload, PlanTable, PrefixFacts, TraceFacts, TurnFacts
from kneeswarm.contracts.rundir import REQUEST_SCHEMA, RunDir

logger = logging.getLogger(__name__)

COLUMNS = ("t_start", "ok", "step", "tokens_in", "ttft_ms", "prefix", "turn")


def _rows(run: RunDir) -> pd.DataFrame:
    """The columns this module reads, from every readable part (older parts: the new ones null)."""
    tables = []
    for part in run.request_parts():
        try:
            tables.append(pq.read_table(part, schema=REQUEST_SCHEMA, columns=list(COLUMNS)).to_pandas())
        except Exception:  # noqa: BLE001 - kneeswarm.analysis.measure.inputs says which parts it could not read
            continue
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=list(COLUMNS))


def _steady(rows: pd.DataFrame, stats: pd.DataFrame) -> pd.DataFrame:
    """The successful rows inside their step's steady window [t_lo, t_hi)."""
    win = stats.set_index("index")[["t_lo", "t_hi"]]
    rows = rows[rows["ok"].fillna(False).astype(bool) & rows["step"].isin(win.index)]
    lo = win["t_lo"].reindex(rows["step"]).to_numpy(dtype=float)
    hi = win["t_hi"].reindex(rows["step"]).to_numpy(dtype=float)
    t = rows["t_start"].to_numpy(dtype=float)
    return rows[(t >= lo) & (t < hi)]


def _expected(rows: pd.DataFrame, tokens: int) -> float | None:
    tin = pd.to_numeric(rows["tokens_in"], errors="coerce")
    total = float(tin.sum())
    if total <= 0:
        return None
    return round(100.0 * tokens * float(rows["prefix"].notna().sum()) / total, 2)


def prefix_facts(rows: pd.DataFrame, table: PlanTable) -> PrefixFacts:  # table: [request.prefix]
    tokens = int(table.get("tokens", 1))
    per_step = {str(int(k)): v for k, g in rows.groupby("step") if (v := _expected(g, tokens)) is not None}
    return {"tokens": tokens, "count": int(table.get("count", 1)), "share": float(table.get("share", 1.0)),
            "rows_share": round(float(rows["prefix"].notna().mean()), 4) if len(rows) else None,
            "expected_hit_pct": _expected(rows, tokens), "per_step": per_step}


def turn_facts(rows: pd.DataFrame) -> list[TurnFacts]:
    out: list[TurnFacts] = []
    for turn, g in rows[rows["turn"].notna()].groupby("turn"):
        ttft = pd.to_numeric(g["ttft_ms"], errors="coerce").dropna()
        tin = pd.to_numeric(g["tokens_in"], errors="coerce").dropna()
        out.append({"turn": int(turn), "requests": int(len(g)),
                    "tokens_in_mean": round(float(tin.mean()), 2) if len(tin) else None,
                    "ttft_p50_ms": round(float(np.median(ttft)), 3) if len(ttft) else None,
                    "ttft_mean_ms": round(float(ttft.mean()), 3) if len(ttft) else None})
    return out


def trace_facts(path: str, block_tokens: int) -> TraceFacts | None:
    """The hit rate a Mooncake trace's hash ids imply over one pass (module docstring); None when unreadable."""
    seen: set[tuple[int, ...]] = set()
    hits = queries = requests = 0
    try:
        lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        for doc in lines:
            n, ids = int(doc["input_length"]), [int(h) for h in doc["hash_ids"]]
            full = [tuple(ids[:j + 1]) for j in range(len(ids)) if (j + 1) * block_tokens <= n]
            found = next((j for j, key in enumerate(full) if key not in seen), len(full))
            hits += min(found * block_tokens, (n - 1) // block_tokens * block_tokens)
            queries, requests = queries + n, requests + 1
            seen.update(full)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"path": path, "block_tokens": block_tokens, "requests": requests,
            "expected_hit_pct": round(100.0 * hits / queries, 2) if queries else None}


def llm_workload(run: RunDir, plan: PlanTable, stats: pd.DataFrame) -> LlmWorkload:
    """``summary["llm_workload"]`` (module docstring); {} when the plan has none of the tables."""
    request = got if isinstance(got := plan.get("request"), dict) else {}
    prefix, conversation, trace = request.get("prefix"), request.get("conversation"), request.get("trace")
    if plan.get("protocol") != "openai":
        return {}
    out: LlmWorkload = {}
    if isinstance(trace, str) and (facts := trace_facts(trace, int(request.get("trace_block_tokens") or 512))):
        out["trace"] = facts
    if not (isinstance(prefix, dict) or isinstance(conversation, dict)):
        return out
    rows = _steady(_rows(run), stats)
    if isinstance(prefix, dict):
        out["prefix"] = prefix_facts(rows, prefix)
    if isinstance(conversation, dict):
        out["turns"] = turn_facts(rows)
    return out
