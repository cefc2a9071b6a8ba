"""The controller side of one monitored host: preflight, start, heartbeat, fetch, stop, parse.

    agent = open_agent(host_plan, run, interval=1, max_duration=600, heartbeat_timeout=30)
    facts = agent.preflight()        # raises AgentError (one line) if the host or process is not there
    agent.start()                    # clock offset, upload config, start the remote agent, heartbeats
    agent.fetch()                    # incremental, any time during the run
    agent.stop(); agent.fetch(final=True)   # checksums verified; remote dir removed after a match
    stats = agent.write_parsed()     # hosts/<host>/<table>.csv on the master's clock
    meta = agent.meta()              # for meta.json["hosts"][label]
    agent.close()

``HostAgents`` does the same over several hosts.  The transport (local subprocess or SSH) is the
only difference between ``local`` and a remote server.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from kneeswarm.plan import HostPlan
from kneeswarm.rundir import RunDir

from collectors.parsed import write_parsed_csvs

from agents import clock, selection
from agents.errors import AgentError, HostKeyError, TransportError
from agents.transport import Transport

logger = logging.getLogger(__name__)

REMOTE_SCRIPT = Path(__file__).with_name("remote.py")
PREFLIGHT_TIMEOUT = 60.0
START_TIMEOUT = 40.0
STOP_TIMEOUT = 60.0
HEARTBEAT_PERIOD = 3.0  # seconds between heartbeats (at most a third of the heartbeat timeout)
MAX_DURATION_MARGIN = 60.0  # added to the plan's duration for the agent's own limit
FETCH_CHUNK = 4 << 20  # bytes per read of an incremental fetch
RECONNECT_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds between reconnect attempts (last repeats)
RECONNECT_WINDOW = 10.0  # seconds an operation during the run keeps retrying before giving up
FINAL_WINDOW = 120.0  # seconds stop / final fetch keep retrying a lost connection
#: Prefixes of the remote command lines (tests run the agent under faketime with these).
AGENT_WRAPPER: list[str] = []
ECHO_WRAPPER: list[str] = []
#: Files of the agent directory not copied home.
NOT_FETCHED = frozenset({"remote.py", "heartbeat", "agent.pid"})
#: Files rewritten in place (not append-only): fetched whole whenever they change.
REWRITTEN = frozenset({"status.json", "MANIFEST.json", "agent.json", "preflight.json"})
MAX_HOST_WARNINGS = 50  # warnings kept per host for meta.json (the rest are counted)

T = TypeVar("T")


def make_transport(host: HostPlan, accept_new_host_keys: bool = False) -> Transport:
    if host.ssh is None:
        from agents.local import LocalTransport

        return LocalTransport(label=host.label)
    from agents.ssh import SSHTransport

    return SSHTransport.from_plan(host, accept_new_host_keys=accept_new_host_keys)


def open_agent(host: HostPlan, run: RunDir, interval: float = 1.0, max_duration: float = 3600.0,
               heartbeat_timeout: float = 30.0, accept_new_host_keys: bool = False,
               metrics_url: str | None = None, transport: Transport | None = None) -> HostAgent:
    """A HostAgent for ``host`` (connected: an unreachable host raises AgentError here)."""
    return HostAgent(host, run, transport or make_transport(host, accept_new_host_keys), interval=interval,
                     max_duration=max_duration, heartbeat_timeout=heartbeat_timeout, metrics_url=metrics_url)


class HostAgent:
    def __init__(self, host: HostPlan, run: RunDir, transport: Transport, interval: float = 1.0,
                 max_duration: float = 3600.0, heartbeat_timeout: float = 30.0,
                 metrics_url: str | None = None):
        self.host = host
        self.label = host.label
        self.run = run
        self.t = transport
        self.interval = float(interval)
        self.max_duration = float(max_duration)
        self.heartbeat_timeout = float(heartbeat_timeout)
        self.metrics_url = metrics_url
        self.run_id = run.path.name
        self.raw_dir = run.raw_dir(self.label)
        self.remote_dir: str | None = None
        self.facts: dict[str, Any] | None = None
        self.pid: int | None = None
        self.selection: selection.Selection | None = None
        self.clock = clock.ClockCorrection()
        self.clock_errors: list[str] = []
        self.start_status: dict[str, Any] | None = None
        self.stop_info: dict[str, Any] | None = None
        self.fetch_info: dict[str, Any] = {"verified": False, "bytes": 0, "files": 0}
        self.parse_info: dict[str, Any] | None = None
        self.warnings: list[str] = []
        self.started = self.stopped = False
        self._uploaded = False
        self._lock = threading.RLock()
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._offsets: dict[str, int] = {}
        self._sizes_seen: dict[str, int] = {}
        self.last_heartbeat: float | None = None
        self.reconnects = 0
        self.heartbeat_failures = 0
        self.fetches_postponed = 0
        self._warnings_dropped = 0

    def warn(self, text: str) -> None:
        """Keep a warning for meta.json (deduplicated, at most MAX_HOST_WARNINGS)."""
        if text in self.warnings:
            return
        if len(self.warnings) < MAX_HOST_WARNINGS:
            self.warnings.append(text)
        else:
            self._warnings_dropped += 1

    # -- plumbing ------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        assert self.remote_dir is not None
        return f"{self.remote_dir}/{name}"

    def _argv(self, *args: str, wrapper: list[str] | None = None) -> list[str]:
        return [*(AGENT_WRAPPER if wrapper is None else wrapper), *self.t.python, self._path("remote.py"), *args]

    def _retry(self, op: Callable[[], T], window: float, what: str) -> T:
        """Run op; on a lost connection reconnect with backoff for up to ``window`` seconds."""
        deadline = time.monotonic() + window
        attempt = 0
        while True:
            try:
                with self._lock:
                    return op()
            except HostKeyError:
                raise
            except (TransportError, OSError, EOFError) as e:
                if time.monotonic() >= deadline:
                    raise TransportError(f"{self.label}: {what} failed: {self._bare(e)}") from None
                pause = RECONNECT_BACKOFF[min(attempt, len(RECONNECT_BACKOFF) - 1)]
                logger.warning("%s: %s failed (%s); reconnecting in %.1fs", self.label, what, self._bare(e), pause)
                time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                attempt += 1
                try:
                    with self._lock:
                        self.t.reconnect()
                        self.reconnects += 1
                except HostKeyError:
                    raise
                except (AgentError, OSError, EOFError) as e2:
                    logger.warning("%s: reconnect failed: %s", self.label, self._bare(e2))

    def _bare(self, e: BaseException) -> str:
        """The message of e without a leading '<label>: ' (messages name the host once)."""
        text = str(e) or type(e).__name__
        return text[len(self.label) + 2 :] if text.startswith(f"{self.label}: ") else text

    def _call(self, verb: str, arg: str | None, timeout: float, window: float = RECONNECT_WINDOW,
              wrapper: list[str] | None = None) -> dict[str, Any]:
        argv = self._argv(verb, *([arg] if arg else []), wrapper=wrapper)
        res = self._retry(lambda: self.t.run(argv, timeout), window, f"remote.py {verb}")
        text = res.stdout.decode("utf-8", "replace").strip()
        if res.rc == 127 or (res.rc != 0 and not text):
            line = res.err_line()
            if "python3" in line and ("not found" in line or "No such file" in line):
                raise AgentError(f"{self.label}: python3 is not installed on the host ({line})")
            raise AgentError(f"{self.label}: remote.py {verb} failed: {line}")
        try:
            out = json.loads(text.splitlines()[-1])
        except (ValueError, IndexError):
            raise AgentError(f"{self.label}: remote.py {verb} printed no JSON ({res.err_line()})") from None
        if not isinstance(out, dict):
            raise AgentError(f"{self.label}: remote.py {verb} printed {text[:80]!r}")
        if out.get("ok") is False:
            raise AgentError(f"{self.label}: remote.py {verb}: {out.get('error')}")
        return out

    def _upload_agent(self) -> None:
        if self._uploaded:
            return
        if self.remote_dir is None:
            self.remote_dir = self.t.run_root(self.run_id, self.label)
        script = REMOTE_SCRIPT.read_bytes()

        def up() -> None:
            self.t.makedirs(self.remote_dir)
            self.t.put(self._path("remote.py"), script, 0o755)

        self._retry(up, RECONNECT_WINDOW, "upload of remote.py")
        self._uploaded = True

    # -- preflight -----------------------------------------------------------------------
    def preflight(self) -> dict[str, Any]:
        """Facts about the host (for meta.json); AgentError if it cannot be monitored."""
        self._upload_agent()
        h = self.host
        cfg = {"checks": selection.check_argvs(), "pid": h.pid, "process": h.process, "port": h.port}
        self._retry(lambda: self.t.put(self._path("preflight.json"), json.dumps(cfg).encode()), RECONNECT_WINDOW,
                    "upload of preflight.json")
        facts = self._call("preflight", self._path("preflight.json"), PREFLIGHT_TIMEOUT, wrapper=[])
        proc = facts.get("process") or {}
        if proc.get("error"):
            raise AgentError(f"{self.label}: monitored process: {proc['error']}")
        self.pid = proc.get("pid")
        if self.pid is None:
            self.warnings.append("no monitored process (give pid, process or port): host-wide collectors only")
        self.facts = facts
        self.selection = selection.select(facts, h.collectors, self.pid, self.interval, self.label, self.metrics_url)
        for name, reason in self.selection.skipped.items():
            self.warnings.append(f"collector {name} skipped: {reason}")
        if not self.selection.enabled:
            raise AgentError(f"{self.label}: no collector can run ({'; '.join(self.warnings) or 'none available'})")
        return self.facts_summary()

    def facts_summary(self) -> dict[str, Any]:
        f = dict(self.facts or {})
        for k in ("ok", "tools"):
            f.pop(k, None)
        f["tools"] = {
            n: {"found": t.get("found"), "path": t.get("path"),
                "version": (self.selection.enabled.get(n, {}).get("version") if self.selection else None),
                "error": t.get("error")}
            for n, t in ((self.facts or {}).get("tools") or {}).items()
        }
        f["collectors"] = self.selection.to_dict() if self.selection else {}
        return f

    # -- clock ---------------------------------------------------------------------------
    def measure_clock(self) -> clock.ClockOffset | None:
        """One offset measurement over a fresh echo process; None (and a warning) if it fails."""
        self._upload_agent()
        echo = None
        try:
            with self._lock:
                echo = self.t.open_echo(self._argv("echo", wrapper=ECHO_WRAPPER))
                return clock.measure(echo, label=self.label)
        except AgentError as e:
            self.clock_errors.append(str(e))
            logger.warning("%s: clock offset not measured: %s", self.label, e)
            return None
        finally:
            if echo is not None:
                try:
                    echo.close()
                except Exception as e:  # closing a dead channel must not hide the result
                    logger.debug("%s: closing echo: %s", self.label, e)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, heartbeat_thread: bool = True) -> dict[str, Any]:
        """Measure the clock, start the remote agent and (by default) a heartbeat thread."""
        if self.selection is None:
            self.preflight()
        assert self.selection is not None
        self.clock.before = self.measure_clock()
        cfg = selection.agent_config(self.selection, self.interval, self.heartbeat_timeout,
                                     self.max_duration + MAX_DURATION_MARGIN, self.run_id, self.pid)
        self._retry(lambda: self.t.put(self._path("agent.json"), json.dumps(cfg, indent=1).encode()),
                    RECONNECT_WINDOW, "upload of agent.json")
        out = self._call("start", self._path("agent.json"), START_TIMEOUT)
        self.started = True
        self.start_status = out.get("status") or {}
        for name, c in (self.start_status.get("collectors") or {}).items():
            if c.get("error") or not c.get("running"):
                msg = f"collector {name} not running: {c.get('error') or 'exited with ' + str(c.get('exit_code'))}"
                self.warnings.append(msg)
                logger.warning("%s: %s", self.label, msg)
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        if heartbeat_thread:
            self._hb_stop.clear()
            self._hb_thread = threading.Thread(target=self._heartbeat_loop, name=f"heartbeat-{self.label}", daemon=True)
            self._hb_thread.start()
        logger.info("%s: agent started in %s (%s)", self.label, self.remote_dir, ", ".join(self.selection.enabled))
        return self.start_status

    def heartbeat(self) -> bool:
        """Renew the heartbeat once; False if the host could not be reached (the agent keeps recording)."""
        try:
            self._retry(lambda: self.t.touch(self._path("heartbeat")), 0.0, "heartbeat")
            self.last_heartbeat = time.time()
            return True
        except AgentError as e:
            logger.warning("%s", e)
            self.heartbeat_failures += 1
            if self.heartbeat_failures == 1:
                self.warn(f"connection lost during the run at {time.time():.0f} ({self._bare(e)}); "
                          "the agent kept recording, the controller reconnected")
            return False

    def _heartbeat_loop(self) -> None:
        period = min(HEARTBEAT_PERIOD, self.heartbeat_timeout / 3.0)
        attempt = 0
        while not self._hb_stop.wait(period if attempt == 0 else RECONNECT_BACKOFF[min(attempt - 1, len(RECONNECT_BACKOFF) - 1)]):
            if self.heartbeat():
                attempt = 0
                continue
            attempt += 1
            try:
                with self._lock:
                    self.t.reconnect()
                    self.reconnects += 1
                logger.info("%s: reconnected", self.label)
            except (AgentError, OSError, EOFError) as e:
                logger.warning("%s: reconnect failed (%s); the agent keeps recording", self.label, self._bare(e))

    def _stop_heartbeats(self) -> None:
        self._hb_stop.set()
        if self._hb_thread is not None:
            self._hb_thread.join(timeout=15)
            self._hb_thread = None

    def status(self) -> dict[str, Any]:
        return self._call("status", self.remote_dir, 30.0)

    def stop(self) -> dict[str, Any]:
        """Stop the remote agent and its collectors (MANIFEST.json written), then measure the clock again."""
        self._stop_heartbeats()
        if not self.started or self.stopped:
            return self.stop_info or {}
        out = self._call("stop", self.remote_dir, STOP_TIMEOUT, window=FINAL_WINDOW)
        self.stopped = True
        st = out.get("status") or {}
        self.stop_info = {
            "reason": out.get("reason"),
            "killed": out.get("killed") or [],
            "collectors": {n: {k: c.get(k) for k in ("exit_code", "bytes", "error", "lines") if k in c}
                           for n, c in (st.get("collectors") or {}).items()},
        }
        self._manifest = out.get("manifest")
        self.clock.after = self.measure_clock()
        return self.stop_info

    # -- data ----------------------------------------------------------------------------
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

    def _read(self, name: str, offset: int, length: int) -> bytes:
        out = b""
        while len(out) < length:
            chunk = self._retry(lambda: self.t.read_range(self._path(name), offset + len(out),
                                                           min(FETCH_CHUNK, length - len(out))),
                                RECONNECT_WINDOW, f"read of {name}")
            if not chunk:
                break
            out += chunk
        return out

    def fetch(self, final: bool = False) -> dict[str, int]:
        """Copy new bytes of every agent file into hosts/<host>/raw/.

        During the run a lost connection is retried for RECONNECT_WINDOW seconds and then left for
        the next fetch (returns what was fetched).  ``final=True`` (after stop) retries for
        FINAL_WINDOW seconds, verifies every file against MANIFEST.json (a mismatched file is
        fetched again, whole) and removes the remote directory unless ``keep_remote``.
        """
        if self.remote_dir is None:
            return {}
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        got: dict[str, int] = {}
        window = FINAL_WINDOW if final else RECONNECT_WINDOW
        try:
            sizes = self._retry(lambda: self.t.sizes(self.remote_dir), window, "listing of the agent directory")
            for name, size in sorted(sizes.items()):
                if name in NOT_FETCHED or ".tmp" in name:
                    continue
                if name not in REWRITTEN and self._sizes_seen.get(name) == size and (self.raw_dir / name).exists():
                    continue
                if name in REWRITTEN and self._sizes_seen.get(name) == size and not final and name != "status.json":
                    continue
                got[name] = self._fetch_file(name, size)
                self._sizes_seen[name] = size
        except TransportError as e:
            if final:
                raise AgentError(f"{e}; the data stays on the host in {self.remote_dir}") from None
            logger.warning("%s: fetch postponed: %s", self.label, e)
            self.fetches_postponed += 1
            if self.fetches_postponed == 1:
                self.warn(f"incremental fetch postponed at {time.time():.0f} ({self._bare(e)})")
            return got
        if final:
            self._verify()
        return got

    def _verify(self) -> None:
        mpath = self.raw_dir / "MANIFEST.json"
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError):
            raise AgentError(f"{self.label}: no readable MANIFEST.json fetched from {self.remote_dir} (was the agent stopped?)") from None
        files = manifest.get("files") or {}
        total = 0
        for name, m in files.items():
            if name in NOT_FETCHED:
                continue
            for attempt in range(2):
                local = self.raw_dir / name
                digest = _sha256(local) if local.exists() else None
                if digest == m.get("sha256"):
                    break
                if attempt == 0:
                    logger.warning("%s: %s does not match the manifest; fetching it again", self.label, name)
                    self._fetch_file(name, int(m.get("size") or 0), whole=True)
            else:
                raise AgentError(f"{self.label}: {name} does not match its sha256 in MANIFEST.json after a second fetch; "
                                 f"the data stays on the host in {self.remote_dir}")
            total += int(m.get("size") or 0)
        self.fetch_info = {"verified": True, "files": len(files), "bytes": total, "remote_dir": self.remote_dir,
                           "kept": bool(self.host.keep_remote)}
        logger.info("%s: %d files (%d bytes) verified against MANIFEST.json", self.label, len(files), total)
        if not self.host.keep_remote:
            try:
                self._retry(lambda: self.t.remove_tree(self.remote_dir), RECONNECT_WINDOW, "removal of the agent directory")
            except AgentError as e:
                logger.warning("%s: %s", self.label, e)

    def write_parsed(self) -> dict[str, Any]:
        """Parse the raw files into hosts/<host>/<table>.csv (master's clock); per-collector line counts."""
        names = list(self.selection.enabled) if self.selection else None
        self.parse_info = write_parsed_csvs(self.run, self.label, self.clock, names, interval=self.interval)
        return self.parse_info

    def meta(self) -> dict[str, Any]:
        """What meta.json["hosts"][label] should hold."""
        return {
            "transport": self.t.kind,
            "ssh": self.host.ssh,
            "jump": self.host.jump,
            "remote_dir": self.remote_dir,
            "pid": self.pid,
            "facts": self.facts_summary() if self.facts else None,
            "collectors": self.selection.to_dict() if self.selection else {},
            "warnings": self.warnings,
            "clock": {**self.clock.to_dict(), "errors": self.clock_errors},
            "stop": self.stop_info,
            "fetch": self.fetch_info,
            "parse": self.parse_info,
            "reconnects": self.reconnects,
            "heartbeat_failures": self.heartbeat_failures,
            "fetches_postponed": self.fetches_postponed,
            "warnings_dropped": self._warnings_dropped,
        }

    def close(self) -> None:
        self._stop_heartbeats()
        try:
            self.t.close()
        except Exception as e:  # closing must never raise over the real error
            logger.debug("%s: close: %s", self.label, e)

    def __enter__(self) -> HostAgent:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.started and not self.stopped:
            try:
                self.stop()
                self.fetch(final=True)
            except AgentError as e:
                logger.warning("%s: %s", self.label, e)
        self.close()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class HostAgents:
    """The agents of every monitored host of a run, driven together.

        with HostAgents.open(plan.hosts, run, interval, max_duration, heartbeat_timeout) as agents:
            run.update_meta(hosts_preflight=agents.preflight_all())
            agents.start_all()
            ... load ...; agents.fetch_all() now and then
            agents.finish_all()         # stop, verified fetch, parsed CSVs
            run.update_meta(hosts=agents.meta())
    """

    def __init__(self, agents: list[HostAgent]):
        self.agents = agents
        self.finished = False  # finish_all ran: never again (its retries are long)

    @classmethod
    def open(cls, hosts: Iterable[HostPlan], run: RunDir, interval: float = 1.0, max_duration: float = 3600.0,
             heartbeat_timeout: float = 30.0, accept_new_host_keys: bool = False,
             metrics_url: str | None = None) -> HostAgents:
        opened: list[HostAgent] = []
        try:
            for h in hosts:
                opened.append(open_agent(h, run, interval, max_duration, heartbeat_timeout,
                                         accept_new_host_keys, metrics_url))
        except BaseException:
            for a in opened:
                a.close()
            raise
        return cls(opened)

    def __iter__(self):
        return iter(self.agents)

    def __getitem__(self, label: str) -> HostAgent:
        for a in self.agents:
            if a.label == label:
                return a
        raise KeyError(label)

    def preflight_all(self) -> dict[str, Any]:
        """Facts per host; AgentError listing every host that cannot be monitored."""
        facts, errors = {}, []
        for a in self.agents:
            try:
                facts[a.label] = a.preflight()
            except AgentError as e:
                errors.append(str(e))
        if errors:
            raise AgentError("; ".join(errors))
        return facts

    def start_all(self) -> None:
        """Start every agent; if one fails, the ones started are stopped and AgentError is raised."""
        for a in self.agents:
            try:
                a.start()
            except AgentError:
                self.stop_all()
                raise

    def fetch_all(self) -> dict[str, dict[str, int]]:
        """An incremental fetch of every host; a host that fails is warned about and left for the next."""
        out = {}
        for a in self.agents:
            try:
                out[a.label] = a.fetch()
            except AgentError as e:
                logger.warning("%s", e)
                a.warn(f"incremental fetch failed: {a._bare(e)}")
        return out

    def stop_all(self) -> dict[str, Any]:
        out, errors = {}, []
        for a in self.agents:
            try:
                out[a.label] = a.stop()
            except AgentError as e:
                errors.append(str(e))
                logger.error("%s", e)
        if errors:
            out["errors"] = errors
        return out

    def finish_all(self) -> dict[str, Any]:
        """Stop, fetch (verified) and parse every host; errors are collected, never lose the others.

        Never raises for one host's failure: it is logged and kept in that host's warnings.
        """
        if self.finished:
            return self.meta()
        self.finished = True
        for a in self.agents:
            try:
                a.stop()
            except AgentError as e:
                a.warn(f"stop failed: {a._bare(e)}")
                logger.error("%s", e)
        for a in self.agents:
            try:
                a.fetch(final=True)
            except AgentError as e:
                a.warn(f"final fetch failed: {a._bare(e)}")
                logger.error("%s", e)
            try:
                a.write_parsed()
            except Exception as e:  # a parse failure must not cost the other hosts
                a.warn(f"parse failed: {e}")
                logger.error("%s: parse failed: %s", a.label, e)
        return self.meta()

    def meta(self) -> dict[str, Any]:
        return {a.label: a.meta() for a in self.agents}

    def close_all(self) -> None:
        for a in self.agents:
            a.close()

    def __enter__(self) -> HostAgents:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.finished and any(a.started and not a.stopped for a in self.agents):
            try:
                self.finish_all()
            except Exception as e:
                logger.error("stopping agents: %s", e)
        self.close_all()
