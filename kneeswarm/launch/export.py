"""Live export: kneeswarm's figures as OpenTelemetry instruments and on a Prometheus endpoint.

The figures are kneeswarm.analysis.measure.live's, read from the run directory (so the master that writes it and
the conductor after the master has gone serve the same ones):

    kneeswarm_step / .step            the current step's index
    kneeswarm_step_users              its users (open loop: arrival sources)
    kneeswarm_step_rate               open loop: its arrivals/s
    kneeswarm_step_qps{step,users}    per step: successful requests/s over its steady window
    kneeswarm_step_p99_ms{...}        per step: P99 of the successful rows, ms
    kneeswarm_step_requests{...}      per step: rows in the steady window so far
    kneeswarm_step_final{...}         1 once the step's figures are final (equal summary.json's)
    kneeswarm_host_sample{host,table,column,id}   the latest sample of each monitored host
    kneeswarm_finding{id,severity}    1 per finding, once the report is written
    kneeswarm_knee_users{kind}, kneeswarm_knee_qps{kind}   knee, latency_knee, peak (same)
    kneeswarm_run_done                1 once the report is written
    kneeswarm_late_rows               rows that reached a step after its figures were final

Every series carries ``run_id``.  OpenTelemetry names are the same with dots
(``kneeswarm.step.p99_ms``); the instruments are observable gauges on the global meter
provider, the one Locust's ``--otel`` sets up from the OTEL_* environment, so they leave with
Locust's own ``locust.client.duration`` and ``locust.users.count`` over the same exporter.

The Prometheus endpoint is opt-in (``--kneeswarm-prometheus [HOST:]PORT``; loopback unless a
host is given) and served by prometheus_client's own HTTP server (a thread; a greenlet in Locust's
patched process).  ``--kneeswarm-prometheus-linger S`` keeps it up S seconds after the report, so
that the last scrape sees the final figures and the findings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from kneeswarm.contracts.rundir import RunDir

if TYPE_CHECKING:  # imported where used: a worker, or a master that exports nothing, never loads analysis
    from kneeswarm.analysis.measure.live import Figures, LiveRun

logger = logging.getLogger(__name__)

SNAPSHOT_S = 0.5  # a scrape and the OTel callbacks of one collection share a snapshot this young
#: a snapshot is also kept 1/MAX_BUSY_SHARE times as long as it took, so that however often it is
#: scraped the export holds the master's loop at most this share of the time (a 1M-row step: ~0.1 s)
MAX_BUSY_SHARE = 0.05
MAX_SNAPSHOT_S = 2.0  # ... but never older than this (a linger of a few seconds sees the final figures)
DEFAULT_HOST = "127.0.0.1"
KNEE_KINDS = ("knee", "latency_knee", "peak")

#: name -> (labels, help, unit)
METRICS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "step": ((), "index of the current step", "1"),
    "step_users": ((), "users of the current step (open loop: arrival sources)", "{user}"),
    "step_rate": ((), "open loop: arrivals/s of the current step", "{request}/s"),
    "step_qps": (("step", "users"), "successful requests/s over the step's steady window", "{request}/s"),
    "step_p99_ms": (("step", "users"), "P99 latency of the step's successful requests", "ms"),
    "step_requests": (("step", "users"), "requests in the step's steady window so far", "{request}"),
    "step_final": (("step", "users"), "1 once the step's figures are final", "1"),
    "host_sample": (("host", "table", "column", "id"), "latest sample of a monitored host's table", "1"),
    "finding": (("id", "severity"), "1 per finding of the report", "1"),
    "knee_users": (("kind",), "users at the knee, latency knee or peak of the report", "{user}"),
    "knee_qps": (("kind",), "QPS at the knee or peak of the report", "{request}/s"),
    "run_done": ((), "1 once the run's report is written", "1"),
    "late_rows": ((), "rows that reached a step after its figures were final", "{request}"),
}

Series = tuple[str, dict[str, str], float]  # (METRICS name, labels, value)


class ExportError(ValueError):
    """A bad export option; str() is the one-line message."""


def parse_address(text: str, flag: str = "--kneeswarm-prometheus") -> tuple[str, int]:
    """"PORT", "HOST:PORT" or "[V6]:PORT" -> (host, port); loopback when no host is given."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    host = host.strip("[]") if sep else DEFAULT_HOST
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535 or (sep and not host):
        raise ExportError(f"{flag}: want PORT or HOST:PORT, got {text!r}")
    return host, number


