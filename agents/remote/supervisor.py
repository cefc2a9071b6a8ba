"""The agent daemon: ``start`` forks it, it starts every collector (commands in their own
sessions, samplers as threads), follows the heartbeat file, rewrites status.json, and stops
everything on a lost heartbeat, max_duration, a signal or ``stop``; then writes MANIFEST.json."""

import json
import os
import platform
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

from .cgroup import CgroupSampler
from .common import log_line, wall_time, pause
from .defaults import (AGENT_VERSION, HEARTBEAT_FILE, HEARTBEAT_TIMEOUT, INTERVAL, LOG_FILE, LOOP_PERIOD, MANIFEST_FILE,
                       MAX_DURATION, MAX_DURATION_CAP, PID_FILE, START_SETTLE, START_WAIT, STATUS_FILE, STATUS_PERIOD,
                       STOP_GRACE, STOP_WAIT)
from .files import file_key, read_json, file_size, touch, unlink_quietly, write_json_atomic, write_text_atomic, write_manifest
from .processes import child_setup, is_ours, proc_start_time, stop_groups
from .prometheus import PrometheusSampler
from .samplers import FdSampler, NvmlSampler, ProcfsSampler, Sampler


#: The samplers this agent implements, by the name a collector's ``sampler`` gives.
SAMPLERS: "dict[str, type[Sampler]]" = {"procfs": ProcfsSampler, "nvml": NvmlSampler, "prometheus": PrometheusSampler,
                                        "cgroup": CgroupSampler, "fds": FdSampler}


