"""The causal chain of the findings: one table, the cause first, consequences capped at their cause.

The table's truth is docs/findings.md ("Which finding explains which"): the code's ``CAUSES`` must
say the same.  The behaviour is checked on the shapes the real runs give (the half-CPU container's
five findings, the oversubscribed ONNX engine's), built here as findings lists.
"""

from __future__ import annotations

import re
from pathlib import Path

from kneeswarm.analysis.findings.causes import CAUSES, link, roots, verdict
from kneeswarm.analysis.findings.finding import FINDING_IDS, SEVERITY

DOC = Path(__file__).resolve().parent.parent / "docs" / "findings.md"


def f(fid: str, host: str | None = "srv", text: str = "", advice: str = "Do this first. Then that.") -> dict:
    evidence = {"host": host} if host is not None else {}
    return {"id": fid, "severity": SEVERITY[fid], "steps": [4], "evidence": evidence,
            "text": text or f"{fid} seen", "advice": advice}


def doc_table() -> dict[str, tuple[str, ...]]:
    section = DOC.read_text().split("## Which finding explains which", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            out[cells[0].strip("`")] = tuple(re.findall(r"`([a-z_]+)`", cells[1]))
    return out


def test_the_code_and_the_docs_hold_the_same_table():
    assert doc_table() == CAUSES


def test_every_id_in_the_table_is_a_finding_and_the_table_has_no_cycle():
    assert {c for c in CAUSES} | {e for effects in CAUSES.values() for e in effects} <= set(FINDING_IDS)

    def reaches(start: str, goal: str, seen: frozenset[str] = frozenset()) -> bool:
        return any(e == goal or (e not in seen and reaches(e, goal, seen | {e})) for e in CAUSES.get(start, ()))

    assert not [c for c in CAUSES if reaches(c, c)]


def test_the_half_cpu_container_leads_with_its_quota():
    # the five findings of the demo target inside a half-CPU cgroup, in the order the rules gave them
    found = [f("retrograde", None), f("cpu_saturated"), f("run_queue_over_cores"), f("migrations_high"),
             f("cpu_throttled")]
    out = link(found)
    assert [x["id"] for x in roots(out)] == ["cpu_throttled"]
    assert out[0]["id"] == "cpu_throttled" and len(out) == 5
    retro = next(x for x in out if x["id"] == "retrograde")
    assert retro["severity"] == "warning" and retro["rule_severity"] == "critical"  # never above its cause
    assert next(x for x in out if x["id"] == "run_queue_over_cores")["explained_by"] == "cpu_saturated"  # nearest
    assert next(x for x in out if x["id"] == "cpu_saturated")["explained_by"] == "cpu_throttled"
    told = verdict(out)
    assert told["causes"] == ["cpu_throttled"] and told["text"].startswith("Cause: `cpu_throttled`")
    assert "First change: Do this first." in told["text"] and "Then that" not in told["text"]


def test_the_oversubscribed_engine_leads_with_the_oversubscription():
    found = [f("run_queue_over_cores"), f("threads_over_cores"), f("switch_storm"), f("kernel_time_high"),
             f("engine_oversubscribed")]
    assert [x["id"] for x in roots(link(found))] == ["engine_oversubscribed"]


def test_two_independent_causes_both_lead_and_hosts_do_not_mix():
    found = [f("cpu_throttled", "a"), f("cpu_saturated", "b"), f("kv_cache_full", "a"), f("preemption", "a")]
    out = link(found)
    assert {x["id"] for x in roots(out)} == {"cpu_throttled", "cpu_saturated", "kv_cache_full"}
    assert "explained_by" not in next(x for x in out if x["id"] == "cpu_saturated")  # on another host
    assert next(x for x in out if x["id"] == "preemption")["explained_by"] == "kv_cache_full"
    assert verdict(out)["text"].startswith("3 independent causes")


def test_a_finding_alone_is_its_own_cause_and_info_is_no_verdict():
    assert verdict(link([f("queue_pushback", None)])) == {"causes": [], "text": ""}
    out = link([f("waiting_not_computing")])
    assert verdict(out)["causes"] == ["waiting_not_computing"] and "explained_by" not in out[0]


def test_a_root_whose_cause_is_marginal_names_it_as_suspected():
    """Preemptions plain (confirmed) while the KV cache sits at its threshold within the run's noise
    (marginal, at the point): the verdict's cause is what the run shows for sure, and it names the
    chain's cause above it as the likely one; a marginal finding off the point, on another host,
    or not above it in the table is not named."""
    found = link([f("preemption", text="The engine preempted.")])
    kv = {**f("kv_cache_full", text="The KV cache was 79 % full."), "support": 0.8, "at_point": True}
    v = verdict(found, [kv])
    assert v["causes"] == ["preemption"] and v["suspected"] == ["kv_cache_full"]
    assert "`kv_cache_full`, is marginal" in v["text"] and "support 0.80" in v["text"] and "79 % full" in v["text"]
    for other in ({**kv, "at_point": False}, {**kv, "evidence": {"host": "elsewhere"}},
                  {**f("switch_storm"), "support": 0.8, "at_point": True}):
        assert "suspected" not in verdict(found, [other]), other
