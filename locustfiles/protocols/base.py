"""The protocol interface shared by every inference protocol.

A protocol owns four things for one kind of server: how a request is built
(``next_request``), how an answer is judged (``check_response``, or ``new_stream`` for a
streamed answer), where the server says it is healthy (``health_path``), and how to check
before any load that the plan's model is really served (``preflight``).  It knows nothing
about Locust or recording: the user class in users.py drives it, the conductor calls
``preflight``.

Credentials: ``api_key_env = "NAME"`` in the plan puts ``Authorization: Bearer <$NAME>`` on
every request (and on the preflight's).  The value lives only in ``self.headers``; every
message a protocol makes goes through ``redact`` first, so it never reaches an error, a log
line or the run directory.  The same holds for the plan's ``[endpoint] headers_env``.

The endpoint (``[endpoint]``: TLS trust, client certificate, headers, a gateway's path prefix)
is the protocol's too: its headers ride on every request, and the preflight's requests use its
TLS settings; a connection that fails says what failed (``connection_problem``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from kneeswarm.contracts.plan import EndpointPlan

logger = logging.getLogger(__name__)

PREFLIGHT_TIMEOUT = 10.0  # seconds for each preflight HTTP request
MAX_DETAIL = 160  # characters of a server's error text quoted in a one-line message
REDACTED = "***"


class BadPayload(Exception):
    """The server answered 2xx but the body is not a valid inference response."""

    category = "bad_payload"


class StreamTruncated(BadPayload):
    """A streamed answer ended without its end marker ([DONE]) or a finish_reason."""

    category = "stream_truncated"


class ProtocolError(ValueError):
    """The plan cannot be turned into requests (e.g. the API key's variable is unset); one line."""


class PreflightError(RuntimeError):
    """The target does not serve what the plan asks for; str() is one line for the user."""


class Tokens(NamedTuple):
    """Token counts a protocol read from an answer (None where unknown)."""

    tokens_in: int | None
    tokens_out: int | None


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    method: str
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    tokens_in: int | None = None
    stream: bool = False  # the answer is read as it arrives (Protocol.new_stream)
    items: int = 1  # inputs carried (the batch)
    tokens_pinned: int | None = None  # output length the request pins (LLM: ignore_eos or min_tokens = max_tokens)
    prefix: int | None = None  # the shared prefix it starts with ([request.prefix]; its row's `prefix`)
    turn: int | None = None  # its turn in a conversation, from 1 ([request.conversation]; its row's `turn`)
    klass: str | None = None  # its class in a traffic mix ([[request.classes]]; its row's `class`)


#: Locust's name of every request (its stats table's and --csv's rows).  A traffic mix's are named
#: per class, "infer NAME", so that Locust's own statistics (web UI, --csv, --otel) show each class
#: apart beside the aggregate; the run directory's rows keep "infer" (the class has its own column).
REQUEST_NAME = "infer"


def request_name(klass: str | None) -> str:
    """Locust's name of a request of class ``klass`` (None: not in a mix)."""
    return REQUEST_NAME if klass is None else f"{REQUEST_NAME} {klass}"


#: Distinct random bodies pre-built per user: requests cycle through them, so building a body
#: costs the load generator nothing per request (keeps its CPU low).
BODY_VARIANTS = 16


class Protocol:
    """Builds request bodies for one user and checks the answers.

    ``request_cfg`` is the plan's [request] table as a dict; ``seed`` makes each user's
    inputs different but reproducible.  A protocol that pre-builds its requests puts them in
    ``self._requests`` and the default ``next_request`` cycles through them.
    """

    name = "base"
    health_path = "/"
    _requests: list[PreparedRequest] = []
    _i = 0

    def __init__(self, request_cfg: dict[str, Any], seed: int = 0, endpoint: EndpointPlan | None = None):
        self.cfg = request_cfg
        self.seed = seed
        self.endpoint = endpoint or EndpointPlan()
        self._secrets: list[str] = []
        self.headers = {"Content-Type": "application/json", **self._endpoint_headers(), **self._auth_header()}
        if request_cfg.get("health_path"):
            self.health_path = request_cfg["health_path"]

    # -- credentials ---------------------------------------------------------------------
    def _endpoint_headers(self) -> dict[str, str]:
        try:
            headers = self.endpoint.resolved_headers()
        except ValueError as e:
            raise ProtocolError(str(e)) from None
        self._secrets += self.endpoint.secrets()
        return headers

    def _auth_header(self) -> dict[str, str]:
        name = self.cfg.get("api_key_env")
        if not name:
            return {}
        value = os.environ.get(name)
        if not value:
            raise ProtocolError(f"request.api_key_env: environment variable {name} is not set (or empty)")
        self._secrets.append(value)
        return {"Authorization": f"Bearer {value}"}

    def redact(self, text: str) -> str:
        """``text`` without the API key's or a secret header's value (every message that leaves the protocol)."""
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    # -- requests and answers ------------------------------------------------------------
    def next_request(self) -> PreparedRequest:
        """The next of the pre-built requests (``self._requests``), in turn."""
        self._i += 1
        return self._requests[self._i % len(self._requests)]

    def of(self, req: PreparedRequest) -> Protocol:
        """The protocol that built ``req`` and judges its answer: this one (a mix: its class's)."""
        return self

    def check_response(self, body: bytes) -> Tokens | None:
        """Raise BadPayload if ``body`` is not a valid answer; return token counts when known."""
        raise NotImplementedError  # pragma: no cover - interface

    def new_stream(self, t0: float) -> Any:
        """Per-request state of a streamed answer (protocols whose requests have stream=True)."""
        raise NotImplementedError(f"protocol {self.name} does not stream")  # pragma: no cover

    # -- before the load -----------------------------------------------------------------
    def preflight(self, base_url: str, timeout: float = PREFLIGHT_TIMEOUT) -> None:
        """Raise PreflightError (one line) unless the plan's model answers; default: one real request."""
        self.probe(base_url, timeout)

    def probe(self, base_url: str, timeout: float = PREFLIGHT_TIMEOUT) -> None:
        """Send one request as the load will, and judge it as the load would."""
        req = self.next_request()
        r = self._http(req.method, base_url, req.path, timeout, data=req.body)
        if not 200 <= r.status_code < 300:
            raise PreflightError(self._refusal(base_url, f"{req.method} {req.path}", r))
        try:
            if not req.stream:
                self.check_response(r.content)
        except BadPayload as e:
            raise PreflightError(self.redact(f"{base_url}: {req.method} {req.path} answered 2xx but {e}")) from None

    def _http(self, method: str, base_url: str, path: str, timeout: float, **kw: Any) -> Any:
        import requests  # here: the request hot path never needs it

        try:
            with self.endpoint.requests_session() as session:
                return session.request(method, base_url.rstrip("/") + path, headers=self.headers,
                                       timeout=timeout, **self.endpoint.requests_kwargs(), **kw)
        except requests.RequestException as e:
            raise PreflightError(self.redact(f"{base_url}: {method} {path} failed ({connection_problem(e)})")) from None

    def _refusal(self, base_url: str, what: str, r: Any) -> str:
        """One line: what was asked, the status, the server's own error text, and what in the
        endpoint settings an answer like that usually points at."""
        return self.redact(f"{base_url}: {what} -> HTTP {r.status_code}{detail(r.content)}"
                           f"{refusal_hint(r.status_code, r.content, self.headers)}")


#: (text in an ssl error, what it means): the first that matches names the failure
TLS_FAILURES = (
    ("certificate required", "the server requires a client certificate (endpoint.client_cert)"),
    ("unknown ca", "the server does not trust the client certificate's CA (endpoint.client_cert)"),
    ("bad certificate", "the server refused the client certificate (endpoint.client_cert)"),
    ("unable to get local issuer certificate", "the server's certificate is signed by a CA not trusted here "
                                               "(give that CA in endpoint.ca_bundle)"),
    ("self-signed certificate", "the server's certificate is self-signed or signed by a CA not trusted here "
                                "(give that CA in endpoint.ca_bundle)"),
    ("self signed certificate", "the server's certificate is self-signed or signed by a CA not trusted here "
                                "(give that CA in endpoint.ca_bundle)"),
    ("mismatch", "the server's certificate is not valid for the name asked for (the target's host, or "
                 "endpoint.server_name)"),
    ("certificate has expired", "the server's certificate has expired"),
    ("wrong version number", "the server does not speak TLS on that port (is the target http://?)"),
)


def connection_problem(e: BaseException) -> str:
    """A failed connection in a few words: for TLS, what failed and which endpoint key it points
    at; else the kind of error ("connection refused", "timed out", the exception's class)."""
    text = str(e)
    low = text.lower()
    if "ssl" in type(e).__name__.lower() or "[ssl" in low or "certificate" in low:
        reason = re.search(r"certificate verify failed: (.+?) \(_ssl", text) or re.search(r"\] ([^\]]+?) \(_ssl", text)
        said = f" ({reason.group(1).strip()})" if reason else ""
        for needle, meaning in TLS_FAILURES:
            if needle in low:
                return f"TLS: {meaning}{said}"
        return f"TLS: {type(e).__name__}{said}"
    for key in ("Connection refused", "Name or service not known", "timed out", "No route to host"):
        if key in text:
            return key.lower()
    return type(e).__name__


def refusal_hint(status: int, body: bytes, headers: dict[str, str]) -> str:
    """What an HTTP refusal usually means for the endpoint settings ("" when nothing is known):
    a proxy that wants a client certificate answers 400 and says so in its page (nginx: "No
    required SSL certificate was sent"); a 404 from a proxy routing by Host names the Host sent."""
    text = (body or b"")[:2048].decode("utf-8", "replace").lower()
    if status in (400, 495, 496) and "certificate" in text:
        return ": the server requires a client certificate (endpoint.client_cert)"
    host = next((v for k, v in headers.items() if k.lower() == "host"), None)
    if status in (404, 421) and host is not None:
        return f": sent Host: {host} (endpoint.headers): does the server route that name and path (endpoint.base_path)?"
    return ""


def detail(body: bytes) -> str:
    """A server's error text for a one-line message: the JSON error/message field, an HTML page's
    title (what a proxy such as nginx says), or the start of the body."""
    text = ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            err = doc.get("error", doc.get("message", doc.get("detail")))
            if isinstance(err, dict):
                err = err.get("message", err)
            text = str(err) if err is not None else ""
    except (ValueError, TypeError):
        title = re.search(rb"<title>(.*?)</title>", body[:4096], re.I | re.S) if body else None  # a proxy's HTML page
        text = (title.group(1) if title else body[:MAX_DETAIL]).decode("utf-8", "replace") if body else ""
    text = " ".join(text.split())[:MAX_DETAIL]
    return f" ({text})" if text else ""


def parse_json(body: bytes) -> Any:
    """``body`` as JSON, for the answer checks on the request path: orjson's speed (~1.5 us where
    json.loads takes ~6 us for a chat answer), the standard library's verdict: what orjson refuses
    (NaN and Infinity, which Python servers send and json.loads accepts; UTF-16) goes to
    json.loads, whose ValueError is the one a caller sees.  Integers beyond 64 bits come back as
    floats (orjson's reading); no check depends on one."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def json_path(doc: Any, dotted: str) -> Any:
    """``doc`` followed along ``a.b.0.c`` (integers index lists); KeyError when absent."""
    for part in dotted.split("."):
        if isinstance(doc, list) and part.lstrip("-").isdigit():
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            raise KeyError(part)
    return doc
