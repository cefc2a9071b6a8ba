"""The floor plan holds as written: a module imports only its own room and the floors below it,
and functions stay readable.

The plan is the table under "## Floors" in docs/design.md, read here as it stands (no per-module
exception in this file): each row is a room (one or more paths: a folder ends in "/", a module is
its file) on a floor; a module stands in the room of the longest path that holds it; every source
file stands in one. A module imports its own room and the rooms of lower floors, never a room
beside it on its floor nor one above. The rooms "apart" (the demo target) import only themselves,
and only the top floor imports them (the command line's `kneeswarm target`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
PROJECT = ("kneeswarm", "locustfiles", "agents", "collectors", "analysis")
APART = "apart"
MAX_FUNCTION_LINES = 60


@dataclass(frozen=True)
class Room:
    floor: int | str  # a number, or APART
    paths: tuple[str, ...]  # "agents/" (a folder and all below it), "kneeswarm/cli.py" (one module)

    def holds(self, rel: str) -> int:
        """The length of this room's longest path holding ``rel`` (a file, relative to ROOT), 0: none."""
        return max((len(p) for p in self.paths if rel == p or (p.endswith("/") and rel.startswith(p))), default=0)


def floor_table(text: str) -> list[Room]:
    """The rooms of the table under "## Floors" in docs/design.md: | floor | `path`, ... | owns |."""
    section = text.split("\n## Floors", 1)[1].split("\n## ", 1)[0]
    rooms = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not (cells[0].isdigit() or cells[0] == APART):
            continue  # the header, its rule, the text around the table
        paths = tuple(re.findall(r"`([^`]+)`", cells[1]))
        assert paths, f"docs/design.md: the floor row {line!r} names no path"
        rooms.append(Room(int(cells[0]) if cells[0].isdigit() else APART, paths))
    assert rooms, "docs/design.md: no floor table under '## Floors'"
    return rooms


ROOMS = floor_table(DESIGN.read_text())
TOP = max(r.floor for r in ROOMS if r.floor != APART)


