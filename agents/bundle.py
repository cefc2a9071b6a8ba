"""The remote agent as one file: the package agents/remote/ packed into a zipapp at deploy time.

    data = agent_zipapp()      # bytes of remote.pyz, uploaded to the host's agent directory

The archive holds the package as ``remote/`` and, at its root, the package's ``__main__.py``, so
that ``python3 -I -S remote.pyz VERB ...`` runs it on any python3 from 3.6 up (``-I`` leaves the
archive itself on sys.path).  Built with the standard library's ``zipapp`` from the sources as they
are (no build step to forget): once per process, cached.
"""

from __future__ import annotations

import functools
import io
import shutil
import tempfile
import zipapp
from pathlib import Path

#: The package packed (its modules import one another relatively, so its name in the archive is free).
PACKAGE = Path(__file__).resolve().with_name("remote")
#: The package's name inside the archive (its __main__.py imports ``remote.cli``).
ARCHIVE_PACKAGE = "remote"


@functools.lru_cache(maxsize=1)
def agent_zipapp() -> bytes:
    """remote.pyz's bytes: agents/remote/*.py under ``remote/`` and its ``__main__.py`` at the root."""
    with tempfile.TemporaryDirectory(prefix="kneeswarm-agent-") as tmp:
        src = Path(tmp) / "src"
        pkg = src / ARCHIVE_PACKAGE
        pkg.mkdir(parents=True)
        for f in sorted(PACKAGE.glob("*.py")):
            shutil.copyfile(f, pkg / f.name)
        shutil.copyfile(PACKAGE / "__main__.py", src / "__main__.py")
        out = io.BytesIO()
        zipapp.create_archive(src, out, compressed=True)
        return out.getvalue()


def write_agent_zipapp(path: str | Path) -> Path:
    """Write remote.pyz to ``path`` (tests and bench run the agent from such a file)."""
    path = Path(path)
    path.write_bytes(agent_zipapp())
    return path
