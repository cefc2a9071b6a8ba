"""constraints.txt (the versions the suite passes with, installed by make and CI) and pyproject.toml
(the ranges users get) agree: every dependency of pyproject, extras included, is pinned, and each
pin lies inside pyproject's range."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def pins(text: str) -> dict[str, Version]:
    """{canonical name: version} of a constraints file's NAME==VERSION lines."""
    out: dict[str, Version] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = PIN.match(line)
        assert m, f"constraints.txt: {line!r} is not NAME==VERSION"
        name = canonicalize_name(m.group(1))
        assert name not in out, f"constraints.txt pins {name} twice"
        out[name] = Version(m.group(2))
    return out


def requirements(pyproject: str) -> list[Requirement]:
    """Every requirement of a pyproject.toml: dependencies and all optional extras."""
    project = tomllib.loads(pyproject)["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    return [Requirement(r) for r in reqs]


def disagreements(constraints: str, pyproject: str) -> list[str]:
    """One line per requirement that constraints.txt leaves unpinned or pins outside its range."""
    pinned, out = pins(constraints), []
    for r in requirements(pyproject):
        v = pinned.get(canonicalize_name(r.name))
        if v is None:
            out.append(f"{r}: not pinned")
        elif not r.specifier.contains(v, prereleases=True):
            out.append(f"{r}: pinned {v}")
    return sorted(set(out))


def test_every_dependency_is_pinned_inside_its_range():
    bad = disagreements((ROOT / "constraints.txt").read_text(), (ROOT / "pyproject.toml").read_text())
    assert not bad, "constraints.txt and pyproject.toml disagree (`make constraints` once the suite passed): " \
        + "; ".join(bad)


def test_the_makefile_installs_with_the_constraints():
    make = (ROOT / "Makefile").read_text()
    install = [line for line in make.splitlines() if "pip install" in line and "-e " in line]
    assert install and all("-c $(CONSTRAINTS)" in line for line in install), install
    assert re.search(r"^CONSTRAINTS\s*=\s*constraints\.txt$", make, re.M)


def test_the_check_names_a_missing_pin_and_one_outside_the_range():
    pyproject = '[project]\ndependencies = ["locust>=2.40", "Requests>=2.31"]\n' \
                '[project.optional-dependencies]\ntest = ["pytest>=8"]\n'
    assert disagreements("locust==2.47.0\nrequests==2.32.3\npytest==8.3.0\n", pyproject) == []
    assert disagreements("locust==2.39.9\nrequests==2.32.3\n", pyproject) == [
        "locust>=2.40: pinned 2.39.9", "pytest>=8: not pinned"]
