"""`pip install kneeswarm` puts one name in site-packages: the wheel, built from this checkout and
installed into a fresh virtual environment, holds the package `kneeswarm` (the linked folders under
it, the agent's shell script beside its code) and no top-level `agents`, `analysis`, `collectors` or
`locustfiles`, and the installed copy runs: its command line, its locustfile, the agent's zipapp.

The fresh environment has none of kneeswarm's dependencies (installing them would download
hundreds of megabytes): they come from this interpreter's site-packages through PYTHONPATH, which
adds their directory without its .pth files, so this checkout's editable install is not loaded and
every `kneeswarm` module imported is the installed wheel's (the test checks the file it came from).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINKED = ("agents", "analysis", "collectors", "locustfiles")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: this environment's setuptools builds it (no download)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, timeout=300)
    (found,) = out.glob("kneeswarm-*.whl")
    return found


@pytest.fixture(scope="module")
def fresh(tmp_path_factory, wheel) -> tuple[Path, set[str]]:
    """A fresh venv with the wheel installed: (its python, the top-level names the wheel added)."""
    home = tmp_path_factory.mktemp("venv")
    venv.create(home, with_pip=True)
    py = home / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    before = {p.name for p in site.iterdir()}
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   timeout=300)
    added = {p.name for p in site.iterdir()} - before
    return py, added


def _env() -> dict[str, str]:
    """The dependencies of kneeswarm from this interpreter, without its .pth files (the editable install)."""
    return {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"], "PYTHONNOUSERSITE": "1"}


def test_the_wheel_holds_one_package_with_every_floor(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"kneeswarm"}
    for folder in LINKED:  # the linked folders travel inside the package, with their subpackages
        assert f"kneeswarm/{folder}/__init__.py" in names
    assert "kneeswarm/agents/remote/__main__.py" in names and "kneeswarm/analysis/models/knee.py" in names
    assert "kneeswarm/agents/remote.sh" in names  # package data: the agent where a host has no python3
    assert "kneeswarm/locustfiles/swarm.py" in names


def test_a_fresh_install_puts_only_kneeswarm_in_site_packages(fresh):
    _, added = fresh
    assert not added & set(LINKED)
    assert {a for a in added if not a.endswith(".dist-info")} == {"kneeswarm"}


def test_the_installed_package_runs_from_its_own_files(fresh, tmp_path):
    py, _ = fresh
    code = ("import kneeswarm.launch.cli as cli, kneeswarm.analysis.models.knee as knee, kneeswarm.locustfiles.swarm, "
            "kneeswarm.agents.bundle as bundle, kneeswarm.collectors as c, sys; "
            "print(cli.__file__); print(knee.__file__); print(len(bundle.agent_zipapp())); print(sorted(c.COLLECTORS)); "
            "import importlib.util; print([n for n in ('agents', 'analysis', 'collectors', 'locustfiles') "
            "if importlib.util.find_spec(n)])")
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cli_file, knee_file, zipapp_size, collectors, stray = out.stdout.splitlines()
    site = str(py.parent.parent)
    assert cli_file.startswith(site) and knee_file.startswith(site), (cli_file, knee_file)  # not this checkout
    assert int(zipapp_size) > 10_000 and "procfs" in collectors
    assert stray == "[]"  # no top-level name of the project importable from outside the checkout
    # its console script, and the agent's shell script found in the installed package
    out = subprocess.run([str(py.parent / "kneeswarm"), "--help"], cwd=tmp_path, env=_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "run" in out.stdout, out.stderr
    code = "import kneeswarm.agents.shellagent as s, pathlib; print(pathlib.Path(s.__file__).with_name('remote.sh').is_file())"
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
