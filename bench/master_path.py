"""The master's row path in one process, without the network: Locust's own msgpack message of a
worker report (as a worker sends it every 3 s) decoded, through clocks.ClockGate (clock offset)
and RequestWriter (step stamp, parquet part), as the master does on each report and flush.

    .venv/bin/python bench/master_path.py [--rows 30000] [--reports 10] [--repeats 3]

Prints the CPU time per row of each stage and the rows per CPU-second of the whole path (median
of --repeats): the per-row cost of the master, apart from Locust's own fixed cost per second
(heartbeats, stats), which bench/distributed.py measures with a real master and workers.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from locust.rpc.protocol import Message  # noqa: E402

from kneeswarm.contracts.rundir import RunDir  # noqa: E402
from kneeswarm.locustfiles import clocks  # noqa: E402
from kneeswarm.locustfiles.recorder import GEN_KEY, REPORT_KEY, RequestWriter, RowBuffer  # noqa: E402


class _Response:
    status_code = 200


def report_payload(rows: int, t0: float) -> bytes:
    """One worker report as Locust serialises it: ``rows`` successful requests from RowBuffer."""
    buf = RowBuffer()
    rng = random.Random(0)
    for i in range(rows):
        buf.on_request("POST", "infer", 20.0 + rng.random(), 1234, response=_Response(), start_time=t0 + i * 1e-4)
    data = {"stats": [], "errors": {}, REPORT_KEY: buf.take(), GEN_KEY: [(t0, 5.0, 100.0, 4, 0.1)]}
    return Message("stats", data, "worker-node").serialize()


def one_pass(payload: bytes, reports: int, t0: float) -> dict[str, float]:
    """CPU seconds of each stage over ``reports`` reports."""
    run = RunDir.create(tempfile.mkdtemp(prefix="kneeswarm-bench-master-"), "bench")
    wc = clocks.WorkerClocks()
    now = time.time()
    wc.answered("worker-0", {"t1": now - 0.001, "t2": now + 0.25})  # a worker 0.25 s ahead
    gate, writer = clocks.ClockGate(wc), RequestWriter(run, lambda: [(t0 - 1.0, 8)])
    cpu = dict.fromkeys(("decode", "gate", "stamp+parquet"), 0.0)
    for _ in range(reports):
        t = time.process_time()
        msg = Message.unserialize(payload)
        t1 = time.process_time()
        gate.admit("worker-0", msg.data.get(REPORT_KEY), msg.data.get(GEN_KEY))
        for worker, rows, _samples in gate.release():
            writer.add(worker, rows)
        t2 = time.process_time()
        writer.flush()
        t3 = time.process_time()
        cpu["decode"] += t1 - t
        cpu["gate"] += t2 - t1
        cpu["stamp+parquet"] += t3 - t2
    assert writer.rows_written == reports * len(msg.data[REPORT_KEY]["t_start"])
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=30_000, help="rows per report (3 s at 10,000 req/s)")
    ap.add_argument("--reports", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    payload = report_payload(a.rows, t0)
    passes = [one_pass(payload, a.reports, t0) for _ in range(a.repeats)]
    n = a.rows * a.reports
    print(f"{a.reports} reports of {a.rows:,} rows ({len(payload) / a.rows:.1f} bytes/row on the wire), "
          f"median of {a.repeats}:")
    for stage in passes[0]:
        print(f"  {stage}: {statistics.median(p[stage] for p in passes) / n * 1e6:.2f} us/row")
    rates = [n / sum(p.values()) for p in passes]
    print(f"master row path: {statistics.median(rates):,.0f} rows per CPU-second "
          f"(runs: {', '.join(f'{r:,.0f}' for r in rates)}; target >= 200,000)")


if __name__ == "__main__":
    main()
