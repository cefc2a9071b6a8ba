"""In-process sampler of one process with psutil: used locally when pidstat is missing.

``PsutilSampler(pid, interval).sample()`` returns one sample in the procfs.jsonl format (see
``collectors.procfs``: cumulative counters, ``tasks`` per thread), so the same differencing code
turns samples into the canonical ``process`` and ``threads`` tables. Samples can be taken one by
one (``sample``), for a while (``collect``), or on a background thread (``start``/``stop``),
optionally appended as JSON lines to a file (a run directory's ``raw/procfs.jsonl``).

Context switches are summed over the threads (psutil's per-process figure on Linux is the main
thread's only); page faults come from /proc/PID/stat where it exists (NaN elsewhere).
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import IO

import pandas as pd
import psutil

from collectors.procfs import frames_from_samples

logger = logging.getLogger(__name__)

CLK_TCK = 100  # samples report cpu times in ticks of this rate (exact floats, any rate works)
#: Threads above which per-thread detail ("tasks") is skipped to keep one sample cheap.
MAX_TASKS = 512


def _faults(pid: int) -> tuple[float, float]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
        fields = data[data.rindex(")") + 2:].split()
        return float(fields[7]), float(fields[9])  # minflt, majflt (stat fields 10 and 12)
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan")


class PsutilSampler:
    """Samples one process (and its threads) every ``interval`` seconds."""

    def __init__(self, pid: int, interval: float = 1.0, tasks: bool = True) -> None:
        self.pid = int(pid)
        self.interval = float(interval)
        self.tasks = tasks
        self.samples: list[dict] = []
        self._proc = psutil.Process(self.pid)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._out: IO[str] | None = None

    def sample(self) -> dict | None:
        """One procfs-format sample, or None when the process is gone."""
        p = self._proc
        try:
            t = time.time()
            with p.oneshot():
                ct = p.cpu_times()
                mem = p.memory_info()
                threads = p.threads()
                vol, invol = p.num_ctx_switches()
            rec: dict = {"t": round(t, 6), "pid": self.pid, "utime": round(ct.user * CLK_TCK, 3),
                         "stime": round(ct.system * CLK_TCK, 3), "clk_tck": CLK_TCK,
                         "rss_kb": mem.rss // 1024, "vsz_kb": mem.vms // 1024,
                         "threads": len(threads), "ncpu": os.cpu_count()}
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        rec["minflt"], rec["majflt"] = _faults(self.pid)
        rec["vol_cs"], rec["invol_cs"] = vol, invol
        if self.tasks and len(threads) <= MAX_TASKS and hasattr(psutil.Process, "cpu_num"):
            tasks, svol, sinvol = [], 0, 0
            for th in threads:
                try:
                    q = psutil.Process(th.id)
                    cs = q.num_ctx_switches()
                    tasks.append([th.id, q.name(), round(th.user_time * CLK_TCK, 3),
                                  round(th.system_time * CLK_TCK, 3), q.cpu_num(), cs.voluntary,
                                  cs.involuntary])
                    svol += cs.voluntary
                    sinvol += cs.involuntary
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            if tasks:
                rec["tasks"] = tasks
                rec["vol_cs"], rec["invol_cs"] = svol, sinvol
        return rec

    def _take(self) -> dict | None:
        rec = self.sample()
        if rec is not None:
            self.samples.append(rec)
            if self._out is not None:
                self._out.write(json.dumps(rec) + "\n")
                self._out.flush()
        return rec

    def collect(self, duration: float) -> list[dict]:
        """Sample for ``duration`` seconds (blocking); returns the samples taken."""
        taken: list[dict] = []
        end = time.monotonic() + duration
        while True:
            start = time.monotonic()
            rec = self._take()
            if rec is None:
                break
            taken.append(rec)
            if start + self.interval > end:
                break
            time.sleep(max(0.0, self.interval - (time.monotonic() - start)))
        return taken

    def start(self, path: str | Path | None = None) -> None:
        """Sample on a background thread until ``stop``; append JSON lines to ``path`` if given."""
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        if path is not None:
            self._out = open(path, "a", encoding="utf-8")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"psutil-sampler-{self.pid}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            if self._take() is None:
                logger.info("process %d is gone; sampler stops", self.pid)
                return
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - start)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
            self._thread = None
        if self._out is not None:
            self._out.close()
            self._out = None

    def frames(self) -> dict[str, pd.DataFrame]:
        """The samples so far as canonical ``process`` and ``threads`` tables."""
        return frames_from_samples(self.samples)[0]