@dataclass
class ExportOptions:
    """`kneeswarm run` / `demo`'s export flags: what the conductor passes to Locust, and does itself
    once the master has gone (the analysis, so the findings, comes after it)."""

    otel: bool = False  # Locust's --otel on the master and the local workers; the final figures pushed after the analysis
    prometheus: str = ""  # [HOST:]PORT of the master's endpoint ("" = none)
    linger: float = 0.0  # seconds the conductor serves the final figures on that address after the analysis

    def check(self) -> ExportOptions:
        """ExportError (one line) for a bad or taken address, before anything is started or recorded."""
        if self.prometheus:
            _check_free(*parse_address(self.prometheus, "--prometheus"), f"--prometheus {self.prometheus}")
        if self.linger < 0:
            raise ExportError(f"--prometheus-linger must be >= 0 seconds, got {self.linger:g}")
        return self

    def master_args(self) -> list[str]:
        return (["--otel"] if self.otel else []) + (["--kneeswarm-prometheus", self.prometheus] if self.prometheus else [])

    def worker_args(self) -> list[str]:
        return ["--otel"] if self.otel else []

    def after_run(self, run: RunDir) -> list[str]:
        """The final figures (findings included) out, once the run is analysed; one line per failure."""
        problems = []
        if self.otel and (error := push_otlp(run)):
            problems.append(f"OpenTelemetry: {error}")
        if self.prometheus and self.linger > 0:
            try:
                server = serve_prometheus(self.prometheus, Exporter(lambda: run), "--prometheus")
            except ExportError as e:
                return problems + [str(e)]
            time.sleep(self.linger)
            server.shutdown()
            server.server_close()
        return problems