class Agent:
    def __init__(self, run_dir: str, cfg: dict):
        self.dir = run_dir
        self.cfg = cfg
        self.interval = float(cfg.get("interval", INTERVAL))
        self.heartbeat_timeout = float(cfg.get("heartbeat_timeout", HEARTBEAT_TIMEOUT))
        self.max_duration = min(float(cfg.get("max_duration", MAX_DURATION)), MAX_DURATION_CAP)
        self.stopping = threading.Event()
        self.reason: str | None = None
        self.commands: dict[str, dict] = {}
        self.samplers: dict[str, Sampler] = {}
        self.sampler_errors: dict[str, str] = {}
        self.started = wall_time()
        self.my_start = proc_start_time(os.getpid())

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _on_signal(self, signum, frame) -> None:
        if self.reason is None:
            if signum == signal.SIGUSR1:
                self.reason = "controller gone (its watch channel closed)"
            else:
                self.reason = f"signal {signal.Signals(signum).name}"
        self.stopping.set()

    # status.json ----------------------------------------------------------------------------
    def _command_status(self, c: dict) -> dict:
        p = c.get("proc")
        rc = p.poll() if p is not None else c.get("exit_code")
        if p is not None:
            c["exit_code"] = rc
        return {"kind": "command", "argv": c["argv"], "raw_file": c["raw_file"], "pid": c.get("pid"),
                "start_time": c.get("start_time"), "running": p is not None and rc is None, "exit_code": rc,
                "error": c.get("error"), "bytes": file_size(self.path(c["raw_file"]))}

    def snapshot(self, state: str) -> dict:
        col = {name: self._command_status(c) for name, c in self.commands.items()}
        for name, s in self.samplers.items():
            col[name] = {"kind": "sampler", "raw_file": os.path.basename(s.path), "running": s.is_alive(),
                         "error": s.error, "lines": s.lines, "bytes": file_size(s.path)}
        for name, err in self.sampler_errors.items():
            col.setdefault(name, {"kind": "sampler", "running": False, "error": err, "bytes": 0})
        return {"agent_version": AGENT_VERSION, "agent_pid": os.getpid(), "agent_start_time": self.my_start,
                "state": state, "reason": self.reason, "started": self.started, "updated": wall_time(),
                "collectors": col}

    def write_status(self, state: str) -> dict:
        st = self.snapshot(state)
        write_json_atomic(self.path(STATUS_FILE), st)
        return st

    # collectors -----------------------------------------------------------------------------
    def start_command(self, spec: dict, preexec) -> None:
        name, raw = spec["name"], spec["raw_file"]
        c = {"argv": list(spec["argv"]), "raw_file": raw}
        self.commands[name] = c
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
        try:
            with open(self.path(raw), "ab") as out, open(self.path(f"{name}.err"), "ab") as err:
                p = subprocess.Popen(c["argv"], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                     cwd=self.dir, start_new_session=True, preexec_fn=preexec)
        except OSError as e:
            c["error"] = f"cannot start {c['argv'][0]}: {e.strerror or e}"
            c["exit_code"] = 127
            log_line(f"{name}: {c['error']}")
            return
        c.update(proc=p, pid=p.pid, start_time=proc_start_time(p.pid))
        log_line(f"{name}: started pid {p.pid}: {' '.join(c['argv'])}")

    def start_sampler(self, spec: dict) -> None:
        name = spec["name"]
        cls = SAMPLERS.get(spec["sampler"])
        if cls is None:
            self.sampler_errors[name] = f"unknown sampler {spec['sampler']!r} (this agent has {', '.join(SAMPLERS)})"
            return
        try:
            s = cls(name, self.path(spec["raw_file"]), float(spec.get("interval", self.interval)), self.stopping,
                    **(spec.get("params") or {}))
            s.setup()
        except Exception as e:
            self.sampler_errors[name] = f"{type(e).__name__}: {e}"
            log_line(f"{name}: not started: {self.sampler_errors[name]}")
            return
        self.samplers[name] = s
        s.start()
        log_line(f"{name}: sampler started")

    def start_collectors(self) -> None:
        preexec = child_setup()
        for spec in self.cfg.get("collectors", []):
            if spec.get("argv") is not None:
                self.start_command(spec, preexec)
            else:
                self.start_sampler(spec)

    def stop_collectors(self) -> None:
        self.stopping.set()
        live = [c for c in self.commands.values() if c.get("proc") is not None]
        stop_groups([(c["pid"], c["start_time"]) for c in live])
        for c in live:
            c["exit_code"] = c["proc"].poll()
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(s.is_alive() for s in self.samplers.values()):
            pause(0.05)

    # the watchdog ---------------------------------------------------------------------------
    def _why_stop(self, t0: float, beat_at: float, now: float) -> "str | None":
        if now - beat_at > self.heartbeat_timeout:
            return f"heartbeat lost ({now - beat_at:.1f}s > {self.heartbeat_timeout:g}s)"
        if now - t0 > self.max_duration:
            return f"max_duration ({self.max_duration:g}s) reached"
        return None

    def watch(self) -> None:
        """Until stopped: follow the heartbeat file, rewrite status.json now and then."""
        t0 = time.monotonic()
        beat_key, beat_at = file_key(self.path(HEARTBEAT_FILE)), t0
        last_status = t0
        while not self.stopping.is_set():
            pause(LOOP_PERIOD)
            now = time.monotonic()
            key = file_key(self.path(HEARTBEAT_FILE))
            if key != beat_key:
                beat_key, beat_at = key, now
            self.reason = self.reason or self._why_stop(t0, beat_at, now)
            if self.reason:
                break
            if now - last_status >= STATUS_PERIOD:
                self.write_status("running")
                last_status = now

    def run(self, ready_fd: "int | None") -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        write_text_atomic(self.path(PID_FILE), f"{os.getpid()} {self.my_start}\n")
        touch(self.path(HEARTBEAT_FILE))
        try:
            self.start_collectors()
            pause(START_SETTLE)
            st = self.write_status("running")
            _report(ready_fd, {"ok": True, "status": st})
            ready_fd = None  # sent and closed
            self.watch()
        except Exception as e:
            self.reason = self.reason or f"agent error: {type(e).__name__}: {e}"
            log_line(traceback.format_exc())
            _report(ready_fd, {"ok": False, "error": self.reason})
        finally:
            self.reason = self.reason or "stopped"
            log_line(f"stopping: {self.reason}")
            self.stop_collectors()
            self.write_status("stopped")
            write_manifest(self.dir)
            unlink_quietly(self.path(PID_FILE))
            log_line("stopped")
        return 0


