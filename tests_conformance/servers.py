"""Real inference servers for the conformance suite: each installed by the suite itself into its
own cached directory (``$KNEESWARM_CONFORMANCE_CACHE``, default ~/.cache/kneeswarm-conformance/
<server>-<version>), reused when present, and started on loopback.

A server that cannot be installed FAILS its tests (``pytest.fail``), it is never skipped: a
conformance suite that silently tests nothing is worse than none.  Installs and builds run under
``nice`` (the suite shares two cores with other work), all side by side before the first test
(``install_side_by_side``, called by conftest.py); how long each cold install took is kept in the
cache directory's ``installed.json`` and printed with the figures.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests

CACHE = Path(os.environ.get("KNEESWARM_CONFORMANCE_CACHE", Path.home() / ".cache" / "kneeswarm-conformance"))
NICE = ["nice", "-n", "10"]
DEBIAN_PYTHON = "/usr/bin/python3.11"
BUILD_JOBS = 2  # the machine's two cores
INSTALL_TIMEOUT_S = 2400  # a cold llama.cpp build on 2 busy cores is minutes, not hours

# -- pinned versions -------------------------------------------------------------------------------
# llama.cpp: the source tree that the llama-cpp-python sdist carries (vendor/llama.cpp, ggml 0.25.3);
# only the `llama-server` target is built.  Its gguf-py writes the tiny model.
LLAMA_CPP_PYTHON = "0.3.36"
KSERVE = "0.21.0"  # KServe's Python model server (the version tests/fixtures/scrapes/ was recorded with)
TORCHSERVE = "0.12.0"  # with torch-model-archiver 0.12.0, pyyaml (imported, not declared) and Java 17 (Debian)
PYTRITON = "0.7.0"  # bundles tritonserver 2.51.0 (CPU; Python backend)
TORCH = "2.13.0"  # the CPU wheel this machine's pip takes from its own disk; any other torch is a CUDA build


@dataclass
class Installed:
    name: str
    version: str
    home: Path
    cold_s: float | None  # seconds the cold install took (None: not recorded)
    fresh: bool  # installed by this session (else reused from the cache)
    paths: dict[str, Path] = field(default_factory=dict)


def _run(cmd: list[str], log: Path, cwd: Path | None = None, timeout: float = INSTALL_TIMEOUT_S) -> None:
    with log.open("a") as f:
        f.write(f"$ {' '.join(map(str, cmd))}\n")
        f.flush()
        res = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if res.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        pytest.fail(f"installing failed ({' '.join(map(str, cmd[:6]))} ... exit {res.returncode}); log {log}:\n{tail}",
                    pytrace=False)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One installer at a time per cache directory (two suites on one machine share the cache)."""
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _installed(name: str, version: str, home: Path, paths: dict[str, Path], install) -> Installed:
    stamp = home / "installed.json"
    with _locked(home):
        if stamp.exists() and all(p.exists() for p in paths.values()):
            rec = json.loads(stamp.read_text())
            return Installed(name, version, home, rec.get("cold_s"), False, paths)
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        t0 = time.monotonic()
        install(home, home / "install.log")
        cold = round(time.monotonic() - t0, 1)
        missing = [str(p) for p in paths.values() if not p.exists()]
        if missing:
            pytest.fail(f"{name} {version} installed but {', '.join(missing)} missing (log {home / 'install.log'})",
                        pytrace=False)
        stamp.write_text(json.dumps({"name": name, "version": version, "cold_s": cold, "at": time.time()}))
        return Installed(name, version, home, cold, True, paths)


