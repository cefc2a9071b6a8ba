"""report/junit.xml: the SLA checks and the comparison's per-step checks as JUnit test cases, so that
CI systems (GitLab, Jenkins, GitHub test reporters) list each one as passed or failed.

    <testsuites name="kneeswarm" tests failures>
      <testsuite name="sla" tests failures skipped>
        <testcase classname="kneeswarm.sla" name="p99_ms <= 200" time="0"><failure message=.../></testcase>
      <testsuite name="regression" ...>
        <testcase classname="kneeswarm.compare" name="8 users qps" time="0">...

A run planned without an SLA is one ``<skipped>`` case.  A limit of the SLA that no step carried (``skipped`` of ``sla_check``) is a ``<skipped>`` case; a
step not valid in both runs is a skipped comparison.  ``time`` is 0: a check takes no time.
"""

from __future__ import annotations

from pathlib import Path

from kneeswarm.analysis.summary.gates import no_sla
from kneeswarm.contracts.rundir import JUNIT_FILE, write_text

import logging
import xml.etree.ElementTree as ET
from typing import Any

from kneeswarm.analysis.schema.summary import SlaResult, Summary

from kneeswarm.analysis.schema.comparison import Change, Comparison

logger = logging.getLogger(__name__)

SLA_CLASS = "kneeswarm.sla"
COMPARE_CLASS = "kneeswarm.compare"


def _fmt(v: Any) -> str:
    return "none" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _case(suite: ET.Element, classname: str, name: str, failure: str | None = None, skipped: str | None = None) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0")
    if failure is not None:
        ET.SubElement(case, "failure", message=failure, type="threshold").text = failure
    elif skipped is not None:
        ET.SubElement(case, "skipped", message=skipped)


def _finish(suite: ET.Element) -> ET.Element:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", "0")
    suite.set("skipped", str(sum(c.find("skipped") is not None for c in cases)))
    return suite


def sla_suite(sla_result: SlaResult) -> ET.Element:
    """One test case per SLA check (and per limit skipped for want of data); a run planned without
    an SLA (``set`` false, kneeswarm.analysis.summary.gates) is one skipped case."""
    suite = ET.Element("testsuite", name="sla")
    if sla_result.get("set") is False:
        _case(suite, SLA_CLASS, "sla", skipped=sla_result.get("text") or "no SLA set")
        return _finish(suite)
    for c in sla_result.get("checks", []):
        op = ">=" if c.get("bound") == "lower" else "<="
        name = f"{c['name']} {op} {_fmt(c['limit'])}"
        where = f" at {c['users']} users" if c.get("users") is not None else " (no valid step)"
        msg = None if c.get("passed") else f"{c['name']} = {_fmt(c.get('value'))}{where}; limit {op} {_fmt(c['limit'])}"
        _case(suite, SLA_CLASS, name, failure=msg)
    for key in sla_result.get("skipped", []):
        limit = (sla_result.get("limits") or {}).get(key)
        _case(suite, SLA_CLASS, f"{key} <= {_fmt(limit)}", skipped=f"no step carries {key}")
    if not sla_result.get("checks") and not sla_result.get("passed"):
        _case(suite, SLA_CLASS, "sla", failure=sla_result.get("text") or "SLA not met")
    return _finish(suite)


def _worse(metric: str, c: Change) -> str | None:
    """The failure message of a significant regression, else None."""
    if c.get("direction") != "worse":  # significant: rel and ci are known (compare.metric_change)
        return None
    lo, hi = c["ci"] or (None, None)
    return f"{metric} {_fmt(c['base'])} -> {_fmt(c['new'])} ({c['rel']:+.1%}); CI of the change [{_fmt(lo)}, {_fmt(hi)}]"


def compare_suite(result: Comparison) -> ET.Element:
    """One test case per step and metric: it fails when the change is a significant regression."""
    suite = ET.Element("testsuite", name="regression")
    for s in result.get("steps", []):
        for metric in ("qps", "p99_ms"):
            name = f"{s['users']} users {metric}"
            c = s[metric]
            if not c:
                _case(suite, COMPARE_CLASS, name, skipped=s.get("note") or "not compared")
                continue
            _case(suite, COMPARE_CLASS, name, failure=_worse(metric, c))
    for cl in result.get("classes") or []:  # a traffic mix: each class's steps, where its rows were resampled
        for cs in cl["steps"]:
            for metric, c in (("qps", cs.get("qps_change")), ("p99_ms", cs.get("p99_change"))):
                if c:
                    _case(suite, COMPARE_CLASS, f"class {cl['name']}: {cs['users']:g} users {metric}", failure=_worse(metric, c))
    if result.get("verdict") == "not comparable":
        _case(suite, COMPARE_CLASS, "comparable", failure="no step is valid in both runs")
    return _finish(suite)


def junit_xml(sla_result: SlaResult | None, compare_result: Comparison | None = None) -> str:
    """The JUnit XML document of an SLA check and/or a comparison (either may be None)."""
    root = ET.Element("testsuites", name="kneeswarm")
    if sla_result is not None:
        root.append(sla_suite(sla_result))
    if compare_result is not None:
        root.append(compare_suite(compare_result))
    suites = root.findall("testsuite")
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(summary: Summary, report_dir: str | Path) -> None:
    """``report_dir``/junit.xml: one test case per SLA check (one skipped case without an SLA)."""
    write_text(Path(report_dir) / JUNIT_FILE, junit_xml(summary.get("sla") or no_sla()))
