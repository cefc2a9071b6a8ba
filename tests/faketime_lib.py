"""Finding libfaketime on any architecture, for tests that shift a process's clock.

    prefix = faketime_prefix(2.5)    # ["env", "LD_PRELOAD=/usr/lib/<arch>/faketime/libfaketime.so.1", "FAKETIME=+2.5s"]

Skipped when the ``faketime`` package is not installed; a loud failure when it is installed but
its library cannot be found or does not shift the clock of a python process (never a silent skip).
The library goes through the environment, not the ``faketime`` wrapper: the wrapper waits for
every process that inherited it, so a daemonising ``remote.pyz start`` would not return.
"""

from __future__ import annotations

import glob
import re
import shutil
import subprocess
import sys
import time

import pytest

LIB_NAME = "libfaketime.so.1"
#: Where distributions put it ($LIB is the dynamic loader's per-architecture directory).
LIB_GLOBS = ("/usr/lib/*/faketime/" + LIB_NAME, "/usr/lib*/faketime/" + LIB_NAME,
             "/usr/local/lib*/faketime/" + LIB_NAME, "/usr/local/lib/*/faketime/" + LIB_NAME,
             "/opt/homebrew/lib/faketime/" + LIB_NAME)


def _paths_named_by_wrapper(exe: str) -> list[str]:
    """The library paths compiled into the ``faketime`` wrapper (e.g. /usr/$LIB/faketime/...)."""
    try:
        with open(exe, "rb") as f:
            data = f.read()
    except OSError:
        return []
    found = re.findall(rb"(/[A-Za-z0-9_$./-]*/" + re.escape(LIB_NAME.encode()) + rb")", data)
    out = []
    for raw in found:
        path = raw.decode("ascii", "replace")
        out += [path.replace("$LIB", pat) for pat in ("lib/*", "lib64", "lib", "*")] if "$LIB" in path else [path]
    return out


def find_libfaketime() -> str | None:
    """The path of libfaketime.so.1, or None."""
    exe = shutil.which("faketime")
    patterns = (_paths_named_by_wrapper(exe) if exe else []) + list(LIB_GLOBS)
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def faketime_prefix(shift_s: float) -> list[str]:
    """An argv prefix running a command with its clock shifted by ``shift_s`` seconds."""
    lib = find_libfaketime()
    if lib is None:
        if shutil.which("faketime"):
            pytest.fail(f"faketime is installed but {LIB_NAME} was not found (looked in {', '.join(LIB_GLOBS)} "
                        "and the paths the faketime wrapper names)")
        pytest.skip("faketime (libfaketime) is not installed")
    prefix = ["env", f"LD_PRELOAD={lib}", f"FAKETIME={shift_s:+g}s"]
    out = subprocess.run([*prefix, sys.executable, "-c", "import time; print(time.time())"],
                         capture_output=True, text=True, timeout=20)
    try:
        shifted = float(out.stdout) - time.time()
    except ValueError:
        pytest.fail(f"python under {lib} printed {out.stdout!r} ({out.stderr.strip()[-200:]})")
    if abs(shifted - shift_s) > 1.0:
        pytest.fail(f"{lib} did not shift python's clock: {shifted:+.2f}s instead of {shift_s:+g}s")
    return prefix
