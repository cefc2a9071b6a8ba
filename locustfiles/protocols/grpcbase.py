"""What the gRPC protocols share: the target, the channel with the plan's [endpoint], the status
codes as the run directory's failure categories, and what a failed connection means.

Targets are ``grpc://host:port`` (plaintext, HTTP/2 without TLS) and ``grpcs://host:port`` (TLS).
``[endpoint]`` applies as it does over HTTP: ``ca_bundle`` and ``client_cert``/``client_key`` are the
channel's credentials, ``server_name`` the name TLS asks for and checks (grpc's target name
override), ``headers``/``headers_env`` and ``api_key_env`` ride as call metadata (keys lowercased, as
HTTP/2 carries them; secrets only in memory), and a ``Host`` header is the ``:authority``.
``base_path`` has no gRPC meaning and ``verify = false`` no gRPC equivalent: the plan refuses both.

Status codes (``failure``): a call's status becomes the row's ``status`` by the published mapping of
google/rpc/code.proto ("HTTP Mapping") and its ``error`` category: ``UNAVAILABLE`` a connection
failure (``conn_refused`` when the connection was refused, else ``conn_reset``; status 0, no answer),
``DEADLINE_EXCEEDED`` a ``timeout`` (status 0), ``RESOURCE_EXHAUSTED`` the server's pushback
(``http_429``), any other the 4xx/5xx its mapping gives.  Before the load, ``INVALID_ARGUMENT`` and
``NOT_FOUND`` are the plan's fault: the preflight says so in one line (exit 2).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import time
import urllib.parse
from typing import Any, Callable

from kneeswarm.contracts.plan import EndpointPlan
from kneeswarm.locustfiles.protocols.base import MAX_DETAIL, PreflightError, connection_problem

logger = logging.getLogger(__name__)

# grpc's C core writes its own log lines (a failed TLS handshake, a refused connection) on stderr;
# kneeswarm says what failed in its one line instead.  Read when grpc is first imported (after this).
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

SCHEMES = ("grpc", "grpcs")
#: google/rpc/code.proto's "HTTP Mapping" of every status code (tests check it against that file)
HTTP_STATUS = {"OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
               "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403, "UNAUTHENTICATED": 401,
               "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
               "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500}
#: Channel options of every channel.  Messages of any size (a tensor answer is the model's business,
#: not grpc's 4 MiB default).  A local subchannel pool: grpc otherwise shares one connection among
#: all channels of a process with the same target and options, so "a channel per user" would still
#: be one TCP connection.  No transparent retries: grpc resends a call that never reached the server
#: on its own, unseen and uncounted; a row must show what happened.
CHANNEL_OPTIONS = (("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.use_local_subchannel_pool", 1), ("grpc.enable_retries", 0))
PREFLIGHT_RETRY_S = 0.5  # between preflight tries while the server is not up yet (connection refused)
PROBE_TIMEOUT_S = 2.0  # the socket probe that says what a failed connection means
_HEADERS_NOT_METADATA = ("content-type", "host", "content-length", "connection", "te", "user-agent")


class GrpcFailure(Exception):
    """A call that ended with a status other than OK: ``category`` for the recorder, ``status``
    the HTTP status of its code (0 where nothing was answered)."""

    def __init__(self, code: str, details: str):
        super().__init__(f"{code}: {details}"[:MAX_DETAIL * 2])
        self.code = code
        self.details = details
        self.category, self.status = _category(code, details)


def _category(code: str, details: str) -> tuple[str, int]:
    if code == "UNAVAILABLE":
        return ("conn_refused" if "refused" in details.lower() else "conn_reset"), 0
    if code == "DEADLINE_EXCEEDED":
        return "timeout", 0
    status = HTTP_STATUS.get(code, 500)
    if status == 429:
        return "http_429", status
    return ("http_4xx" if status < 500 else "http_5xx"), status


def failure(e: Any) -> GrpcFailure:
    """A grpc.RpcError (or anything with ``code()`` and ``details()``) as a GrpcFailure."""
    code = getattr(e, "code", None)
    name = code().name if callable(code) and code() is not None else "UNKNOWN"
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return GrpcFailure(name, str(details or ""))


class Target:
    """``grpc://host:port`` / ``grpcs://host:port`` taken apart."""

    def __init__(self, url: str):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in SCHEMES or not u.hostname or u.port is None:
            raise ValueError(f"a gRPC target is grpc://host:port or grpcs://host:port, got {url!r}")
        self.url, self.tls, self.host, self.port = url, u.scheme == "grpcs", u.hostname, u.port
        self.address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def metadata_of(headers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The protocol's headers as call metadata: lowercased, without those HTTP/2 or grpc set
    themselves (Content-Type, Host: the Host is the channel's :authority instead)."""
    return tuple((k.lower(), v) for k, v in headers.items() if k.lower() not in _HEADERS_NOT_METADATA)


def authority_of(headers: dict[str, str]) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == "host"), None)


def _pem_blocks(text: bytes, key: bool) -> bytes:
    """The private-key blocks (``key``) or the certificate blocks of a PEM file."""
    found = re.finditer(rb"-----BEGIN ([A-Z ]+)-----.*?-----END \1-----\s*", text, re.S)
    return b"".join(m.group(0) for m in found if (b"PRIVATE KEY" in m.group(1)) == key)


