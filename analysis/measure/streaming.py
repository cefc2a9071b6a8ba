"""LLM streaming per step: TTFT, ITL and TPOT percentiles, output tokens/s, goodput, tokens per chunk,
and whether the server's output count is true (tokens/s, TPOT and the knee all assume it is).

Where the numbers come from (one request row each, kneeswarm.contracts.rundir.REQUEST_SCHEMA): ``ttft_ms``,
``itl_ms`` (every gap between text chunks the client measured), ``tokens_out`` (the server's
``usage`` count where it sent one, else the client's count -- the plan's tokenizer over the streamed
text, else the chunks -- then ``tokens_counted`` is true), ``usage_out``, ``chunks_out`` and the
independent counts ``tokens_tokenizer`` (the plan's tokenizer over the streamed text) and
``tokens_pinned`` (the length the request pinned: ``ignore_eos``, or ``min_tokens`` = ``max_tokens``).
Rows of a run recorded before these columns existed read them as null.

A chunk is not a token: servers that detokenize incrementally, stream intervals and speculative
decoding put several tokens in one chunk, so chunks against usage says nothing about usage's truth.

Definitions, per step (its steady window; successful rows only unless said):

* ``ttft_p50_ms`` … ``ttft_p99_ms``: over the rows that streamed text (a finite ``ttft_ms``);
* ``no_text_requests``: streamed rows that succeeded with no text chunk at all (tokens, maybe, but
  nothing to time a first token by): left out of the TTFT, ITL and TPOT percentiles and counted here;
* ``itl_p50_ms`` … ``itl_p99_ms``: per chunk -- over every gap between text chunks (what a reader
  sees; exact; beyond ``ITL_SAMPLE_MAX`` gaps in one step a uniform random sample of that many,
  ``itl_sampled`` true, so memory stays bounded on huge runs);
* ``itl_token_p50_ms`` …: per token -- each gap divided by its request's tokens per chunk (its true
  count over its chunks; the true count is usage, else the plan's tokenizer); NaN where no request
  has a true count.  With one token per chunk the two are the same;
* ``tokens_per_chunk``: true output tokens over text chunks, summed over the rows that have both;
* ``tpot_p50_ms`` …: per request (latency − TTFT) / (tokens_out − 1), rows with ≥ 2 tokens;
* ``tokens_s``: output tokens of the successful rows per second of window;
* ``goodput_rps`` / ``goodput_share``: requests meeting the plan's ``[sla]`` per second of window /
  as a share of all the window's requests (failures never meet it).  A request meets it when it
  succeeded, its latency ≤ ``p99_ms``, its TTFT ≤ ``ttft_ms`` and its *largest* inter-chunk gap ≤
  ``itl_ms`` (each limit only when set).  The largest gap, not the request's own P99: a reader sees
  every stall of a stream, and the P99 of a stream's few dozen gaps is its largest or second
  largest anyway, so a P99 would only forgive one stall.  TTFT and ITL limits apply to rows that
  streamed; a whole (not streamed) answer is judged on its latency;
* ``tokens_counted_share``: streamed rows whose tokens were counted by the client (no ``usage``);
* the truth of ``usage``: ``tokens_compared`` rows have usage and an independent count; a row
  disagrees when usage ≠ its pinned length, or usage and the tokenizer's count differ by more than
  ``TOKENIZER_SLACK`` of the larger; ``tokens_mismatch_share`` is the share that disagrees, and
  above ``COUNT_MISMATCH_MAX`` the step gets a reason naming the medians (``usage_out_median``,
  ``pinned_out_median``, ``tokenizer_out_median``) -- tokens/s, TPOT and the tokens/s knee assume the
  output the server says it made.  ``chunks_out_median`` is information only, never a reason.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, TypeGuard, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from kneeswarm.analysis.schema.summary import STREAM_METRICS as METRICS
from kneeswarm.analysis.schema.summary import STREAM_QUANTILES as QUANTILES
from kneeswarm.analysis.schema.summary import STREAMING_STEP_KEYS as STEP_KEYS
from kneeswarm.analysis.schema.summary import Summary, SummaryStep

logger = logging.getLogger(__name__)

STREAM_COLUMNS = ("ttft_ms", "itl_ms", "tokens_counted", "usage_out", "chunks_out", "tokens_tokenizer", "tokens_pinned")
ITL_TYPE = pa.list_(pa.float32())
ITL_SAMPLE_MAX = 1_000_000  # gaps kept per step for the ITL percentiles (~12 MB while thinning)
ITL_SAMPLE_SEED = 6  # the sample is reproducible: the same run gives the same figures
COUNT_MISMATCH_MAX = 0.05  # a step whose usage and independent count disagree on > 5% of requests says so
# Re-encoding detokenized text need not give back the ids the model produced (a merge across two
# tokens, normalisation), so a tokenizer's count may miss usage by a token or two on a long answer;
# a server that miscounts (the prompt counted in, a chunk counted as a token) is off by far more.
TOKENIZER_SLACK = 0.10
GOODPUT_LIMITS = ("ttft_ms", "itl_ms", "p99_ms")  # the [sla] keys a single request can be judged by
#: summary.json ``itl_columns``: what each ITL column of a streaming run is
ITL_COLUMNS = {
    "itl": "per chunk: the gap between two text chunks as the client received them (what a reader sees)",
    "itl_token": "per token: each gap between text chunks divided by its request's tokens per chunk "
                 "(the server's usage over the chunks; the plan's tokenizer where the server sent no usage)",
}


def goodput_limits(sla: Any) -> dict[str, float]:
    """The ``[sla]`` limits a request is judged by (GOODPUT_LIMITS that are positive numbers)."""
    out = {}
    for key in GOODPUT_LIMITS:
        v = sla.get(key) if isinstance(sla, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            out[key] = float(v)
    return out


# -- the streaming columns of some rows -------------------------------------------------------
@dataclass
class StreamRows:
    """The streaming columns of a chunk of rows (floats: NaN where null)."""

    ttft: np.ndarray
    itl: pa.Array  # list<float32> per row
    itl_max: np.ndarray  # each row's largest gap (NaN: no gap)
    counted: np.ndarray  # 1.0 counted by the client, 0.0 from usage, NaN unknown
    usage: np.ndarray
    chunks: np.ndarray
    tok: np.ndarray  # the plan's tokenizer over the streamed text
    pinned: np.ndarray  # the output length the request pinned

    @classmethod
    def of_table(cls, table: pa.Table) -> StreamRows | None:
        """From a part's Arrow table; None when no row streamed (nothing to keep)."""
        n = table.num_rows
        col = lambda c: table.column(c).combine_chunks() if c in table.column_names else pa.nulls(n)  # noqa: E731
        ttft, chunks = col("ttft_ms"), col("chunks_out")
        if ttft.null_count == n and chunks.null_count == n:
            return None
        num = lambda a: pc.cast(a, pa.float64()).to_numpy(zero_copy_only=False)  # noqa: E731 (null -> NaN)
        itl = col("itl_ms")
        itl = itl if itl.type == ITL_TYPE else pc.cast(itl, ITL_TYPE)
        return cls(num(ttft), itl, row_max(itl), num(pc.cast(col("tokens_counted"), pa.float64())),
                   num(col("usage_out")), num(chunks), num(col("tokens_tokenizer")), num(col("tokens_pinned")))

    @classmethod
    def of_frame(cls, df: pd.DataFrame) -> StreamRows | None:
        """From rows in a DataFrame (any of STREAM_COLUMNS may be missing)."""
        n = len(df)
        if not any(c in df.columns and df[c].notna().any() for c in ("ttft_ms", "chunks_out")):
            return None
        num = lambda c: (pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float) if c in df.columns  # noqa: E731
                         else np.full(n, np.nan))
        gaps = [None if g is None or (isinstance(g, float) and math.isnan(g)) else g
                for g in (df["itl_ms"] if "itl_ms" in df.columns else [None] * n)]
        itl = pa.array(gaps, type=ITL_TYPE)
        counted = df["tokens_counted"].map(lambda v: np.nan if v is None or v is pd.NA or v != v else float(bool(v))) \
            if "tokens_counted" in df.columns else pd.Series(np.full(n, np.nan))
        return cls(num("ttft_ms"), itl, row_max(itl), counted.to_numpy(dtype=float), num("usage_out"),
                   num("chunks_out"), num("tokens_tokenizer"), num("tokens_pinned"))

    def take(self, mask: np.ndarray) -> StreamRows:
        return StreamRows(self.ttft[mask], pc.filter(self.itl, pa.array(mask)), self.itl_max[mask],
                          self.counted[mask], self.usage[mask], self.chunks[mask], self.tok[mask], self.pinned[mask])

    def true_tokens(self) -> np.ndarray:
        """Each row's true output count: the server's usage, else the plan's tokenizer (NaN: neither)."""
        return np.where(np.isfinite(self.usage), self.usage, self.tok)

    def disagrees(self) -> tuple[np.ndarray, np.ndarray]:
        """(compared, disagrees): rows with usage and an independent count, and those whose usage
        is not their pinned length or is off the tokenizer's count by more than TOKENIZER_SLACK."""
        has_pin, has_tok = np.isfinite(self.pinned), np.isfinite(self.tok)
        compared = np.isfinite(self.usage) & (has_pin | has_tok)
        with np.errstate(invalid="ignore"):
            off_pin = has_pin & (self.usage != self.pinned)
            off_tok = has_tok & (np.abs(self.usage - self.tok) > TOKENIZER_SLACK * np.fmax(self.usage, self.tok))
        return compared, compared & (off_pin | off_tok)


