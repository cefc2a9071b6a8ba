"""Copying a host agent's files home into hosts/<host>/raw/: incremental during the run, then a
final fetch verified against the agent's MANIFEST.json.

A final fetch that fails, or files that do not match their checksums, are not only a warning:
``lost["unverified_files"]`` counts them and ``verified`` stays False (the host's meta then says
``complete: false``); the remote directory is kept so that nothing is lost for good.  A verified
directory that cannot be removed is no loss, but it is not silent either: ``info["kept"]`` and
``info["removal_error"]``, a warning, and the host's meta ``left_on_server`` (the run is then
reported incomplete, exit 1: a pipeline must learn that the server still holds its files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from kneeswarm.contracts.rundir import WarningLog

from kneeswarm.agents.errors import AgentError, TransportError
from kneeswarm.agents.link import RECONNECT_WINDOW, HostLink
from kneeswarm.agents.remote.defaults import MANIFEST_FILE, NOT_FETCHED, REWRITTEN, STATUS_FILE

logger = logging.getLogger(__name__)

FETCH_CHUNK = 4 << 20  # bytes per read of an incremental fetch
FINAL_WINDOW = 120.0  # seconds the final fetch keeps retrying a lost connection


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Fetcher:
    def __init__(self, link: HostLink, raw_dir: Path, keep_remote: bool, warnings: WarningLog):
        self.link = link
        self.raw_dir = raw_dir
        self.keep_remote = keep_remote
        self.warnings = warnings
        self.info: dict[str, Any] = {"verified": False, "bytes": 0, "files": 0}
        self.lost: dict[str, int] = {}
        self.postponed = 0
        self._sizes_seen: dict[str, int] = {}

    # -- copying ---------------------------------------------------------------------------
    def _read(self, name: str, offset: int, length: int) -> bytes:
        out = b""
        while len(out) < length:
            chunk = self.link.retry(lambda: self.link.t.read_range(self.link.path(name), offset + len(out),
                                                                    min(FETCH_CHUNK, length - len(out))),
                                    RECONNECT_WINDOW, f"read of {name}")
            if not chunk:
                break
            out += chunk
        return out

    def _fetch_file(self, name: str, size: int, whole: bool = False) -> int:
        local = self.raw_dir / name
        have = local.stat().st_size if local.exists() else 0
        if whole or name in REWRITTEN or size < have:
            data = self._read(name, 0, size)
            tmp = local.with_name(f".{name}.tmp")
            tmp.write_bytes(data)
            tmp.replace(local)
            return len(data)
        added = 0
        with open(local, "ab") as f:
            while have + added < size:
                data = self._read(name, have + added, min(FETCH_CHUNK, size - have - added))
                if not data:
                    break
                f.write(data)
                f.flush()
                added += len(data)
        return added

    def _not_fetched(self, name: str) -> bool:
        """The agent's own script (remote.pyz or remote.sh) and its bookkeeping stay on the host."""
        return name in NOT_FETCHED or name == self.link.flavor.script

    def _wanted(self, name: str, size: int, final: bool) -> bool:
        if self._not_fetched(name) or ".tmp" in name:
            return False
        if self._sizes_seen.get(name) != size or not (self.raw_dir / name).exists():
            return True
        return name in REWRITTEN and (final or name == STATUS_FILE)

    def _copy(self, remote_dir: str, window: float, final: bool) -> dict[str, int]:
        sizes = self.link.retry(lambda: self.link.t.sizes(remote_dir), window,
                                "listing of the agent directory")
        got: dict[str, int] = {}
        for name, size in sorted(sizes.items()):
            if self._wanted(name, size, final):
                got[name] = self._fetch_file(name, size)
                self._sizes_seen[name] = size
        return got

    def fetch(self) -> dict[str, int]:
        """Copy new bytes of every agent file. A lost connection is retried for
        RECONNECT_WINDOW seconds and then left for the next fetch (returns what was fetched)."""
        remote_dir = self.link.remote_dir
        if remote_dir is None:
            return {}
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        try:
            return self._copy(remote_dir, RECONNECT_WINDOW, final=False)
        except TransportError as e:
            logger.warning("%s: fetch postponed: %s", self.link.label, e)
            self.postponed += 1
            if self.postponed == 1:
                self.warnings.add(f"incremental fetch postponed at {time.time():.0f} ({self.link.bare(e)})")
            return {}

    # -- the final fetch -------------------------------------------------------------------
    def fetch_final(self) -> dict[str, int]:
        """After stop: fetch everything (retrying for FINAL_WINDOW), verify it against
        MANIFEST.json, remove the remote directory when all matched (unless keep_remote).
        Never raises for lost data: it is counted in ``lost`` and warned about."""
        remote_dir = self.link.remote_dir
        if remote_dir is None:
            return {}
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        try:
            got = self._copy(remote_dir, FINAL_WINDOW, final=True)
        except AgentError as e:
            n = max(1, len([p for p in self.raw_dir.iterdir() if not p.name.startswith(".")]))
            self._unverified(n, f"final fetch failed: {self.link.bare(e)}")
            return {}
        self.verify()
        return got

    def _unverified(self, n: int, why: str) -> None:
        self.lost["unverified_files"] = self.lost.get("unverified_files", 0) + n
        self.info.update(verified=False, error=why, remote_dir=self.link.remote_dir, kept=True)
        self.warnings.add(f"{why}; the data stays on the host in {self.link.remote_dir}")
        logger.error("%s: %s", self.link.label, why)

    def _matches(self, name: str, entry: dict[str, Any]) -> bool:
        """Whether raw/<name> matches its manifest entry, after fetching it again whole once."""
        for attempt in range(2):
            local = self.raw_dir / name
            if local.exists() and sha256_of(local) == entry.get("sha256"):
                return True
            if attempt == 0:
                logger.warning("%s: %s does not match the manifest; fetching it again", self.link.label, name)
                try:
                    self._fetch_file(name, int(entry.get("size") or 0), whole=True)
                except AgentError:
                    return False
        return False

    def verify(self) -> None:
        try:
            manifest = json.loads((self.raw_dir / MANIFEST_FILE).read_text())
            files = dict(manifest.get("files") or {})
        except (OSError, ValueError, AttributeError):
            self._unverified(max(1, len(self._sizes_seen)),
                             "no readable MANIFEST.json fetched (was the agent stopped?)")
            return
        bad = sorted(n for n, m in files.items() if not self._not_fetched(n) and not self._matches(n, m))
        total = sum(int(m.get("size") or 0) for m in files.values())
        self.info = {"verified": not bad, "files": len(files), "bytes": total, "remote_dir": self.link.remote_dir,
                     "kept": bool(self.keep_remote or bad)}
        if bad:
            self.info["mismatched"] = bad
            self._unverified(len(bad), f"{', '.join(bad)} did not match the sha256 in MANIFEST.json")
            return
        logger.info("%s: %d files (%d bytes) verified against MANIFEST.json", self.link.label, len(files), total)
        if not self.keep_remote:
            self._remove_remote()

    def _remove_remote(self) -> None:
        """Remove the verified agent directory; one that stays is said in ``info`` (``kept``,
        ``removal_error``), in the warnings, and as ``left_on_server`` in the host's meta."""
        remote_dir = self.link.remote_dir
        if remote_dir is None:  # never deployed: nothing on the host to remove
            return
        try:
            self.link.retry(lambda: self.link.t.remove_tree(remote_dir), RECONNECT_WINDOW,
                            "removal of the agent directory")
        except AgentError as e:
            why = self.link.bare(e)
            self.info.update(kept=True, removal_error=why)
            self.warnings.add(f"the agent directory {self.link.remote_dir} could not be removed ({why}): "
                              "its files stay on the host; remove it by hand")
            logger.error("%s: removal of %s failed: %s", self.link.label, self.link.remote_dir, why)