def credentials(endpoint: EndpointPlan) -> Any:
    """grpc's channel credentials for a grpcs:// target: the plan's CA bundle (else the system's
    roots) and its client certificate (its key from client_key, or from the certificate's file)."""
    import grpc

    def read(path: str | None) -> bytes | None:
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    cert = read(endpoint.client_cert)
    key = read(endpoint.client_key) if endpoint.client_key else (_pem_blocks(cert, key=True) if cert else None)
    chain = _pem_blocks(cert, key=False) if cert else None
    return grpc.ssl_channel_credentials(root_certificates=read(endpoint.ca_bundle), private_key=key or None,
                                        certificate_chain=chain or None)


def channel(target: Target, endpoint: EndpointPlan, headers: dict[str, str]) -> Any:
    """A channel to ``target`` with the endpoint's TLS settings and the Host header as :authority."""
    import grpc

    options: list[tuple[str, Any]] = list(CHANNEL_OPTIONS)
    authority = authority_of(headers)
    if authority:
        options.append(("grpc.default_authority", authority))
    if target.tls:
        if endpoint.server_name:
            options.append(("grpc.ssl_target_name_override", endpoint.server_name))
        return grpc.secure_channel(target.address, credentials(endpoint), options=options)
    return grpc.insecure_channel(target.address, options=options)


# -- what a failed connection means (one line, before any load) -------------------------------------
def what_answers(target: Target, timeout: float = PROBE_TIMEOUT_S) -> str:
    """A few words on what listens at the target, from the socket itself: "" when nothing more is
    known.  grpc says only that the connection failed; the cause is usually one of: the port speaks
    TLS and the target is grpc:// (or the reverse), or the port is an HTTP/1 server's."""
    try:
        if target.tls:
            return _probe_tls(target, timeout)
        return _probe_plain(target, timeout)
    except OSError as e:
        return connection_problem(e)


def _probe_tls(target: Target, timeout: float) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    with socket.create_connection((target.host, target.port), timeout=timeout) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=target.host) as tls:
                alpn = tls.selected_alpn_protocol()
        except ssl.SSLError as e:
            if "wrong version number" in str(e).lower() or "record layer" in str(e).lower():
                return "the server does not speak TLS on that port (is the target grpc://?)"
            return connection_problem(e)
        except (ConnectionResetError, socket.timeout):
            return "the server closed the TLS handshake (does it speak TLS on that port? is the target grpc://?)"
    if alpn == "http/1.1":
        return "the server on that port speaks HTTPS/1.1, not gRPC (is it the HTTP port?)"
    return ""


def _probe_plain(target: Target, timeout: float) -> str:
    """grpc:// failed: does the port speak TLS (a handshake succeeds, or fails on a certificate),
    or answer HTTP/1 (a request line gets a status line)?"""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((target.host, target.port), timeout=timeout) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=target.host):
                return "the server speaks TLS on that port (the target should be grpcs://)"
        except ssl.SSLError as e:
            if "certificate" in str(e).lower() or "alert" in str(e).lower():
                return "the server speaks TLS on that port (the target should be grpcs://)"
        except (OSError, socket.timeout):
            pass
    with socket.create_connection((target.host, target.port), timeout=timeout) as s:
        s.sendall(f"GET / HTTP/1.1\r\nHost: {target.host}\r\nConnection: close\r\n\r\n".encode())
        try:
            head = s.recv(16)
        except (OSError, socket.timeout):
            head = b""
    if head.startswith(b"HTTP/1."):
        return "the server on that port answers HTTP/1.1, not gRPC (is it the HTTP port?)"
    return ""


def explain(target: Target, e: GrpcFailure) -> str:
    """A failed call's one line for the preflight: grpc's words, and what the socket says."""
    said = " ".join(e.details.split())[:MAX_DETAIL]
    if "http1.x server" in said or "http/1" in said.lower():
        return f"the server on that port answers HTTP/1.1, not gRPC (is it the HTTP port?) ({said})"
    if "failed parsing http/2" in said.lower():
        probe = what_answers(target)
        return probe or f"the server on that port does not speak HTTP/2, so not gRPC ({said})"
    tls = next((meaning for needle, meaning in _TLS_WORDS if needle in said.lower()), "")
    probe = what_answers(target) if e.code == "UNAVAILABLE" else ""
    return "; ".join(p for p in (tls, probe, f"{e.code}: {said}" if said else e.code) if p)


_TLS_WORDS = (("certificate_verify_failed", "TLS: the server's certificate is not trusted here (give its CA in "
                                             "endpoint.ca_bundle)"),
              ("certificate verify failed", "TLS: the server's certificate is not trusted here (give its CA in "
                                            "endpoint.ca_bundle)"),
              ("peer did not return a certificate", "TLS: the server requires a client certificate "
                                                    "(endpoint.client_cert)"),
              ("certificate required", "TLS: the server requires a client certificate (endpoint.client_cert)"),
              ("hostname", "TLS: the server's certificate is not valid for the name asked for (the target's host, "
                           "or endpoint.server_name)"))


def retrying(target: Target, call: Callable[[], Any], timeout: float, redact: Callable[[str], str]) -> Any:
    """``call()`` until it answers: a refused connection (a server still starting) is tried again
    until ``timeout``; any other failure is said at once, in one line (PreflightError)."""
    import grpc

    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as raw:
            e = failure(raw)
            if e.category == "conn_refused" and time.monotonic() + PREFLIGHT_RETRY_S < deadline:
                time.sleep(PREFLIGHT_RETRY_S)
                continue
            within = f" within {timeout:.0f}s" if e.category == "conn_refused" else ""
            raise PreflightError(redact(f"target {target.url}: gRPC failed{within} ({explain(target, e)})")) from None