def row_max(itl: pa.Array) -> np.ndarray:
    """Each row's largest gap (NaN for a null or empty list)."""
    lens = pc.fill_null(pc.list_value_length(itl), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.full(len(lens), np.nan)
    has = lens > 0
    if has.any():
        flat = itl.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])[has]
        out[has] = np.maximum.reduceat(flat, starts)
    return out


# -- a step's gaps ------------------------------------------------------------------------------
class GapSample:
    """Every gap of a step, or a uniform random sample of ``cap`` of them once there are more.

    Sampling by random priority: each gap gets a uniform key and the ``cap`` smallest keys are
    kept, which is a uniform sample without replacement however the gaps arrive in chunks.  Keys
    are drawn only once the gaps first exceed the cap, so a step under it stays exact; after a
    thinning, a gap whose key is above the largest key kept can never be among the ``cap``
    smallest and is dropped on arrival.
    """

    def __init__(self, cap: int = ITL_SAMPLE_MAX, seed: int = ITL_SAMPLE_SEED):
        self.cap, self.seen = cap, 0
        self.rng = np.random.default_rng(seed)
        self._values: list[np.ndarray] = []
        self._keys: list[np.ndarray] | None = None  # set once thinning started
        self._size = 0
        self._tau = 1.0  # keys at or above this cannot be kept any more

    @property
    def sampled(self) -> bool:
        return self._keys is not None

    def add(self, gaps: np.ndarray) -> None:
        if not len(gaps):
            return
        self.seen += len(gaps)
        gaps = np.asarray(gaps, dtype=np.float32)
        if self._keys is not None:
            keys = self.rng.random(len(gaps))
            keep = keys < self._tau
            gaps = gaps[keep]
            self._keys.append(keys[keep])
        self._values.append(gaps)
        self._size += len(gaps)
        if self._size > 2 * self.cap:
            self._thin()

    def _thin(self) -> None:
        values = np.concatenate(self._values)
        keys = np.concatenate(self._keys) if self._keys is not None else self.rng.random(len(values))
        if len(values) > self.cap:
            keep = np.argpartition(keys, self.cap)[:self.cap]
            values, keys = values[keep], keys[keep]
            self._tau = float(keys.max())
        self._values, self._keys, self._size = [values], [keys], len(values)

    def values(self) -> np.ndarray:
        if self._size > self.cap:
            self._thin()
        return np.concatenate(self._values) if self._values else np.empty(0, dtype=np.float32)


