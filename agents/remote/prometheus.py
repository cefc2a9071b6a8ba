"""The one Prometheus scraper: GET a /metrics URL with the standard library (http.client, ssl) and
turn the answer into the line both scrapers write to prometheus.jsonl -- the agent's sampler on a
monitored host and the controller's scraper of the target's metrics_url
(collectors/prometheus.py's ``PrometheusScraper``), so the format, the caps and the error wording
are one::

    {"t": 1796002084.5, "url": "http://127.0.0.1:8000/metrics", "text": "<exposition text>"}
    {"t": 1796002085.5, "url": "http://127.0.0.1:8000/metrics", "error": "timed out after 0.8s"}

A scrape is bounded: ``connect_timeout`` to connect, ``timeout`` for the whole answer, at most
PROMETHEUS_MAX_BYTES (a bigger one is a failed scrape, never a cut one).  ``tls`` (the plan's
[endpoint] as far as a scrape needs it): ``verify`` false checks no certificate, ``cadata`` (PEM
text) or ``cafile`` the CAs to trust, ``cert``/``key`` a client certificate, ``server_name`` the
name asked for (SNI) and checked in the certificate whatever host the URL holds.
"""

import http.client
import socket
import ssl
import time
import urllib.parse

from .defaults import PROMETHEUS_MAX_BYTES, READ_CHUNK
from .samplers import Sampler

SCRAPE_TIMEOUT = 0.8  # seconds for the whole answer, as a fraction of the interval when smaller
SCRAPE_CONNECT_TIMEOUT = 1.0  # seconds to connect


def scrape_timeout(interval: float) -> float:
    """Seconds one scrape may take at this interval: SCRAPE_TIMEOUT, or 0.8 of a shorter interval."""
    return min(SCRAPE_TIMEOUT, 0.8 * float(interval))


class ScrapeError(Exception):
    """A scrape that got an answer, but not a usable one."""


def tls_context(url: str, tls: "dict | None") -> "ssl.SSLContext | None":
    """The SSL context of a scrape of ``url`` (None for http://)."""
    if not url.startswith("https://"):
        return None
    tls = tls or {}
    ctx = ssl.create_default_context(cafile=tls.get("cafile") or None, cadata=tls.get("cadata") or None)
    if tls.get("verify") is False:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.get("cert"):
        ctx.load_cert_chain(tls["cert"], tls.get("key") or None)
    return ctx


class _HTTPSConnection(http.client.HTTPSConnection):
    """An https connection that asks for ``server_name`` (SNI, and the certificate's name checked)
    instead of the URL's host."""

    def __init__(self, host: str, port: int, server_name: str, context: "ssl.SSLContext", **kw):
        super().__init__(host, port, context=context, **kw)
        self.server_name = server_name
        self.tls = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self.tls.wrap_socket(self.sock, server_hostname=self.server_name)


def _connection(url: str, context: "ssl.SSLContext | None", server_name: "str | None", connect_timeout: float):
    """(connection, path) for ``url``."""
    parts = urllib.parse.urlsplit(url)
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    host = parts.hostname or "localhost"
    if parts.scheme == "https":
        port = parts.port or 443
        if server_name:
            return _HTTPSConnection(host, port, server_name, context or tls_context(url, None),
                                    timeout=connect_timeout), path
        return http.client.HTTPSConnection(host, port, timeout=connect_timeout, context=context), path
    if parts.scheme != "http":
        raise ScrapeError("not an http(s) URL")
    return http.client.HTTPConnection(host, parts.port or 80, timeout=connect_timeout), path


def _body(conn, path: str, headers: "dict | None", deadline: float, timeout: float, max_bytes: int) -> bytes:
    conn.request("GET", path, headers=dict(headers or {}))
    conn.sock.settimeout(max(0.01, deadline - time.monotonic()))  # each read; the deadline below bounds the whole
    r = conn.getresponse()
    if r.status != 200:
        raise ScrapeError("HTTP %d" % r.status)
    body = bytearray()
    while True:
        chunk = r.read(READ_CHUNK)
        if not chunk:
            return bytes(body)
        body += chunk
        if len(body) > max_bytes:
            raise ScrapeError("answer larger than %d bytes" % max_bytes)
        if time.monotonic() > deadline:
            raise ScrapeError("answer not complete within %gs" % timeout)


def scrape(url: str, headers: "dict | None" = None, context: "ssl.SSLContext | None" = None,
           server_name: "str | None" = None, timeout: float = SCRAPE_TIMEOUT,
           connect_timeout: float = SCRAPE_CONNECT_TIMEOUT, max_bytes: int = PROMETHEUS_MAX_BYTES) -> dict:
    """One scrape -> its prometheus.jsonl record (``text`` or ``error``). Never raises."""
    rec = {"t": round(time.time(), 6), "url": url}
    deadline = time.monotonic() + timeout
    conn = None
    try:
        conn, path = _connection(url, context, server_name, connect_timeout)
        rec["text"] = _body(conn, path, headers, deadline, timeout, max_bytes).decode("utf-8", "replace")
    except ScrapeError as e:
        rec["error"] = str(e)
    except socket.timeout:
        rec["error"] = "timed out after %gs" % timeout
    except ConnectionRefusedError:
        rec["error"] = "connection refused"
    except ssl.SSLError as e:
        rec["error"] = ("%s: %s" % (type(e).__name__, e))[:300]
    except OSError as e:
        rec["error"] = "connection error: %s" % (e.strerror or type(e).__name__)
    except Exception as e:  # a scrape failure is counted, never fatal
        rec["error"] = ("%s: %s" % (type(e).__name__, e))[:300]
    finally:
        if conn is not None:
            conn.close()
    return rec


class PrometheusSampler(Sampler):
    """Scrapes a /metrics URL on the monitored host (``scrape``); one JSON line per scrape.  ``tls``
    (the plan's [endpoint] as agents/settings.py passes it): ``verify``, ``cadata``, ``headers``."""

    def __init__(self, name, path, interval, stopping, url: str, tls: "dict | None" = None):
        super().__init__(name, path, interval, stopping)
        self.url = url
        tls = tls or {}
        self.headers = dict(tls.get("headers") or {})
        self.server_name = tls.get("server_name")
        self.context = tls_context(url, tls)

    def sample(self, t: float) -> "list[dict]":
        return [scrape(self.url, self.headers, self.context, self.server_name, timeout=scrape_timeout(self.interval))]
