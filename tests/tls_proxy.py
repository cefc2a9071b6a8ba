"""A real TLS-terminating proxy for tests: Debian's nginx in front of a target, on loopback.

    pki = make_pki(tmp_path / "pki")                  # a private CA, a server and a client certificate
    proxy = TlsProxy.start(tmp_path / "nginx", pki, upstream_port=target_port)
    proxy.url        # https://127.0.0.1:PORT          routes by Host, as an ingress does
    proxy.mtls_url   # https://127.0.0.1:PORT2         requires a client certificate
    proxy.named_url  # https://127.0.0.1:PORT3         a certificate for DEMO_HOST only (no address)
    proxy.stop()

Virtual servers on ``proxy.url``:
- the default server (any other Host) answers 404, as an ingress with no route for a name does;
- ``Host: DEMO_HOST`` serves the target under the gateway prefix ``BASE_PATH`` (stripped before
  it reaches the target) and requires ``TOKEN_HEADER: TOKEN`` (401 otherwise), except on its
  /metrics (open, as a scrape route on an internal network often is).
``proxy.mtls_url`` serves the target at / to a client presenting a certificate of the private CA
(nginx answers 400 "No required SSL certificate was sent" to one without).  ``proxy.named_url``
serves it at / with a certificate that names DEMO_HOST only, as an ingress reached by its address
does (a client must ask for that name: SNI, endpoint.server_name).

nginx runs from its own config in a temp dir (``nginx -p DIR -c DIR/nginx.conf``), one process
(``master_process off``, so no user switch), in the foreground as the test's child; never the
system service.  The certificates are made here with the ``cryptography`` package.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
DEMO_HOST = "demo.kneeswarm.test"
BASE_PATH = "/serving/demo"
TOKEN_HEADER, TOKEN = "X-Gateway-Token", "tok-3f9a1c-not-for-logs"
START_TIMEOUT = 10.0  # seconds for nginx to listen


@dataclass
class Pki:
    ca: Path  # the private CA's certificate (what a client's ca_bundle holds)
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here (a wrong ca_bundle)
    named_cert: Path  # a server certificate for DEMO_HOST only (no address), as an ingress has
    named_key: Path


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key, cert) -> None:
    from cryptography.hazmat.primitives import serialization

    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _cert(subject: str, key, issuer_name, issuer_key, *, ca: bool = False, sans: list | None = None,
          client: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name)
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                          content_commitment=False, key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        b = b.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        b = b.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(d: Path) -> Pki:
    """A private CA; a server certificate for 127.0.0.1 and DEMO_HOST; a client certificate;
    and an unrelated CA."""
    from cryptography import x509

    d.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _cert("kneeswarm test CA", ca_key, None, ca_key, ca=True)
    _write(d / "ca", None, ca)
    srv_key = _key()
    sans = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName(DEMO_HOST)]
    _write(d / "server", srv_key, _cert("127.0.0.1", srv_key, ca.subject, ca_key, sans=sans))
    cli_key = _key()
    _write(d / "client", cli_key, _cert("kneeswarm load generator", cli_key, ca.subject, ca_key, client=True))
    other_key = _key()
    _write(d / "other-ca", None, _cert("some other CA", other_key, None, other_key, ca=True))
    named_key = _key()
    _write(d / "named", named_key, _cert(DEMO_HOST, named_key, ca.subject, ca_key, sans=[x509.DNSName(DEMO_HOST)]))
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key",
               d / "other-ca.pem", d / "named.pem", d / "named.key")


CONFIG = """
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  log_format routed '$host $status "$request"';
  access_log {d}/access.log routed;
  client_body_temp_path {d}/tmp/body;
  proxy_temp_path {d}/tmp/proxy;
  fastcgi_temp_path {d}/tmp/fastcgi;
  uwsgi_temp_path {d}/tmp/uwsgi;
  scgi_temp_path {d}/tmp/scgi;
  ssl_certificate {pki.server_cert};
  ssl_certificate_key {pki.server_key};
  upstream target {{ server 127.0.0.1:{upstream}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port} ssl default_server;
    return 404;
  }}
  server {{
    listen 127.0.0.1:{port} ssl;
    server_name {host};
    location = {base}/metrics {{
      proxy_pass http://target/metrics;
    }}
    location {base}/ {{
      if ($http_{token_var} != "{token}") {{ return 401; }}
      proxy_pass http://target/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
  server {{
    listen 127.0.0.1:{named_port} ssl;
    server_name {host};
    ssl_certificate {pki.named_cert};
    ssl_certificate_key {pki.named_key};
    location / {{
      proxy_pass http://target;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
  server {{
    listen 127.0.0.1:{mtls_port} ssl;
    ssl_client_certificate {pki.ca};
    ssl_verify_client on;
    location / {{
      proxy_pass http://target;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TlsProxy:
    proc: subprocess.Popen
    dir: Path
    port: int
    mtls_port: int
    named_port: int

    url = property(lambda self: f"https://127.0.0.1:{self.port}")
    mtls_url = property(lambda self: f"https://127.0.0.1:{self.mtls_port}")
    named_url = property(lambda self: f"https://127.0.0.1:{self.named_port}")

    @classmethod
    def start(cls, d: Path, pki: Pki, upstream_port: int) -> TlsProxy:
        (d / "tmp").mkdir(parents=True, exist_ok=True)
        port, mtls_port, named_port = _free_port(), _free_port(), _free_port()
        (d / "nginx.conf").write_text(CONFIG.format(
            d=d, pki=pki, upstream=upstream_port, port=port, mtls_port=mtls_port, named_port=named_port,
            host=DEMO_HOST, base=BASE_PATH,
            token_var=TOKEN_HEADER.lower().replace("-", "_"), token=TOKEN))
        proc = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf"), "-e", str(d / "error.log")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        proxy = cls(proc, d, port, mtls_port, named_port)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"nginx exited: {proc.stderr.read().decode(errors='replace')[-2000:]}")
            if all(_listening(p) for p in (port, mtls_port, named_port)):
                return proxy
            time.sleep(0.05)
        proxy.stop()
        raise RuntimeError(f"nginx did not listen within {START_TIMEOUT}s")

    def access_log(self) -> list[str]:
        path = self.dir / "access.log"
        return path.read_text().splitlines() if path.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