# -- one step -----------------------------------------------------------------------------------
@dataclass
class StreamAcc:
    """A step's streaming rows reduced as they come (see the module docstring for definitions)."""

    limits: dict[str, float] = field(default_factory=dict)  # goodput_limits of the plan's [sla]
    n: int = 0  # every row of the window (goodput's denominator)
    good: int = 0
    no_text: int = 0  # streamed rows that succeeded without a text chunk (no TTFT)
    ttft: list[np.ndarray] = field(default_factory=list)
    tpot: list[np.ndarray] = field(default_factory=list)
    gaps: GapSample = field(default_factory=GapSample)
    token_gaps: GapSample = field(default_factory=GapSample)  # each gap / its row's tokens per chunk
    per_chunk: list[float] = field(default_factory=lambda: [0.0, 0.0])  # true tokens, chunks (rows with both)
    counted: int = 0
    known_source: int = 0  # rows whose tokens_counted is known
    checks: list[np.ndarray] = field(default_factory=list)  # rows compared: usage, pinned, tokenizer, disagrees
    chunks: list[np.ndarray] = field(default_factory=list)  # chunks of the rows that have usage (information)

    def add(self, ok: np.ndarray, lat: np.ndarray, tokens: np.ndarray, s: StreamRows | None) -> None:
        """The window's rows: success mask, latencies, tokens out, streaming columns (None: none)."""
        self.n += len(ok)
        if self.limits:
            self.good += int(self.meets(ok, lat, s).sum())
        if s is None:
            return
        rows = ok & (np.isfinite(s.ttft) | np.isfinite(s.chunks))  # streamed, with or without text
        if not rows.any():
            return
        streamed = rows & np.isfinite(s.ttft)
        self.no_text += int(rows.sum() - streamed.sum())
        self._counts(s, rows)
        if not streamed.any():
            return
        s = s if streamed.all() else s.take(streamed)
        ttft, lat, tokens = s.ttft, lat[streamed], tokens[streamed]
        self.ttft.append(ttft)
        with np.errstate(invalid="ignore", divide="ignore"):
            multi = tokens >= 2
            self.tpot.append((lat[multi] - ttft[multi]) / (tokens[multi] - 1))
        gaps = s.itl.flatten().to_numpy(zero_copy_only=False)
        self.gaps.add(gaps)
        self._per_token(s, gaps)

    def _per_token(self, s: StreamRows, gaps: np.ndarray) -> None:
        """Tokens per chunk and the per-token gaps (``gaps``: every gap of ``s``, flat) of the rows
        whose true count is known."""
        true = s.true_tokens()
        with np.errstate(invalid="ignore"):
            known = np.isfinite(true) & (true > 0) & (s.chunks > 0)
        if not known.any():
            return
        self.per_chunk[0] += float(true[known].sum())
        self.per_chunk[1] += float(s.chunks[known].sum())
        lens = pc.fill_null(pc.list_value_length(s.itl), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        scale = np.repeat(np.where(known, s.chunks / np.where(known, true, 1.0), np.nan), lens)
        per_token = gaps.astype(np.float64) * scale
        self.token_gaps.add(per_token if known.all() else per_token[np.isfinite(scale)])

    def _counts(self, s: StreamRows, rows: np.ndarray) -> None:
        """Where tokens out came from, and usage against the independent counts, over ``rows``."""
        counted = s.counted[rows]
        self.known_source += int(np.isfinite(counted).sum())
        self.counted += int((counted == 1.0).sum())
        compared, off = s.disagrees()
        compared &= rows
        if compared.any():
            self.checks.append(np.stack([s.usage[compared], s.pinned[compared], s.tok[compared],
                                         off[compared].astype(float)]))
        self.chunks.append(s.chunks[rows & np.isfinite(s.usage) & np.isfinite(s.chunks)])

    def meets(self, ok: np.ndarray, lat: np.ndarray, s: StreamRows | None) -> np.ndarray:
        """Which rows meet every goodput limit (TTFT/ITL limits only where the row streamed)."""
        good = ok.copy()
        with np.errstate(invalid="ignore"):
            if "p99_ms" in self.limits:
                good &= lat <= self.limits["p99_ms"]
            if s is not None and "ttft_ms" in self.limits:
                good &= ~(s.ttft > self.limits["ttft_ms"])  # NaN (did not stream): not judged
            if s is not None and "itl_ms" in self.limits:
                good &= ~(s.itl_max > self.limits["itl_ms"])  # NaN (no gap): not judged
        return good

    def finish(self, window_s: float) -> dict[str, float]:
        """The step's streaming keys (NaN where not measured; counts and flags as numbers); frees what was kept."""
        out: dict[str, float] = {k: np.nan for k in STEP_KEYS}
        if self.limits and self.n and window_s > 0:
            out.update(goodput_rps=self.good / window_s, goodput_share=self.good / self.n)
        ttft = np.concatenate(self.ttft) if self.ttft else np.empty(0)
        out["streaming_requests"] = len(ttft)
        if len(ttft) or self.no_text:
            out["no_text_requests"] = self.no_text
            tpot = np.concatenate(self.tpot) if self.tpot else np.empty(0)
            for name, values in (("ttft", ttft), ("itl", self.gaps.values()), ("itl_token", self.token_gaps.values()),
                                 ("tpot", tpot[np.isfinite(tpot)])):
                if len(values):
                    pct = np.percentile(values.astype(np.float64), list(QUANTILES.values()))
                    out.update({f"{name}_{q}_ms": float(v) for q, v in zip(QUANTILES, pct)})
            if len(ttft):
                out.update(itl_gaps=self.gaps.seen, itl_sampled=self.gaps.sampled or self.token_gaps.sampled)
            if self.per_chunk[1]:
                out["tokens_per_chunk"] = self.per_chunk[0] / self.per_chunk[1]
            out.update(self._agreement())
        self.ttft, self.tpot, self.checks, self.chunks = [], [], [], []
        self.gaps, self.token_gaps = GapSample(), GapSample()
        return out

    def _agreement(self) -> dict[str, float]:
        usage, pinned, tok, off = np.concatenate(self.checks, axis=1) if self.checks else np.empty((4, 0))
        chunks = np.concatenate(self.chunks) if self.chunks else np.empty(0)
        out: dict[str, float] = {"tokens_compared": len(usage)}
        if self.known_source:
            out["tokens_counted_share"] = self.counted / self.known_source
        if len(chunks):
            out["chunks_out_median"] = float(np.median(chunks))
        if len(usage):
            out.update(tokens_mismatch_share=float(np.mean(off)), usage_out_median=float(np.median(usage)))
            for key, values in (("pinned_out_median", pinned), ("tokenizer_out_median", tok)):
                if np.isfinite(values).any():
                    out[key] = float(np.median(values[np.isfinite(values)]))
        return out


# -- validity, summary and report ---------------------------------------------------------------
def count_reason(step: dict[str, Any]) -> str | None:  # step: a row of the stats frame
    """A reason when the server's usage disagrees with an independent count (the requests' pinned
    length, the plan's tokenizer) on too many requests.  Chunks against usage is never one."""
    share = step.get("tokens_mismatch_share")
    if share is None or not isinstance(share, (int, float)) or not share > COUNT_MISMATCH_MAX:
        return None
    said = []
    if _finite(step.get("pinned_out_median")):
        said.append(f"the requests pinned a median of {step['pinned_out_median']:g} (ignore_eos / min_tokens)")
    if _finite(step.get("tokenizer_out_median")):
        said.append(f"the plan's tokenizer counted a median of {step['tokenizer_out_median']:g} in the streamed text")
    return (f"token counts disagree on {share:.0%} of {int(step.get('tokens_compared') or 0):,} streamed requests "
            f"(> {COUNT_MISMATCH_MAX:.0%}): the server's usage says a median of {step['usage_out_median']:g} "
            f"output tokens, {' and '.join(said)}; tokens/s and TPOT are not trustworthy")


def count_reasons(stats: pd.DataFrame) -> list[list[str]]:
    """Per step: the token-count reason, if any (for kneeswarm.analysis.measure.trust.add_reasons)."""
    return [[r] if (r := count_reason(row)) else [] for row in stats.to_dict("records")]


def _finite(v: object) -> TypeGuard[float]:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and math.isfinite(v)


def has_streaming(stats: pd.DataFrame) -> bool:
    """Whether any step has streamed rows (with text or without)."""
    return any(key in stats and bool((pd.to_numeric(stats[key]).fillna(0) > 0).any())
               for key in ("streaming_requests", "no_text_requests"))


def step_keys(row: dict[str, Any], streaming: bool) -> dict[str, Any]:  # row: a row of the stats frame
    """The summary keys of a step's stats row: output tokens/s when tokens were recorded, goodput
    when the plan has a limit a request can be judged by, the streaming keys in a streaming run."""
    out = {}
    if _finite(row.get("tokens_s")):
        out["tokens_s"] = row["tokens_s"]
    for key in ("goodput_rps", "goodput_share"):
        if _finite(row.get(key)):
            out[key] = row[key]
    if streaming:
        out.update({k: row.get(k) for k in STEP_KEYS if k not in out and k not in ("goodput_rps", "goodput_share")})
        out["streaming_requests"] = int(row.get("streaming_requests") or 0)
        out["no_text_requests"] = int(row.get("no_text_requests") or 0)
        out["itl_sampled"] = bool(row.get("itl_sampled")) if _finite(row.get("itl_gaps")) else None
    return out


def _f(v: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(v) if _finite(v) else "–"


HEADERS = {"ttft": "TTFT", "itl": "ITL/chunk", "itl_token": "ITL/token", "tpot": "TPOT"}


def streaming_table(summary: Summary) -> tuple[list[str], list[list[str]]] | None:
    """Header and rows of the per-step streaming table (ms; None when no step streamed).  ITL/chunk
    is the gap between text chunks, ITL/token the same per token (shown where some step knows its
    tokens per chunk); "no text" only where some request streamed none."""
    steps = summary.get("steps") or []
    if not any((s.get("streaming_requests") or 0) > 0 or (s.get("no_text_requests") or 0) > 0 for s in steps):
        return None
    no_text = any((s.get("no_text_requests") or 0) > 0 for s in steps)
    metrics = [m for m in METRICS if m != "itl_token" or any(_finite(s.get("itl_token_p50_ms")) for s in steps)]
    header = ["users", "streamed", *(["no text"] if no_text else []),
              *(f"{HEADERS[m]} {q.upper()}" for m in metrics for q in QUANTILES),
              "tokens/chunk", "tokens/s", "goodput/s", "goodput %", "valid"]
    rows = []
    for s in steps:
        cells = [str(s.get("users")), f"{s.get('streaming_requests') or 0:,}"]
        cells += [f"{s.get('no_text_requests') or 0:,}"] if no_text else []
        cells += [_f(cast(Mapping[str, object], s).get(f"{m}_{q}_ms")) for m in metrics for q in QUANTILES]
        share = s.get("goodput_share")
        cells += [_f(s.get("tokens_per_chunk"), "{:.2f}"), _f(s.get("tokens_s"), "{:,.1f}"), _f(s.get("goodput_rps")),
                  _f(None if share is None else 100 * share, "{:.1f}"), "yes" if s.get("valid") else "no"]
        rows.append(cells)
    return header, rows


def streaming_lines(summary: Summary) -> list[str]:
    """What the streaming table rests on: where the token counts came from and the goodput SLA
    (Markdown lines; none for a run without streamed rows)."""
    steps = [s for s in summary.get("steps") or []
             if (s.get("streaming_requests") or 0) > 0 or (s.get("no_text_requests") or 0) > 0]
    if not steps:
        return []
    lines = [token_source_line(steps), itl_line(steps)]
    no_text = [s for s in steps if (s.get("no_text_requests") or 0) > 0]
    if no_text:
        said = ", ".join(f"{s.get('no_text_requests'):,} at {s.get('users')} users" for s in no_text)
        lines.append(f"**No text:** streamed requests that succeeded without a single text chunk have no TTFT and "
                     f"are left out of the TTFT, ITL and TPOT percentiles: {said}")
    limits = (got.get("limits") if (got := summary.get("goodput")) else None) or {}
    if limits:
        said = ", ".join(f"{k.replace('p99_ms', 'latency_ms')} ≤ {v:g}" for k, v in limits.items())
        lines.append(f"**Goodput:** requests that succeeded with {said} (per request; ITL: its largest gap)")
    if any(s.get("itl_sampled") for s in steps):
        lines.append("ITL percentiles of the largest steps come from a uniform sample of their gaps")
    return lines


def tokens_knee_line(summary: Summary) -> str | None:
    """The knee on output tokens/s (LLM runs), one Markdown line; None when the run has none."""
    knee = summary.get("tokens_knee")
    if not isinstance(knee, dict):
        return None
    if (ku := knee.get("users")) is None:
        return "**Tokens/s knee:** none found: output tokens/s still rose over the tested range (or too few valid steps)"
    users = f"{ku:g} user" + ("" if ku == 1 else "s")
    return (f"**Tokens/s knee:** {users} at {_f(knee.get('tokens_s'), '{:,.1f}')} output tokens/s "
            f"(method: {knee.get('method')})")


def itl_line(steps: list[SummaryStep]) -> str:
    """What the ITL columns are, and the tokens per chunk they rest on."""
    per = [v for s in steps if _finite(v := s.get("tokens_per_chunk"))]
    line = f"**ITL:** ITL/chunk: {ITL_COLUMNS['itl'].split(': ', 1)[1]}"
    if not per:
        return line + "; tokens per chunk unknown (no usage, no tokenizer), so no per-token ITL"
    spread = f"{min(per):.2f}" if max(per) - min(per) < 0.005 else f"{min(per):.2f}–{max(per):.2f}"
    return line + f"; ITL/token: {ITL_COLUMNS['itl_token'].split(': ', 1)[1]}; tokens per chunk {spread}"


def token_source_line(steps: list[SummaryStep]) -> str:
    """Whether output tokens came from the server's usage or the client's count, and whether usage
    agreed with the independent counts (pinned lengths, the plan's tokenizer) where there were any."""
    shares = [v for s in steps if _finite(v := s.get("tokens_counted_share"))]
    if not shares:
        source = "source unknown (a run recorded before kneeswarm stored it)"
    elif max(shares) == 0:
        source = "from the server's `usage` on every streamed request"
    elif min(shares) == 1:
        source = "counted by the client (the server sent no `usage`): the plan's tokenizer, else one per chunk"
    else:
        source = f"from the server's `usage`, counted by the client on {max(shares):.0%} of a step's requests at most"
    bad = [s for s in steps if _finite(m := s.get("tokens_mismatch_share")) and m > COUNT_MISMATCH_MAX]
    compared = sum(int(s.get("tokens_compared") or 0) for s in steps)
    against = " and ".join(name for key, name in (("pinned_out_median", "pinned lengths"),
                                                 ("tokenizer_out_median", "the plan's tokenizer"))
                           if any(_finite(s.get(key)) for s in steps))
    if bad:
        agree = f"; usage **disagrees** with {against} in {len(bad)} step(s) (see their reasons)"
    elif compared:
        agree = f"; usage agrees with {against} ({compared:,} requests compared)"
    else:
        agree = "; usage not checked (no pinned length, no tokenizer in the plan)" if max(shares, default=1) < 1 else ""
    return f"**Output tokens:** {source}{agree}"