def _check_free(host: str, port: int, what: str) -> None:
    """The address can be listened on now (the master binds it a few seconds later)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as e:
        raise ExportError(f"{what}: cannot listen on {host}:{port}: {e.strerror or e}") from None


def series(fig: Figures) -> list[Series]:
    """The figures as (name, labels, value) triples, the same for Prometheus and OpenTelemetry."""
    out: list[Series] = []
    cur = fig.current
    if cur is not None:
        out += [("step", {}, cur.index), ("step_users", {}, cur.users)]
        if cur.rate is not None:
            out.append(("step_rate", {}, cur.rate))
    for s in fig.steps:
        labels = {"step": str(s.index), "users": str(s.users)}
        out += [("step_requests", labels, s.requests), ("step_final", labels, 1.0 if s.final else 0.0)]
        out += [(name, labels, v) for name, v in (("step_qps", s.qps), ("step_p99_ms", s.p99_ms)) if v is not None]
    out += [("host_sample", {"host": h.host, "table": h.table, "column": h.column, "id": h.id}, h.value)
            for h in fig.hosts]
    out += [("finding", {"id": str(f.get("id")), "severity": str(f.get("severity") or "")}, 1.0) for f in fig.findings]
    for kind in KNEE_KINDS:
        k = fig.knee.get(kind) or {}
        out += [(name, {"kind": kind}, float(v)) for name, v in (("knee_users", k.get("users")), ("knee_qps", k.get("qps")))
                if isinstance(v, (int, float))]
    out += [("run_done", {}, 1.0 if fig.done else 0.0), ("late_rows", {}, fig.late_rows)]
    run = {"run_id": fig.run_id}
    return [(name, {**run, **labels}, float(v)) for name, labels, v in out]


class Exporter:
    """The figures of the run ``run_of()`` names (it changes with each test in the web UI)."""

    def __init__(self, run_of: Callable[[], RunDir | None]):
        self.run_of = run_of
        self._live: LiveRun | None = None
        self._snap: list[Series] = []
        self._when = 0.0
        self._keep = SNAPSHOT_S
        self._lock = threading.Lock()  # the conductor's HTTP server answers on threads

    def invalidate(self) -> None:
        """The next look reads the run directory again (the report was just written)."""
        with self._lock:
            self._when = 0.0

    def series(self) -> list[Series]:
        with self._lock:
            if time.monotonic() - self._when < self._keep:
                return self._snap
            run = self.run_of()
            if run is None:
                return []
            if self._live is None or self._live.run.path != run.path:
                from kneeswarm.analysis.measure.live import LiveRun

                self._live = LiveRun(run)
            start = time.monotonic()
            try:
                self._snap = series(self._live.figures())
            except Exception as e:  # noqa: BLE001 - an export must never end a run; the last snapshot stays
                logger.warning("kneeswarm export: %s", e)
            self._when = time.monotonic()
            self._keep = min(MAX_SNAPSHOT_S, max(SNAPSHOT_S, (self._when - start) / MAX_BUSY_SHARE))
            return self._snap


# -- Prometheus ----------------------------------------------------------------------------------
class PrometheusCollector:
    """A prometheus_client custom collector over an Exporter."""

    def __init__(self, exporter: Exporter):
        self.exporter = exporter

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        by_name: dict[str, list[Series]] = defaultdict(list)
        for s in self.exporter.series():
            by_name[s[0]].append(s)
        for name, (labels, help_text, _unit) in METRICS.items():
            family = GaugeMetricFamily(f"kneeswarm_{name}", help_text, labels=["run_id", *labels])
            for _, values, v in by_name.get(name, []):
                family.add_metric([values.get(k, "") for k in ("run_id", *labels)], v)
            yield family


def serve_prometheus(address: str, exporter: Exporter, flag: str = "--kneeswarm-prometheus") -> Any:
    """Start the endpoint (GET /metrics) on ``address``; returns the server (``shutdown()``).
    ExportError (one line) when the address is bad or taken."""
    from prometheus_client import CollectorRegistry, start_http_server

    host, port = parse_address(address, flag)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(exporter))
    try:
        server, _ = start_http_server(port, host, registry)
    except OSError as e:
        raise ExportError(f"{flag} {address}: cannot listen on {host}:{port}: {e.strerror or e}") from None
    logger.info("kneeswarm: Prometheus endpoint on http://%s:%d/metrics", host, server.server_port)
    return server


# -- OpenTelemetry -------------------------------------------------------------------------------
def register_otel(exporter: Exporter, meter: Any = None) -> bool:
    """kneeswarm's observable gauges on ``meter`` (default: the global provider's, which Locust's
    --otel configured); False when the OpenTelemetry API is not installed."""
    try:
        from opentelemetry import metrics
    except ImportError:
        logger.error("kneeswarm: OpenTelemetry is not installed (pip install 'kneeswarm[otel]'): no kneeswarm instruments")
        return False
    meter = meter or metrics.get_meter("kneeswarm")
    for name, (_labels, help_text, unit) in METRICS.items():
        meter.create_observable_gauge(otel_name(name), callbacks=[_callback(exporter, name, metrics.Observation)], unit=unit,
                                      description=help_text)
    return True


def otel_name(name: str) -> str:
    """The OpenTelemetry name of a METRICS entry: "step_p99_ms" -> "kneeswarm.step.p99_ms"."""
    head, _, rest = name.partition("_")
    return f"kneeswarm.{head}.{rest}" if rest else f"kneeswarm.{head}"


def _callback(exporter: Exporter, name: str, observation: Any) -> Callable[[Any], Iterable[Any]]:
    def observe(_options: Any) -> Iterable[Any]:
        return [observation(v, labels) for n, labels, v in exporter.series() if n == name]
    return observe


def push_otlp(run: RunDir) -> str | None:
    """One export of a finished run's figures (its findings included) over OTLP, configured by
    the OTEL_* environment as Locust's --otel is (OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL, _ENDPOINT);
    the conductor's, after the analysis the master never sees.  Returns an error line or None."""
    import os

    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        return "OpenTelemetry is not installed (pip install 'kneeswarm[otel]')"
    protocol = os.getenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", os.getenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")).lower()
    try:
        if protocol == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    except ImportError:
        return f"the OTLP exporter for {protocol} is not installed (pip install 'kneeswarm[otel]')"
    reader = InMemoryMetricReader()  # one collection, exported once: its result is known
    resource = Resource.create({"service.name": os.getenv("OTEL_SERVICE_NAME", "kneeswarm")})
    provider = MeterProvider(resource=resource, metric_readers=[reader], shutdown_on_exit=False)
    register_otel(Exporter(lambda: run), provider.get_meter("kneeswarm"))
    exporter = OTLPMetricExporter()
    try:
        result = exporter.export(reader.get_metrics_data())
    finally:
        exporter.shutdown()
        provider.shutdown()
    return None if result == MetricExportResult.SUCCESS else "the OTLP export of the final figures failed"


