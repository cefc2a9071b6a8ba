"""The floor plan holds: a package imports only the floors below it, and functions stay readable.

Floors (README "Layout"): 1 the contracts (kneeswarm.plan, kneeswarm.rundir, kneeswarm.outcome); 2 collectors; 3
agents, analysis, locustfiles (side by side: none imports another); 4 the entry points
(kneeswarm.cli, kneeswarm.conductor, the locustfile locustfiles/swarm.py with its wiring
locustfiles/plugin.py, and what they share: kneeswarm.lifecycle). The demo target (kneeswarm.target)
imports none of the project: it is used exactly as a real server would be.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("kneeswarm", "locustfiles", "agents", "collectors", "analysis")
CONTRACTS = {"kneeswarm.plan", "kneeswarm.rundir", "kneeswarm.outcome"}
#: The locustfile and its wiring into Locust are an entry point (floor 4), like the CLI: they
#: share the test's lifecycle (kneeswarm.lifecycle) with the conductor.
LOCUSTFILE = {"locustfiles.swarm", "locustfiles.plugin"}
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int | None:
    """The floor of a project module (None: the demo target, which stands apart)."""
    top = module.split(".")[0]
    if module.startswith("kneeswarm.target"):
        return None
    if module in CONTRACTS or any(module.startswith(c + ".") for c in CONTRACTS):
        return 1
    if top == "collectors":
        return 2
    if module in LOCUSTFILE or any(module.startswith(m + ".") for m in LOCUSTFILE):
        return 4
    if top in ("agents", "analysis", "locustfiles"):
        return 3
    return 4 if top == "kneeswarm" else None


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of a project module in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text())
    here = module_name(path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here.split(".")[: len(here.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*pkg, base] if base else pkg)
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT:
                out.append((node.lineno, name))
    return out


def sources() -> list[Path]:
    return sorted(p for top in PROJECT for p in (ROOT / top).rglob("*.py"))


def test_the_sources_are_found():
    names = {module_name(p) for p in sources()}
    assert {"kneeswarm.plan", "collectors.base", "agents.remote", "analysis.knee", "locustfiles.plugin",
            "kneeswarm.cli", "kneeswarm.target.server"} <= names


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    here = module_name(path)
    mine = floor(here)
    wrong = []
    for line, name in project_imports(path):
        theirs = floor(name)
        if name == "kneeswarm" or name.split(".")[0] == here.split(".")[0] and mine != 1 and theirs == mine:
            continue  # the package itself, or a sibling module of the same package
        if here.startswith("kneeswarm.target"):
            if not name.startswith("kneeswarm.target"):
                wrong.append(f"line {line}: the demo target imports {name}")
        elif name.startswith("kneeswarm.target"):
            if mine != 4:
                wrong.append(f"line {line}: {name} is the demo target, used only as a target")
        elif theirs is not None and mine is not None and (theirs > mine or theirs == mine < 4):
            wrong.append(f"line {line}: floor {mine} imports {name} (floor {theirs})")
    assert not wrong, f"{path.relative_to(ROOT)}: " + "; ".join(wrong)


def test_the_floor_check_catches_an_upward_import(tmp_path, monkeypatch):
    # The check above must be able to fail: a collector importing analysis is refused.
    bad = ROOT / "collectors" / "_layout_probe.py"
    bad.write_text("from analysis.knee import find_knee\n")
    try:
        with pytest.raises(AssertionError, match="floor 2 imports analysis.knee"):
            test_imports_point_down(bad)
    finally:
        bad.unlink()


def long_functions(path: Path) -> list[str]:
    src = path.read_text().splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(src))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            explained = first >= 2 and src[first - 2].strip().startswith("#")
            if length > MAX_FUNCTION_LINES and not explained:
                out.append(f"{node.name}() {length} lines at line {node.lineno}")
    return out


def test_no_function_over_sixty_lines_without_a_reason():
    found = {str(p.relative_to(ROOT)): f for p in sources() if (f := long_functions(p))}
    assert not found, found