# -- llama.cpp -------------------------------------------------------------------------------------
def llama_cpp() -> Installed:
    """llama.cpp's `llama-server`, built from the llama-cpp-python sdist's vendor/llama.cpp."""
    home = CACHE / f"llama.cpp-{LLAMA_CPP_PYTHON}"
    src = home / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    paths = {"server": home / "build" / "bin" / "llama-server", "gguf_py": src / "gguf-py"}

    def install(home: Path, log: Path) -> None:
        _run([*NICE, sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
              "-d", str(home), f"llama-cpp-python=={LLAMA_CPP_PYTHON}"], log)
        with tarfile.open(home / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz") as tar:
            tar.extractall(home, filter="data")
        build = home / "build"
        # Only the server; no web UI (it would be fetched), no TLS.  A unity build (CMake batches each
        # target's sources into a few translation units: llama.cpp's common/ and server parse the same
        # heavy JSON and chat headers in every file) but for the files that cannot share a batch
        # (llama_unity.cmake): one cold build took 353 s of CPU instead of 479 (5.5 instead of 10 min
        # at nice 19 on two shared cores; docs/conformance.md).  x86-64-v3 code (AVX2, FMA, F16C)
        # rather than GGML_NATIVE: the cache may move to another machine of the kind, and without
        # SIMD (GGML_NATIVE=OFF alone is SSE2) a decode step is compute-bound, so continuous
        # batching would not scale at all.
        _run([*NICE, "cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
              "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_BMI2=ON", "-DLLAMA_BUILD_APP=OFF", "-DCMAKE_UNITY_BUILD=ON",
              f"-DCMAKE_PROJECT_INCLUDE={Path(__file__).with_name('llama_unity.cmake')}",
              "-DBUILD_SHARED_LIBS=OFF"], log)  # one binary, no build-tree RPATH: the cache may move
        _run([*NICE, "cmake", "--build", str(build), "--target", "llama-server", f"-j{BUILD_JOBS}"], log)

    return _installed("llama.cpp", LLAMA_CPP_PYTHON, home, paths, install)


# -- Python servers: a virtual environment of their own ---------------------------------------------
def venv(name: str, version: str, packages: list[str], python: str = sys.executable) -> Installed:
    """``packages`` pip-installed into CACHE/<name>-<version>/venv (made with ``python``)."""
    home = CACHE / f"{name}-{version}"
    paths = {"python": home / "venv" / "bin" / "python"}

    def install(home: Path, log: Path) -> None:
        _run([*NICE, python, "-m", "venv", str(home / "venv")], log)
        _run([*NICE, str(paths["python"]), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages], log)

    return _installed(name, version, home, paths, install)


def kserve() -> Installed:
    return venv("kserve", KSERVE, [f"kserve=={KSERVE}"])


def torchserve() -> Installed:
    if shutil.which("java") is None:
        pytest.fail("TorchServe needs Java (Debian: openjdk-17-jre-headless); `java` is not on PATH", pytrace=False)
    inst = venv("torchserve", TORCHSERVE, [f"torch=={TORCH}", f"torchserve=={TORCHSERVE}",
                                             f"torch-model-archiver=={TORCHSERVE}", "pyyaml"])
    inst.paths["torchserve"] = inst.home / "venv" / "bin" / "torchserve"
    inst.paths["archiver"] = inst.home / "venv" / "bin" / "torch-model-archiver"
    return inst


def pytriton() -> Installed:
    """nvidia-pytriton in a venv of Debian's own Python 3.11: its Python-backend stub links the
    system's libpython3.11, and a venv of another 3.11.x fails to load any model
    (tests/fixtures/scrapes/README.md)."""
    if not Path(DEBIAN_PYTHON).exists():
        pytest.fail(f"Triton's Python backend needs Debian's {DEBIAN_PYTHON} (package python3.11-venv)", pytrace=False)
    return venv("pytriton", PYTRITON, [f"nvidia-pytriton=={PYTRITON}"], python=DEBIAN_PYTHON)


@dataclass
class PytritonServer:
    server: "Server"
    http: int  # Triton's HTTP port (KServe v2), then gRPC and metrics
    grpc: int
    metrics: int


# pytriton 0.7.0 loads a model's instances side by side: the first starts a handshake server on a Unix
# socket (asyncio.start_unix_server), the others wait only for the socket's file to exist and connect --
# between its bind and its listen they are refused, and the model fails to load (proxy/model.py,
# proxy/communication.py get_config_from_handshake_server).  Seen once in six suite runs, on a loaded
# host.  The race is upstream's, so a start that failed with exactly that is tried once more.
HANDSHAKE_RACE = ("get_config_from_handshake_server", "Connection refused")


def pytriton_server(installed: Installed, args: list[str], health: str, home: Path) -> PytritonServer:
    """tests_conformance/pytriton_model.py started on free ports with ARGS after them (instances,
    service time, ...), healthy at HEALTH; again once if pytriton's handshake race stopped it."""
    for attempt in (1, 2):
        http, grpc, metrics = free_port(), free_port(), free_port()
        cmd = [str(installed.paths["python"]), str(Path(__file__).with_name("pytriton_model.py")),
               str(http), str(grpc), str(metrics), *args]
        try:
            return PytritonServer(Server(cmd, f"http://127.0.0.1:{http}", health, cwd=home), http, grpc, metrics)
        except pytest.fail.Exception as exc:
            if attempt == 2 or not all(s in str(exc) for s in HANDSHAKE_RACE):
                raise
            print(f"pytriton's handshake race stopped its start; starting it again: {str(exc).splitlines()[0]}")
    raise AssertionError("unreachable")


def install_side_by_side(installers: list[Callable[[], Installed]]) -> None:
    """Run ``installers`` (llama_cpp, kserve, ...) at once, a thread each, and wait for them all.

    A cold install is mostly a compile (llama.cpp: both cores) or pip's downloads (KServe's cold
    install used 27 s of CPU in 52 s with pip's cache warm, less of its time with the downloads to
    make): one beside the other, the pip installs take the time the build leaves.  Each stays under
    its cache directory's lock, so the test module's own call then finds it installed; one that
    failed here is only left to that call, which installs again and fails the module's tests with
    its own message.  All before the first test: no install competes with a measured run."""
    def quietly(install: Callable[[], Installed]) -> None:
        with contextlib.suppress(BaseException):  # pytest.fail's exception too: the module's call reports it
            install()

    threads = [threading.Thread(target=quietly, args=(i,), name=f"install-{i.__name__}") for i in installers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- a running server ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process with its output read line by line, each line stamped with the time it
    arrived (the test's clock = the master's clock: both are this machine's wall clock)."""

    def __init__(self, cmd: list[str], url: str, health: str, env: dict | None = None, cwd: Path | None = None):
        self.url, self.cmd = url, cmd
        # its own process group: a launcher's children (TorchServe's Java frontend and its Python
        # workers) are stopped with it
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", env=env, cwd=cwd, bufsize=1, start_new_session=True)
        self.pid = self.proc.pid
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._wait_healthy(health)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def _wait_healthy(self, path: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(requests.RequestException):
                if requests.get(self.url + path, timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        self.stop()
        log = "\n".join(line for _, line in self.lines[-40:])
        pytest.fail(f"{self.cmd[0]} did not become healthy at {self.url}{path}:\n{log}", pytrace=False)

    def log_text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def serving_pid(self, name: str) -> int:
        """The pid of the launched process's descendant whose name is NAME (e.g. TorchServe's java)."""
        import psutil

        for child in psutil.Process(self.pid).children(recursive=True):
            if child.name() == name:
                return child.pid
        pytest.fail(f"no {name!r} process under {self.cmd[0]} (pid {self.pid})", pytrace=False)

    def stop(self) -> None:
        import signal

        group = os.getpgid(self.pid) if self.proc.poll() is None else self.pid
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
            try:
                self.proc.wait(timeout=wait)
                time.sleep(0.5)  # children of the group (workers) end after the launcher
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, 0)
                    continue  # some of the group still runs: kill them
                break
            except subprocess.TimeoutExpired:
                continue
        self._reader.join(timeout=5)


def torchserve_server(ts: Installed, home: Path, handlers: dict[str, Path], workers: int,
                      more: str = "") -> tuple[Server, int]:
    """TorchServe started from HOME: each of HANDLERS (model name -> its handler file) archived into
    HOME/model_store and loaded with WORKERS workers a model, MORE added to config.properties (its
    gRPC ports); (the server, healthy on /ping, its Prometheus metrics port).  The workers may come up
    after /ping answers: each test waits for its own model."""
    (home / "model_store").mkdir()
    for name, handler in handlers.items():
        shutil.copy(handler, home / f"{name}_handler.py")
        subprocess.run([str(ts.paths["archiver"]), "--model-name", name, "--version", "1.0", "--handler",
                        f"{name}_handler.py", "--export-path", "model_store"], cwd=home, check=True, timeout=120)
    port, mport = free_port(), free_port()
    (home / "config.properties").write_text(
        f"inference_address=http://127.0.0.1:{port}\nmanagement_address=http://127.0.0.1:{free_port()}\n"
        f"metrics_address=http://127.0.0.1:{mport}\nmetrics_mode=prometheus\ndisable_token_authorization=true\n"
        f"install_py_dep_per_model=false\ndefault_workers_per_model={workers}\nmodel_store={home / 'model_store'}\n"
        f"load_models={','.join(f'{name}.mar' for name in handlers)}\n{more}")
    env = {"PATH": f"{ts.home / 'venv' / 'bin'}:/usr/bin:/bin", "LOG_LOCATION": str(home / "logs"),
           "METRICS_LOCATION": str(home / "logs"), "HOME": str(home),
           # TorchServe refuses to start while the pid in <tempdir>/.model_server.pid is a TorchServe: with
           # the shared /tmp, any other TorchServe on the machine (another suite's, another file's) is it
           "TMPDIR": str(home), "TEMP": str(home)}
    server = Server([str(ts.paths["torchserve"]), "--start", "--foreground", "--ncs", "--model-store", "model_store",
                     "--ts-config", "config.properties", "--disable-token-auth"],
                    f"http://127.0.0.1:{port}", "/ping", env=env, cwd=home)
    return server, mport