def _report(fd: "int | None", msg: dict) -> None:
    """Send ``start`` its one-line answer through the ready pipe, and close it: once."""
    if fd is not None:
        os.write(fd, json.dumps(msg).encode() + b"\n")
        os.close(fd)


def _read_pidfile(run_dir: str) -> "tuple[int | None, int | None]":
    try:
        with open(os.path.join(run_dir, PID_FILE)) as f:
            parts = f.read().split()
        return int(parts[0]), int(parts[1])
    except (OSError, ValueError, IndexError):
        return None, None


def agent_alive(run_dir: str) -> "tuple[bool, int | None, int | None]":
    pid, start = _read_pidfile(run_dir)
    return is_ours(pid, start), pid, start


def _fail(msg: str, code: int = 2) -> int:
    print(json.dumps({"ok": False, "error": msg}))
    return code


def _daemon(run_dir: str, cfg: dict, w: int) -> None:
    """The forked child of ``start``: detach, log to agent.log, run the agent; never returns."""
    code = 1
    try:
        os.setsid()
        os.chdir(run_dir)
        devnull = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(run_dir, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd, src in ((0, devnull), (1, log), (2, log)):
            os.dup2(src, fd)
        os.close(devnull)
        os.close(log)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        log_line(f"agent {AGENT_VERSION} pid {os.getpid()} python {platform.python_version()} in {run_dir}")
        code = Agent(run_dir, cfg).run(w)
    except BaseException:
        try:
            log_line(traceback.format_exc())
        except Exception:
            pass
    finally:
        os._exit(code)


def _read_message(fd: int, timeout: float) -> bytes:
    """One newline-terminated message from ``fd`` within ``timeout`` (b"" if none came)."""
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        if buf.endswith(b"\n"):
            break
    return buf


def cmd_start(cfg_path: str) -> int:
    cfg_path = os.path.abspath(cfg_path)
    run_dir = os.path.dirname(cfg_path)
    cfg = read_json(cfg_path)
    if not isinstance(cfg, dict):
        return _fail(f"{cfg_path}: not a readable JSON object")
    alive, pid, _ = agent_alive(run_dir)
    if alive:
        return _fail(f"an agent (pid {pid}) is already running in {run_dir}")
    unlink_quietly(os.path.join(run_dir, MANIFEST_FILE))
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        _daemon(run_dir, cfg, w)
    os.close(w)
    buf = _read_message(r, START_WAIT)
    os.close(r)
    try:
        msg = json.loads(buf.decode())
    except ValueError:
        tail = ""
        try:
            with open(os.path.join(run_dir, LOG_FILE)) as f:
                tail = "".join(f.read()[-300:].strip().splitlines()[-1:])  # its last line, not a list's repr
        except OSError:
            pass
        return _fail(f"agent did not report ready within {START_WAIT:g}s {tail}")
    print(json.dumps(msg))
    return 0 if msg.get("ok") else 1


def cmd_stop(run_dir: str) -> int:
    run_dir = os.path.abspath(run_dir)
    killed = []
    alive, pid, start = agent_alive(run_dir)
    if alive:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        while time.monotonic() < deadline and is_ours(pid, start):
            pause(0.05)
        if is_ours(pid, start):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            pause(0.1)
    # whatever the agent left behind (it was killed, or died): collectors still ours
    st = read_json(os.path.join(run_dir, STATUS_FILE)) or {}
    groups = [(c.get("pid"), c.get("start_time")) for c in (st.get("collectors") or {}).values() if c.get("pid")]
    left = [p for p, s in groups if is_ours(p, s)]
    stop_groups(groups)
    killed += left
    unlink_quietly(os.path.join(run_dir, PID_FILE))
    st = read_json(os.path.join(run_dir, STATUS_FILE)) or {}
    manifest = write_manifest(run_dir)
    print(json.dumps({"ok": True, "reason": st.get("reason"), "status": st, "killed": killed, "manifest": manifest}))
    return 0
