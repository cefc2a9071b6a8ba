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
PACKAGE = "kneeswarm"
#: the repository's top-level folders that are linked into the one installed package
LINKED = ("agents", "analysis", "collectors", "locustfiles")
FOLDERS = (PACKAGE, *LINKED)
APART = "apart"
MAX_FUNCTION_LINES = 60


@dataclass(frozen=True)
class Room:
    floor: int | str  # a number, or APART
    paths: tuple[str, ...]  # "agents/" (a folder and all below it), "kneeswarm/launch/cli.py" (one module)

    def holds(self, rel: str) -> int:
        """The length of this room's longest path holding ``rel`` (a file, relative to ROOT), 0: none."""
        return max((len(p) for p in self.paths if rel == p or (p.endswith("/") and rel.startswith(p))), default=0)


def floor_table(text: str, heading: str) -> list[Room]:
    """The rooms of the table under ``heading`` in docs/design.md: | floor | `path`, ... | owns |."""
    section = text.split(f"\n{heading}", 1)[1].split("\n#", 1)[0]
    rooms = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not (cells[0].isdigit() or cells[0] == APART):
            continue  # the header, its rule, the text around the table
        paths = tuple(re.findall(r"`([^`]+)`", cells[1]))
        assert paths, f"docs/design.md: the floor row {line!r} names no path"
        rooms.append(Room(int(cells[0]) if cells[0].isdigit() else APART, paths))
    assert rooms, f"docs/design.md: no floor table under {heading!r}"
    return rooms


ROOMS = floor_table(DESIGN.read_text(), "## Floors")
#: the analysis' own floors: they order the imports between two modules both inside analysis/
INNER = floor_table(DESIGN.read_text(), "### Inside analysis/")
INNER_TOP = "analysis/"
TOP = max(r.floor for r in ROOMS if r.floor != APART)


def _room(rooms: list[Room], rel: str) -> Room | None:
    best = max(rooms, key=lambda r: r.holds(rel))
    return best if best.holds(rel) else None


def room_of(rel: str) -> Room | None:
    return _room(ROOMS, rel)


def module_name(path: Path) -> str:
    """The installed name of a source file: agents/ssh.py is kneeswarm.agents.ssh."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join((PACKAGE, *parts) if parts[0] in LINKED else parts)


def module_file(name: str) -> str | None:
    """The file (relative to ROOT) of the longest project module that ``name`` starts with."""
    parts = name.split(".")
    if len(parts) > 1 and parts[0] == PACKAGE and parts[1] in LINKED:
        parts = parts[1:]
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file() and not any(p.is_symlink() for p in (base, base.parent)):
                return str(candidate.relative_to(ROOT))
    return None


def project_imports(path: Path, here: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a project module, or of a bare top-level folder, in ``path``
    (module ``here``), relative ones resolved; ``from package import module`` counts as an import of
    the module, not of the package."""
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
        out += [(node.lineno, name) for name in names if name.split(".")[0] in FOLDERS]
    return out


def sources() -> list[Path]:
    """Every source file, once: the folders themselves (rglob does not follow kneeswarm/'s links)."""
    return sorted(p for top in FOLDERS for p in (ROOT / top).rglob("*.py"))


def test_the_sources_are_found():
    names = {module_name(p) for p in sources()}
    assert {"kneeswarm.contracts.plan", "kneeswarm.collectors.base", "kneeswarm.agents.remote",
            "kneeswarm.analysis.models.knee", "kneeswarm.locustfiles.plugin", "kneeswarm.launch.cli",
            "kneeswarm.target.server"} <= names
    assert len(names) == len(sources())  # the links were not followed: no module counted twice


def test_every_linked_folder_is_a_link_into_the_package():
    for top in LINKED:
        link = ROOT / PACKAGE / top
        assert link.is_symlink() and link.resolve() == (ROOT / top).resolve(), f"{link}: not a link to ../{top}"


def test_the_table_is_read_from_the_design_document():
    # Independent truth: the rows as docs/design.md spells them, found by a plain search.
    text = DESIGN.read_text()
    for heading, rooms in (("## Floors", ROOMS), ("### Inside analysis/", INNER)):
        section = text.split("\n" + heading, 1)[1].split("\n#", 1)[0]
        rows = re.findall(r"^\| *(\d+|apart) *\|", section, re.MULTILINE)
        assert [str(r.floor) for r in rooms] == rows and len(rows) >= 6
    assert room_of("collectors/vmstat.py").floor == 2 and room_of("kneeswarm/target/server.py").floor == APART
    assert _room(INNER, "analysis/models/knee.py").floor == 1


def test_every_source_stands_in_a_room():
    lost = [str(p.relative_to(ROOT)) for p in sources() if room_of(str(p.relative_to(ROOT))) is None]
    lost += [str(p.relative_to(ROOT)) for p in sources()
             if str(p.relative_to(ROOT)).startswith(INNER_TOP) and _room(INNER, str(p.relative_to(ROOT))) is None]
    assert not lost, f"on no floor of docs/design.md's tables: {lost}"


def _refused(mine: Room, theirs: Room, top: int | str) -> bool:
    if mine.floor == APART:
        return True
    if theirs.floor == APART:
        return mine.floor != top
    return theirs.floor >= mine.floor


