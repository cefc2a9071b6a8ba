"""A recording Kubernetes API server on loopback, for checking kubectl command lines with kubectl's
own parser: kubectl (the real binary) is pointed at it by a kubeconfig and the requests it makes
are recorded (method, path, query, JSON body).  It answers what those commands need: discovery,
one pod, a pod list (equality label selectors), the ephemeral-containers patch (kept in the pod); an exec is refused (403) once recorded, since
no container stands behind it.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RESOURCES = {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "shortNames": ["po"],
     "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
    {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions", "verbs": ["create", "get"]},
    {"name": "pods/ephemeralcontainers", "singularName": "", "namespaced": True, "kind": "Pod",
     "verbs": ["get", "patch", "update"]},
]}


def pod(name: str, namespace: str, phase: str = "Running", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, "uid": f"uid-{name}",
                         "resourceVersion": "1"},
            "spec": {"containers": [{"name": "server", "image": "nvcr.io/nvidia/tritonserver:24.08-py3"}],
                     "securityContext": {}},  # an API server defaults it: kubectl debug reads it
            "status": {"phase": phase, "containerStatuses": [{"name": "server", "ready": phase == "Running",
                                                              "state": {"running": {}} if phase == "Running" else {}}]}}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any


@dataclass
class KubeAPI:
    namespace: str
    pods: list[dict[str, Any]]
    requests: list[Request] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> KubeAPI:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                u = urllib.parse.urlsplit(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                api.requests.append(Request(self.command, u.path, urllib.parse.parse_qs(u.query), body))
                self._answer(*api.answer(self.command, u.path, urllib.parse.parse_qs(u.query), body))

            do_GET = do_POST = do_PATCH = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        ns = f"/api/v1/namespaces/{self.namespace}/pods"
        by_name = {p["metadata"]["name"]: p for p in self.pods}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        if path == "/api/v1":
            return 200, RESOURCES
        if path == "/version":
            return 200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0"}
        if path.startswith("/api/v1/namespaces/") and path.endswith("/pods") and method == "GET":
            want = dict(kv.split("=", 1) for kv in (query.get("labelSelector") or [""])[0].split(",") if "=" in kv)
            items = [p for p in self.pods if path == f"/api/v1/namespaces/{p['metadata']['namespace']}/pods"
                     and all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        parts = path[len(ns) + 1:].split("/") if path.startswith(ns + "/") else []
        if parts and parts[0] in by_name:
            p = by_name[parts[0]]
            if len(parts) == 1:
                return 200, p
            if parts[1] == "ephemeralcontainers" and method == "PATCH":  # kept: a later exec -c finds it
                added = (body.get("spec") or {}).get("ephemeralContainers") or [] if isinstance(body, dict) else []
                p["spec"]["ephemeralContainers"] = [*p["spec"].get("ephemeralContainers", []), *added]
                return 200, p
            if parts[1] == "exec":
                return 403, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                             "message": "recorded by the test's API server: no container behind it", "code": 403}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                     "message": f"{path} not found", "code": 404}

    def kubeconfig(self, path: Path, dead_port: int) -> Path:
        """Two contexts: ``elsewhere`` (current, a port nobody listens on) and ``lab`` (this server):
        a command that does not pass ``--context lab`` reaches nothing."""
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
            "clusters": [{"name": "lab", "cluster": {"server": self.url}},
                         {"name": "elsewhere", "cluster": {"server": f"http://127.0.0.1:{dead_port}"}}],
            "users": [{"name": "u", "user": {"token": "test-token"}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "u"}},
                         {"name": "elsewhere", "context": {"cluster": "elsewhere", "user": "u"}}],
        }
        path.write_text(json.dumps(cfg))
        return path
