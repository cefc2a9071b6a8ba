"""``preflight``: facts about the host (python, tools and their versions, CPU topology, memory,
GPUs) and the monitored process resolved from a pid, a command-line regex or a listening port,
with the processes of the service it stands for (its tree or its cgroup: tree.py)."""

import json
import os
import platform
import re
import select
import shutil
import signal
import socket
import subprocess
import time

from .common import wall_time, pause
from .defaults import AGENT_VERSION, CHECK_TIMEOUT, SCRIPT_FILE
from .files import read_json
from .processes import parent_pid
from .tree import ServiceTree

MEMBERS_SHOWN = 64  # pids of the service listed in the preflight's facts (member_count counts all)


def _run_capture(argv: "list[str]", timeout: float) -> "tuple[int | None, str]":
    """Run argv with stdout+stderr captured, bounded by ``timeout`` (killed after it).

    Written with select() and poll() rather than subprocess.run(timeout=...), which sleeps with
    clock_nanosleep (broken under libfaketime). Returns (exit code or None on timeout, text)."""
    p = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(os.environ, LC_ALL="C"), start_new_session=True,
    )
    out = b""
    deadline = time.monotonic() + timeout
    fd = p.stdout.fileno()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        if len(out) < 1 << 20:
            out += chunk
    while p.poll() is None and time.monotonic() < deadline:
        pause(0.02)
    rc = p.poll()
    if rc is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        while p.poll() is None:
            pause(0.02)
    p.stdout.close()
    return rc, out.decode("utf-8", "replace")


def _run_check(argv: "list[str]") -> dict:
    path = shutil.which(argv[0])
    if path is None:
        return {"found": False, "error": f"{argv[0]}: not found on PATH"}
    try:
        rc, out = _run_capture(argv, CHECK_TIMEOUT)
    except OSError as e:
        return {"found": True, "path": path, "error": f"{' '.join(argv)}: {e.strerror or e}"}
    if rc is None:
        return {"found": True, "path": path, "error": f"{' '.join(argv)}: no answer in {CHECK_TIMEOUT:g}s"}
    return {"found": True, "path": path, "rc": rc, "output": out[:4000]}


def _cpu_topology() -> dict:
    topo: dict = {"logical_cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    procs = [b for b in text.split("\n\n") if b.strip().startswith("processor") or "processor" in b]
    sockets, cores = set(), set()
    model = None
    for block in procs:
        kv = {}
        for line in block.splitlines():
            k, _, v = line.partition(":")
            kv[k.strip()] = v.strip()
        model = model or kv.get("model name") or kv.get("Model") or kv.get("cpu model")
        if "physical id" in kv:
            sockets.add(kv["physical id"])
            cores.add((kv["physical id"], kv.get("core id", kv.get("processor"))))
    if procs:
        topo["logical_cpus"] = len(procs)
    if sockets:
        topo["sockets"] = len(sockets)
        topo["physical_cores"] = len(cores)
    if shutil.which("lscpu"):
        try:
            out = _run_capture(["lscpu"], CHECK_TIMEOUT)[1]
            kv = {}
            for line in out.splitlines():
                k, _, v = line.partition(":")
                kv[k.strip()] = v.strip()

            def i(key):
                try:
                    return int(kv[key])
                except (KeyError, ValueError):
                    return None

            s, cps, tpc, n = i("Socket(s)"), i("Core(s) per socket"), i("Thread(s) per core"), i("CPU(s)")
            if s and cps:
                topo.setdefault("sockets", s)
                topo.setdefault("physical_cores", s * cps)
            if tpc:
                topo["threads_per_core"] = tpc
            if n:
                topo["logical_cpus"] = n
            model = model or kv.get("Model name")
            topo["source"] = "lscpu+cpuinfo"
        except OSError:
            pass
    if "threads_per_core" not in topo and topo.get("physical_cores"):
        topo["threads_per_core"] = max(1, topo["logical_cpus"] // topo["physical_cores"])
    topo["model"] = model
    return topo


def _memory_total_kb() -> "int | None":
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _gpus() -> "tuple[list[dict], dict]":
    gpus: list[dict] = []
    nvml: dict = {"available": False}
    if shutil.which("nvidia-smi"):
        try:
            rc, out = _run_capture(
                ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader,nounits"],
                CHECK_TIMEOUT * 2,
            )
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) == 4 and parts[0].isdigit():
                    gpus.append({"index": int(parts[0]), "name": parts[1], "memory_total_mb": _num(parts[2]),
                                 "driver": parts[3]})
        except OSError:
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            nvml = {"available": True, "driver": drv.decode() if isinstance(drv, bytes) else drv,
                    "count": pynvml.nvmlDeviceGetCount()}
            if not gpus:
                for i in range(nvml["count"]):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    name = pynvml.nvmlDeviceGetName(h)
                    gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                                 "memory_total_mb": pynvml.nvmlDeviceGetMemoryInfo(h).total // (1 << 20),
                                 "driver": nvml["driver"]})
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        nvml = {"available": False, "error": "pynvml is not importable"}
    except Exception as e:
        nvml = {"available": False, "error": f"{type(e).__name__}: {e}"}
    return gpus, nvml


