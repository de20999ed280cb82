"""HTTPS in front of the fake API server, so pods can use the in-cluster config (it always speaks TLS).

The certificate is self-signed for ``IP:127.0.0.1``, made with the ``openssl`` command; the proxy terminates TLS
and pipes bytes both ways to the plain-HTTP fake server, so watches stream through unchanged.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from types import TracebackType


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=kubernetes",
            "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )  # fmt: skip
    return cert, key


class TLSProxy:
    """``with TLSProxy(cert, key, ("127.0.0.1", backend_port)) as proxy: proxy.port``."""

    def __init__(self, cert: Path, key: Path, backend: tuple[str, int]) -> None:
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(cert, key)
        self._backend = backend
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tls-proxy", daemon=True)

    def __enter__(self) -> TLSProxy:
        self._thread.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed.set()
        self._listener.close()
        self._thread.join(timeout=10)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self._ctx.wrap_socket(raw, server_side=True)
            upstream = socket.create_connection(self._backend, timeout=30)
        except OSError:
            raw.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
        _pipe(client, upstream)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
