"""Findings name a step by its users in plain English: "at 1 user", "at 8 users"."""

from __future__ import annotations

import re
from pathlib import Path

from kneeswarm.analysis.findings.context import users_text


def test_one_user_is_singular():
    assert [users_text(n) for n in (1, 1.0, 2, 16)] == ["1 user", "1.0 user", "2 users", "16 users"]


def test_no_finding_text_writes_users_after_a_bare_step_count():
    """Every "<step's users> users" in the findings' texts goes through users_text."""
    src = "".join(p.read_text() for p in Path(__file__).parent.parent.glob("analysis/findings/*.py"))
    assert re.findall(r"\{\w+\['users'\]\} users", src) == []