def upward_imports(path: Path, rel: str | None = None) -> list[str]:
    """One line per import of ``path`` (standing at ``rel``, default its own place) that the floor
    tables refuse, or that names a top-level folder rather than its installed name."""
    rel = rel or str(path.relative_to(ROOT))
    mine = room_of(rel)
    assert mine is not None, f"{rel}: on no floor"
    wrong = []
    for line, name in project_imports(path, module_name(ROOT / rel)):
        if name.split(".")[0] != PACKAGE:
            wrong.append(f"line {line}: imports {name}, a top-level folder: say kneeswarm.{name}")
            continue
        target = module_file(name)
        theirs = room_of(target) if target else None
        if theirs is None:
            continue  # not a project module (an attribute of one resolves to its module)
        if theirs != mine:
            if _refused(mine, theirs, TOP):
                wrong.append(f"line {line}: floor {mine.floor} imports {name} (floor {theirs.floor})")
        elif rel.startswith(INNER_TOP) and target and target.startswith(INNER_TOP):
            inner_mine, inner_theirs = _room(INNER, rel), _room(INNER, target)
            if inner_mine and inner_theirs and inner_mine != inner_theirs and _refused(inner_mine, inner_theirs, -1):
                wrong.append(f"line {line}: analysis floor {inner_mine.floor} imports {name} "
                             f"(analysis floor {inner_theirs.floor})")
    return wrong


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_point_down(path):
    wrong = upward_imports(path)
    assert not wrong, f"{path.relative_to(ROOT)}: " + "; ".join(wrong)


def test_nothing_imports_a_top_level_folder():
    # tests, benchmarks and the conformance suite too: `import analysis` would load a second copy of
    # every module (the repository root is on sys.path under `python -m pytest`), and a constant a
    # test patches there would not be the one the code reads.
    found = []
    for top in ("tests", "bench", "tests_conformance"):
        for p in (ROOT / top).rglob("*.py"):
            for line, name in project_imports(p, p.stem):
                if name.split(".")[0] in LINKED:
                    found.append(f"{p.relative_to(ROOT)}:{line} {name}")
    assert not found, found


@pytest.mark.parametrize("rel, code, refused", [
    ("collectors/_probe.py", "from kneeswarm.analysis.models.knee import find_knee\n",
     "floor 2 imports kneeswarm.analysis.models.knee.find_knee (floor 3)"),
    ("analysis/_probe.py", "from kneeswarm.locustfiles import recorder\n",
     "floor 3 imports kneeswarm.locustfiles.recorder (floor 3)"),
    ("kneeswarm/launch/conductor.py", "from kneeswarm.launch.cli import main\n",
     "floor 4 imports kneeswarm.launch.cli.main (floor 5)"),
    ("analysis/_probe.py", "import kneeswarm.target.server\n", "floor 3 imports kneeswarm.target.server (floor apart)"),
    ("kneeswarm/target/_probe.py", "from kneeswarm.contracts import rundir\n",
     "floor apart imports kneeswarm.contracts.rundir (floor 1)"),
    ("analysis/measure/_probe.py", "from kneeswarm.analysis.findings import explain\n",
     "analysis floor 1 imports kneeswarm.analysis.findings.explain (analysis floor 2)"),
    ("analysis/models/_probe.py", "from kneeswarm.analysis.measure import windows\n",
     "analysis floor 1 imports kneeswarm.analysis.measure.windows (analysis floor 1)"),
    ("collectors/_probe.py", "from agents.remote import defaults\n",
     "imports agents.remote.defaults, a top-level folder: say kneeswarm.agents.remote.defaults"),
])
def test_the_floor_check_catches_an_import_that_runs_up_or_sideways(tmp_path, rel, code, refused):
    # The check must be able to fail: an import up a floor, one into a room beside on the same
    # floor, the demo target imported below the top floor or importing the project.
    probe = tmp_path / "probe.py"
    probe.write_text(code)
    assert upward_imports(probe, rel) == [f"line 1: {refused}"]
    if "target" not in rel:  # the same place importing down, and a library, passes
        probe.write_text("from kneeswarm.contracts.rundir import RunDir\nimport numpy\n")
        assert upward_imports(probe, rel) == []



def layout_disagreements(page: str) -> list[str]:
    """Where the "Layout" map (docs/design.md) gives a room of the table another floor.  Each top
    folder's entry is split at "·" into parts that say their floor ("floor N" or "apart"); a module or
    folder of the table must be named only in parts of its floor, a whole top folder must have a part
    of its floor."""
    block = page.split("\n## Layout", 1)[1].split("```")[1]
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
            named = [p for p in parts if re.search(rf"(^|[\s(]){re.escape(rest)}(?![\w/.])", p)] if rest else parts
            said = {m[1] or m[2] for p in named if (m := re.search(r"floor (\d)|\b(apart)\b", p))}
            if (said != {str(room.floor)}) if rest else (str(room.floor) not in said):
                wrong.append(f"{path}: the layout says floor {', '.join(sorted(said)) or 'nothing'}, the table {room.floor}")
    return wrong


def test_the_layout_map_says_the_same_floors():
    design = (ROOT / "docs" / "design.md").read_text()
    assert layout_disagreements(design) == []
    # and the check can fail: the command line said to stand on floor 4
    moved = design.replace("floor 5: launch/cli.py", "floor 4: launch/cli.py")
    assert moved != design and layout_disagreements(moved) == ["kneeswarm/launch/cli.py: the layout says floor 4, the table 5"]

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
