"""The agent directory's files: atomic writes, small reads, and MANIFEST.json (sha256 and size of
every file), which the controller checks each fetched file against before it removes the
directory (agents/fetch.py)."""

import hashlib
import json
import os

from .common import wall_time
from .defaults import MANIFEST_FILE, NOT_IN_MANIFEST, READ_CHUNK


def write_text_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json_atomic(path: str, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=1, sort_keys=True))


def read_json(path: str) -> "dict | None":
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path: str) -> str:
    """A small file's text (/proc, cgroup files): os.open/os.read, half the CPU of open() -- a
    256-thread process is 768 of these per thread sample."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, READ_CHUNK)]
        while len(chunks[-1]) == READ_CHUNK:  # a /proc file comes whole in one read when it fits
            chunks.append(os.read(fd, READ_CHUNK))
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def file_size(path: "str | None") -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def file_key(path: str):
    """What changes whenever ``path`` is rewritten (inode, mtime, size); None when missing. Not
    the mtime alone: under libfaketime the process clock and the file times disagree."""
    try:
        st = os.stat(path)
        return (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def touch(path: str) -> None:
    write_text_atomic(path, f"{wall_time()!r}\n")


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_manifest(run_dir: str) -> dict:
    files = {}
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if name in NOT_IN_MANIFEST or ".tmp" in name or not os.path.isfile(path):
            continue
        h = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                size += len(chunk)
        files[name] = {"sha256": h.hexdigest(), "size": size}
    manifest = {"written": wall_time(), "files": files}
    write_json_atomic(os.path.join(run_dir, MANIFEST_FILE), manifest)
    return manifest
