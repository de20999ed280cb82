"""Trace spans leave the process: ``--otlp-endpoint`` sends them over OTLP/HTTP to a collector.

The collector here is a real HTTP server in the test that speaks the OTLP/HTTP protobuf encoding: it
answers ``POST /v1/traces`` and decodes each body as an ``ExportTraceServiceRequest`` (the
``opentelemetry-proto`` messages the exporter sends). The node process and the extender process are the
real ``flexnpu-dra`` commands started with the flag's environment twin; a claim is prepared through the
kubelet simulator, a pod is ranked through the extender's ``/prioritize``.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import NAMESPACE, NODE, Node

WHOLE = [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]


class Span:
    """One received span: its name, its attributes and its resource's, as plain values."""

    def __init__(self, name: str, attrs: dict[str, Any], resource: dict[str, Any]) -> None:
        self.name, self.attrs, self.resource = name, attrs, resource

    def __repr__(self) -> str:
        return f"Span({self.name!r}, {self.attrs!r})"


def _values(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        field = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, field) if field else None
    return out


class OtlpReceiver:
    """A minimal OTLP/HTTP collector: decodes ``POST /v1/traces`` bodies and keeps their spans."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.bad: list[str] = []  # requests it could not read (a path or an encoding it does not speak)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    with receiver._lock:
                        receiver.bad.append(f"{self.path} {self.headers.get('Content-Type')}")
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                received = [
                    Span(span.name, _values(span.attributes), _values(rs.resource.attributes))
                    for rs in request.resource_spans
                    for ss in rs.scope_spans
                    for span in ss.spans
                ]
                with receiver._lock:
                    receiver.spans.extend(received)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    def find(self, pred: Callable[[Span], bool]) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if pred(s)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


def test_the_node_exports_a_span_per_prepare_and_unprepare(
    node_factory: Callable[..., Node], receiver: OtlpReceiver
) -> None:
    # The batch processor's standard variable: export every 50 ms instead of every 5 s.
    node = node_factory(FLEXNPU_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="50").start()
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("traced", WHOLE)
    node.scheduler.allocate(NAMESPACE, "traced", NODE)
    assert node.kubelet is not None
    ref = ClaimRef(NAMESPACE, uid, "traced")
    assert node.kubelet.prepare([ref])[uid].error == ""

    def of_claim(name: str) -> Callable[[], list[Span]]:
        return lambda: receiver.find(lambda s: s.name == name and s.attrs.get("flexnpu.claim.uid") == uid)

    (prepared,) = wait_for(of_claim("flexnpu.prepare"), what="the prepare span at the collector", timeout=30)
    assert prepared.attrs["flexnpu.claim.namespace"] == NAMESPACE
    assert prepared.attrs["flexnpu.claim.name"] == "traced"
    assert "error.type" not in prepared.attrs
    assert prepared.resource["service.name"] == "flexnpu-dra-driver"
    assert prepared.resource["k8s.node.name"] == NODE
    assert node.kubelet.unprepare([ref])[uid] == ""
    wait_for(of_claim("flexnpu.unprepare"), what="the unprepare span at the collector", timeout=30)
    assert receiver.bad == []
    assert node.stop() == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            status: int = resp.status
            return status
    except OSError:
        return 0


def test_the_extender_exports_its_decision_span_and_flushes_it_at_stop(
    api: FakeAPIServer, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("FLEXNPU_", "OTEL_"))},
        "FLEXNPU_KUBECONFIG": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
        "FLEXNPU_EXTENDER_HOST": "127.0.0.1",
        "FLEXNPU_EXTENDER_PORT": str(port),
        # The standard variable: the FLEXNPU twin is unset, so the extender reads this one.
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        # Batches every 10 minutes: only the shutdown at SIGTERM can send the span in time.
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
    }
    log = tmp_path / "extender.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubeletplugin.cli", "extender"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(
            lambda: _get(base + "/healthz") == 200 or proc.poll() is not None, what="the extender serving"
        )
        assert proc.poll() is None, log.read_text()
        pod = {"metadata": {"name": "ranked", "namespace": NAMESPACE, "uid": "pod-1"}, "spec": {}}
        body = json.dumps({"pod": pod, "nodenames": [NODE, "node-b"]}).encode()
        req = urllib.request.Request(
            base + "/prioritize", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            scores = json.loads(resp.read())
        assert scores == [{"host": NODE, "score": 0}, {"host": "node-b", "score": 0}]  # asks for no NPU
        assert receiver.find(lambda s: True) == []  # still batched
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (span,) = receiver.find(lambda s: s.name == "flexnpu.extender.prioritize")
    assert span.attrs["k8s.pod.name"] == "ranked"
    assert span.attrs["k8s.namespace.name"] == NAMESPACE
    assert span.attrs["flexnpu.extender.outcome"] == "no-npu"
    assert span.attrs["flexnpu.extender.nodes"] == 2
    assert span.resource["service.name"] == "flexnpu-extender"
    assert receiver.bad == []


@pytest.mark.parametrize("command", ["plugin", "extender"])
def test_a_bad_endpoint_stops_the_command_at_start_naming_the_flag(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.cli", command, "--otlp-endpoint", "collector:4318"]
        + (["--node-name", "n"] if command == "plugin" else []),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert f"flexnpu-dra {command}:" in out.stderr
    assert "otlp-endpoint" in out.stderr and "'collector:4318'" in out.stderr