def room_of(rel: str) -> Room | None:
    best = max(ROOMS, key=lambda r: r.holds(rel))
    return best if best.holds(rel) else None


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_file(name: str) -> str | None:
    """The file (relative to ROOT) of the longest project module that ``name`` starts with."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return str(candidate.relative_to(ROOT))
    return None


def project_imports(path: Path, here: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a project module in ``path`` (module ``here``), relative
    ones resolved; ``from package import module`` counts as an import of the module, not of the package."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = here.split(".")[: len(here.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*pkg, base] if base else pkg)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out += [(node.lineno, name) for name in names if name.split(".")[0] in PROJECT]
    return out


def sources() -> list[Path]:
    return sorted(p for top in PROJECT for p in (ROOT / top).rglob("*.py"))


def test_the_sources_are_found():
    names = {module_name(p) for p in sources()}
    assert {"kneeswarm.plan", "collectors.base", "agents.remote", "analysis.knee", "locustfiles.plugin",
            "kneeswarm.cli", "kneeswarm.target.server"} <= names


def test_the_table_is_read_from_the_design_document():
    # Independent truth: the rows as docs/design.md spells them, found by a plain search.
    rows = re.findall(r"^\| *(\d+|apart) *\|", DESIGN.read_text().split("\n## Floors", 1)[1].split("\n## ", 1)[0],
                      re.MULTILINE)
    assert [str(r.floor) for r in ROOMS] == rows and len(rows) >= 6
    assert room_of("collectors/vmstat.py").floor == 2 and room_of("kneeswarm/target/server.py").floor == APART


def test_every_source_stands_in_a_room():
    lost = [str(p.relative_to(ROOT)) for p in sources() if room_of(str(p.relative_to(ROOT))) is None]
    assert not lost, f"on no floor of docs/design.md's table: {lost}"


def upward_imports(path: Path, rel: str | None = None) -> list[str]:
    """One line per import of ``path`` (standing at ``rel``, default its own place) that the floor
    table refuses."""
    rel = rel or str(path.relative_to(ROOT))
    mine = room_of(rel)
    assert mine is not None, f"{rel}: on no floor"
    wrong = []
    for line, name in project_imports(path, module_name(ROOT / rel)):
        target = module_file(name)
        theirs = room_of(target) if target else None
        if theirs is None or theirs == mine:
            continue  # not a project module (an attribute of one resolves to its module), or my own room
        if mine.floor == APART or (mine.floor != TOP if theirs.floor == APART else theirs.floor >= mine.floor):
            wrong.append(f"line {line}: floor {mine.floor} imports {name} (floor {theirs.floor})")
    return wrong


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    wrong = upward_imports(path)
    assert not wrong, f"{path.relative_to(ROOT)}: " + "; ".join(wrong)


@pytest.mark.parametrize("rel, code, refused", [
    ("collectors/_probe.py", "from analysis.knee import find_knee\n", "floor 2 imports analysis.knee.find_knee (floor 3)"),
    ("analysis/_probe.py", "from locustfiles import recorder\n", "floor 3 imports locustfiles.recorder (floor 3)"),
    ("kneeswarm/conductor.py", "from kneeswarm.cli import main\n", "floor 4 imports kneeswarm.cli.main (floor 5)"),
    ("analysis/_probe.py", "import kneeswarm.target.server\n", "floor 3 imports kneeswarm.target.server (floor apart)"),
    ("kneeswarm/target/_probe.py", "from kneeswarm import rundir\n", "floor apart imports kneeswarm.rundir (floor 1)"),
])
def test_the_floor_check_catches_an_import_that_runs_up_or_sideways(tmp_path, rel, code, refused):
    # The check must be able to fail: an import up a floor, one into a room beside on the same
    # floor, the demo target imported below the top floor or importing the project.
    probe = tmp_path / "probe.py"
    probe.write_text(code)
    assert upward_imports(probe, rel) == [f"line 1: {refused}"]
    if "target" not in rel:  # the same place importing down, and a library, passes
        probe.write_text("from kneeswarm.rundir import RunDir\nimport numpy\n")
        assert upward_imports(probe, rel) == []



def readme_disagreements(readme: str) -> list[str]:
    """Where README's "Layout" gives a room of the table another floor.  Each top folder's entry is
    split at "·" into parts that say their floor ("floor N" or "apart"); a module or folder of the
    table must be named only in parts of its floor, a whole top folder must have a part of its floor."""
    block = readme.split("\n## Layout", 1)[1].split("```")[1]
    entries: dict[str, str] = {}
    top = ""
    for line in block.splitlines():
        if line and not line[0].isspace():
            top, _, line = line.partition(" ")
        entries[top] = entries.get(top, "") + " " + line.strip()
    wrong = []
    for room in ROOMS:
        for path in room.paths:
            first, _, rest = path.partition("/")
            parts = entries.get(first + "/", "").split("·")
            named = [p for p in parts if re.search(rf"(^|[\s(]){re.escape(rest)}", p)] if rest else parts
            said = {m[1] or m[2] for p in named if (m := re.search(r"floor (\d)|\b(apart)\b", p))}
            if (said != {str(room.floor)}) if rest else (str(room.floor) not in said):
                wrong.append(f"{path}: README says floor {', '.join(sorted(said)) or 'nothing'}, the table {room.floor}")
    return wrong


def test_the_readme_layout_says_the_same_floors():
    readme = (ROOT / "README.md").read_text()
    assert readme_disagreements(readme) == []
    # and the check can fail: the command line said to stand on floor 4
    moved = readme.replace("floor 5: cli.py", "floor 4: cli.py")
    assert moved != readme and readme_disagreements(moved) == ["kneeswarm/cli.py: README says floor 4, the table 5"]

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


def test_the_modules_say_the_floor_they_stand_on():
    # A module's docstring that names its floor in its first line names the table's.
    wrong = []
    for p in sources():
        first = (ast.get_docstring(ast.parse(p.read_text())) or "").split("\n", 1)[0]
        said = re.findall(r"\b[Ff]loor (\d)", first)
        room = room_of(str(p.relative_to(ROOT)))
        if said and room is not None and said[0] != str(room.floor):
            wrong.append(f"{p.relative_to(ROOT)}: says floor {said[0]}, stands on {room.floor}")
    assert not wrong, wrong