# -- inside Locust (locustfiles/plugin.py) -------------------------------------------------------
def add_locust_arguments(parser: Any) -> None:
    parser.add_argument("--kneeswarm-prometheus", default="", metavar="[HOST:]PORT", include_in_web_ui=False,
                        help="serve kneeswarm's live figures for Prometheus on this port (loopback unless HOST is given)")
    parser.add_argument("--kneeswarm-prometheus-linger", type=float, default=0.0, metavar="SECONDS",
                        include_in_web_ui=False,
                        help="keep the Prometheus endpoint up this long after the report (the last scrape sees it)")


class LocustExport:
    """The master's (or local runner's) export.  Made before the plugin's listeners: Locust fires
    ``quitting`` in reverse order of registration, so the linger here comes after their report."""

    def __init__(self, env: Any):
        from kneeswarm.contracts.outcome import EXIT_BAD_INPUT

        opts = env.parsed_options
        self._run_of: Callable[[], RunDir | None] = lambda: None
        self.exporter = Exporter(lambda: self._run_of())
        self.linger = float(getattr(opts, "kneeswarm_prometheus_linger", 0.0) or 0.0) if opts else 0.0
        address = str(getattr(opts, "kneeswarm_prometheus", "") or "") if opts else ""
        try:
            if self.linger < 0:
                raise ExportError(f"--kneeswarm-prometheus-linger must be >= 0 seconds, got {self.linger:g}")
            self.server = serve_prometheus(address, self.exporter) if address else None
        except ExportError as e:
            logger.error("kneeswarm: %s", e)
            raise SystemExit(EXIT_BAD_INPUT) from None
        if opts is not None and getattr(opts, "otel", False):
            register_otel(self.exporter)
        env.events.quitting.add_listener(self.on_quitting)

    def follow(self, run_of: Callable[[], RunDir | None]) -> None:
        """Where the current test's run directory is (the plugin's recording)."""
        self._run_of = run_of

    def on_quitting(self, **_kw: Any) -> None:
        self.exporter.invalidate()  # the report is written: the endpoint and OTel's last export at exit see it
        if self.server is not None and self.linger > 0:
            logger.info("kneeswarm: Prometheus endpoint stays up %.0f s (--kneeswarm-prometheus-linger)", self.linger)
            time.sleep(self.linger)  # gevent's sleep in Locust: the endpoint keeps answering
