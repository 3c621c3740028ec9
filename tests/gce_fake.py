"""A local HTTP server that answers like the Compute Engine REST API (v1), for the calls rlboost makes.

The real `google-cloud-compute` client talks to it over REST (api_endpoint=http://127.0.0.1:PORT,
anonymous credentials), so request serialisation, paging and error mapping are the library's own.
It keeps instances per zone with labels, inserts through zone operations (capacity errors such as
ZONE_RESOURCE_POOL_EXHAUSTED arrive in the operation, as on GCE), deletes, preempts on request
(`instance_termination_action=DELETE`: the VM disappears), and records every request body.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

BASE = "/compute/v1/projects/"


class FakeGce:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instances: dict[str, dict[str, Any]] = {}  # name -> instance JSON (+ "zone")
        self.ops: dict[str, dict[str, Any]] = {}
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.exhausted: set[str] = set()  # zones without capacity
        self.bodies: list[tuple[str, str, Any]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- scripting ---------------------------------------------------------------------
    def boot_all(self) -> None:
        """Every PROVISIONING VM becomes RUNNING (with a public IP)."""
        with self.lock:
            for inst in self.instances.values():
                if inst["status"] == "PROVISIONING":
                    inst["status"] = "RUNNING"

    def preempt(self, name: str) -> None:
        with self.lock:
            self.instances.pop(name, None)

    def live(self) -> list[str]:
        with self.lock:
            return sorted(self.instances)

    # ---- the API -----------------------------------------------------------------------
    def _op(self, project: str, zone: str | None, kind: str, target: str, error: str | None = None) -> dict:
        name = f"operation-{uuid.uuid4().hex[:12]}"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "name": name,
            "operationType": kind,
            "status": "DONE",
            "targetLink": f"{BASE}{project}/zones/{zone}/instances/{target}",
            "progress": 100,
        }
        if zone:
            op["zone"] = f"{BASE}{project}/zones/{zone}"
        if error:
            op["error"] = {"errors": [{"code": error, "message": f"The zone '{zone}' does not have enough resources"}]}
            op["httpErrorStatusCode"] = 503
        self.ops[name] = op
        return op

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        self.bodies.append((method, path, body))
        p = path[len(BASE) :] if path.startswith(BASE) else ""
        with self.lock:
            if m := re.fullmatch(r"([^/]+)/zones/([^/]+)/instances", p):
                project, zone = m.groups()
                if method == "POST":
                    if zone in self.exhausted:
                        return 200, self._op(project, zone, "insert", body["name"], "ZONE_RESOURCE_POOL_EXHAUSTED")
                    if body["name"] in self.instances:
                        return 409, _err(409, f"The resource '{body['name']}' already exists", "alreadyExists")
                    inst = dict(body, status="PROVISIONING", zone=f"{BASE}{project}/zones/{zone}")
                    for i, nic in enumerate(inst.get("networkInterfaces", [])):
                        nic["networkIP"] = f"10.128.0.{len(self.instances) + 2}"
                        for ac in nic.get("accessConfigs", []):
                            ac["natIP"] = f"34.1.{i}.{len(self.instances) + 2}"
                    self.instances[body["name"]] = inst
                    return 200, self._op(project, zone, "insert", body["name"])
            if m := re.fullmatch(r"([^/]+)/zones/([^/]+)/instances/([^/]+)", p):
                project, zone, name = m.groups()
                inst = self.instances.get(name)
                if inst is None or not inst["zone"].endswith(f"/{zone}"):
                    where = f"projects/{project}/zones/{zone}/instances/{name}"
                    return 404, _err(404, f"The resource '{where}' was not found")
                if method == "DELETE":
                    del self.instances[name]
                    return 200, self._op(project, zone, "delete", name)
                return 200, inst
            if m := re.fullmatch(r"([^/]+)/zones/([^/]+)/operations/([^/]+)", p):
                op = self.ops.get(m.group(3))
                return (200, op) if op else (404, _err(404, "operation not found"))
            if m := re.fullmatch(r"([^/]+)/aggregated/instances", p):
                expr = (query.get("filter") or [""])[0]
                want, has = _label_filter(expr), _label_keys(expr)
                items: dict[str, Any] = {}
                for inst in self.instances.values():
                    labels = inst.get("labels") or {}
                    if all(labels.get(k) == v for k, v in want.items()) and all(k in labels for k in has):
                        scope = "zones/" + inst["zone"].rsplit("/", 1)[-1]
                        items.setdefault(scope, {"instances": []})["instances"].append(inst)
                return 200, {"kind": "compute#instanceAggregatedList", "items": items}
            if m := re.fullmatch(r"([^/]+)/global/firewalls(?:/([^/]+))?", p):
                project, name = m.groups()
                if method == "POST":
                    self.firewalls[body["name"]] = body
                    op = self._op(project, None, "insert", body["name"])
                    return 200, op
                if name in self.firewalls:
                    return 200, self.firewalls[name]
                return 404, _err(404, f"The resource 'projects/{project}/global/firewalls/{name}' was not found")
        return 400, _err(400, f"fake GCE does not implement {method} {path}")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _do(self) -> None:
                url = urlparse(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                code, out = fake.handle(self.command, url.path, parse_qs(url.query), body)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _do

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _err(code: int, message: str, reason: str = "notFound") -> dict:
    return {"error": {"code": code, "message": message, "errors": [{"message": message, "reason": reason}]}}


def _label_filter(expr: str) -> dict[str, str]:
    return dict(re.findall(r'labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"', expr))


def _label_keys(expr: str) -> list[str]:
    """`labels.KEY:*`: the instance has that label, whatever its value (Compute Engine's filter syntax)."""
    return re.findall(r"labels\.([a-z0-9_-]+):\*", expr)