def _num(text: str):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


def _cmdline(pid: int) -> "str | None":
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return None


def _ancestors() -> "set[int]":
    out, pid = set(), os.getpid()
    while pid and pid not in out:
        out.add(pid)
        pid = parent_pid(pid) or 0
    return out


def _pick_root(pids: "list[int]", what: str) -> "tuple[int | None, str | None]":
    """One process out of several: the one whose parent is not also a candidate."""
    if not pids:
        return None, f"no process {what}"
    cand = set(pids)
    roots = sorted(p for p in pids if parent_pid(p) not in cand)
    if len(roots) == 1:
        return roots[0], None
    shown = ", ".join(f"{p} ({(_cmdline(p) or '')[:60]})" for p in roots[:5])
    return None, f"{len(roots)} unrelated processes {what}: {shown}; give pid = ... to choose one"


def _listening_inodes(port: int) -> "set[str]":
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != "0A":  # 0A = LISTEN
                        continue
                    if int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(parts[9])
        except (OSError, ValueError):
            continue
    return inodes


def resolve_process(pid=None, process=None, port=None) -> dict:
    if pid is not None:
        cmd = _cmdline(int(pid))
        if cmd is None:
            return {"error": f"no process with pid {pid}"}
        return {"pid": int(pid), "cmdline": cmd, "by": "pid"}
    me = _ancestors()
    if process is not None:
        try:
            rx = re.compile(process)
        except re.error as e:
            return {"error": f"process regex {process!r} is invalid: {e}"}
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in me:
                continue
            cmd = _cmdline(int(name))
            if cmd and SCRIPT_FILE not in cmd and rx.search(cmd):
                found.append(int(name))
        got, err = _pick_root(found, f"matching {process!r}")
        if err:
            return {"error": err, "candidates": sorted(found)}
        return {"pid": got, "cmdline": _cmdline(got), "by": "process", "candidates": sorted(found)}
    if port is not None:
        inodes = _listening_inodes(int(port))
        if not inodes:
            return {"error": f"nothing listens on TCP port {port}"}
        targets = {f"socket:[{i}]" for i in inodes}
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            fd_dir = f"/proc/{name}/fd"
            try:
                for fd in os.listdir(fd_dir):
                    try:
                        if os.readlink(f"{fd_dir}/{fd}") in targets:
                            found.append(int(name))
                            break
                    except OSError:
                        continue
            except OSError:
                continue
        got, err = _pick_root(found, f"listening on TCP port {port}")
        if err:
            if not found:
                err = f"TCP port {port} is listening but its process is not visible (run as its user or root)"
            return {"error": err, "candidates": sorted(found)}
        return {"pid": got, "cmdline": _cmdline(got), "by": "port", "candidates": sorted(found)}
    return {"pid": None, "by": None}


def service(found: dict, scope: "str | None", port=None) -> dict:
    """The process found, with the service it stands for (tree.py): ``scope`` (the one in effect),
    ``members`` (the pids that are the service now), ``cgroup`` (the group read, cgroup scope)
    and ``note`` (why the processes are not quite what the scope asked)."""
    if found.get("pid") is None:
        return found
    tree = ServiceTree(found["pid"], scope, port if found.get("by") == "port" else None, identify=False)
    members = sorted(tree.scan())
    out = dict(found, scope=tree.watched_scope, members=members[:MEMBERS_SHOWN], member_count=len(members))
    if tree.group is not None:
        out["cgroup"] = tree.group
    if tree.note:
        out["note"] = tree.note
    return out


def cmd_preflight(arg: "str | None") -> int:
    cfg: dict = {}
    if arg:
        cfg = json.loads(arg) if arg.lstrip().startswith("{") else (read_json(arg) or {})
    gpus, nvml = _gpus() if cfg.get("gpus", True) else ([], {"available": False})
    facts = {
        "ok": True,
        "agent_version": AGENT_VERSION,
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "time": wall_time(),
        "tools": {name: _run_check(list(argv)) for name, argv in (cfg.get("checks") or {}).items() if argv},
        "cpu": _cpu_topology(),
        "memory_total_kb": _memory_total_kb(),
        "gpus": gpus,
        "nvml": nvml,
        "procfs": os.path.isdir("/proc/self"),
        "process": service(resolve_process(cfg.get("pid"), cfg.get("process"), cfg.get("port")), cfg.get("scope"),
                           cfg.get("port")),
    }
    print(json.dumps(facts))
    return 0
