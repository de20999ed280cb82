"""Fixtures of the C client tests: the built libascendcl.so, C programs linked against it, and
real aclservers (``flexnpu_testing.aclserver_harness``) with a host-side client.conf for FLEXNPU_CONF."""

from __future__ import annotations

import importlib.util
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_testing.aclserver_harness import RunningAclServer, ShareSpec
from flexnpu_wire import clientconf

HERE = Path(__file__).parent
MIB = 1 << 20


@dataclass
class Result:
    """A finished C program: its exit code, output, and the ``val`` lines it printed."""

    rc: int
    stdout: str
    stderr: str

    @property
    def values(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in self.stdout.splitlines():
            if line.startswith("val "):
                _, key, *rest = line.split(" ", 2)
                out[key] = rest[0] if rest else ""
        return out

    @property
    def failures(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith("FAIL")]

    def ok(self) -> Result:
        assert self.rc == 0 and not self.failures, f"rc={self.rc}\n{self.stdout}\n{self.stderr}"
        return self


def run(exe: Path, *args: str, conf: Path | None, timeout: float = 60, **env: str) -> Result:
    """Run ``exe`` with FLEXNPU_CONF=conf (unset when None) and no other FLEXNPU_ variable."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    if conf is not None:
        environ["FLEXNPU_CONF"] = str(conf)
    environ.update(env)
    res = subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        env=environ,
        check=False,
    )
    return Result(res.returncode, res.stdout, res.stderr)


def api_generator() -> ModuleType:
    """libascendcl/api/generate.py (the C surface's table and renderers), loaded as a module."""
    path = clibrary.LIBRARY_DIR / "api" / "generate.py"
    spec = importlib.util.spec_from_file_location("acl_api_generate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def library() -> Path:
    return clibrary.build_library()


@pytest.fixture(scope="session")
def acl_check(library: Path) -> Path:
    return clibrary.compile_program(HERE / "acl_check.c", link_library=library)


@pytest.fixture(scope="session")
def acl_semantics(library: Path) -> Path:
    return clibrary.compile_program(HERE / "acl_semantics.c", link_library=library)


@dataclass
class Claim:
    """A running aclserver and the client.conf (host paths) that reaches it."""

    server: RunningAclServer
    conf: Path

    @property
    def staging(self) -> int:
        return self.server.spec.staging_bytes


@pytest.fixture
def claim_factory() -> Iterator[Callable[..., Claim]]:
    """Start aclservers for given shares; all are stopped at teardown."""
    stack: list[object] = []
    work = Path(tempfile.mkdtemp(prefix="fc", dir="/tmp"))

    def factory(shares: Sequence[ShareSpec], *, unix: bool = True, tcp: bool = True, **spec: object) -> Claim:
        cm = aclserver_harness.running_aclserver(work, shares=shares, ledger_dir=str(work / "ledger"), **spec)
        server = cm.__enter__()
        stack.append(cm)
        conf = work / f"{server.spec.claim_uid}.conf"
        conf.write_text(clientconf.render(server.conf(unix=unix, tcp=tcp)))
        return Claim(server, conf)

    yield factory
    for cm in reversed(stack):
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def claim(claim_factory: Callable[..., Claim]) -> Claim:
    """One vNPU of 64 MiB, 4 MiB staging."""
    return claim_factory([aclserver_harness.share(0, memory=64 * MIB)], staging_bytes=4 * MIB)


class Interactive:
    """A C program driven line by line: read its output up to a marker, then write to its stdin."""

    def __init__(self, exe: Path, *args: str, conf: Path | None, **env: str) -> None:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
        if conf is not None:
            environ["FLEXNPU_CONF"] = str(conf)
        environ.update(env)
        self.proc = subprocess.Popen(
            [str(exe), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environ,
        )
        self.lines: list[str] = []
        self._buf = b""

    def read_until(self, marker: str, timeout: float = 30.0) -> list[str]:
        """Lines up to and including the first one equal to ``marker`` (AssertionError on timeout/exit)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                self.lines.append(line.decode(errors="replace"))
                if self.lines[-1] == marker:
                    return self.lines
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} within {timeout}s: {self.lines}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                assert chunk, f"program exited before {marker!r}: {self.lines} {self.stderr()}"
                self._buf += chunk

    def read_more(self, timeout: float) -> list[str]:
        """Whatever complete lines arrive within ``timeout`` seconds (possibly none)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        start = len(self.lines)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._buf += chunk
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                self.lines.append(line.decode(errors="replace"))
        return self.lines[start:]

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def finish(self, timeout: float = 30.0) -> Result:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout)
        rest = self._buf + self.proc.stdout.read()
        out = "\n".join(self.lines) + "\n" + rest.decode(errors="replace")
        return Result(self.proc.returncode, out, self.stderr())

    def stderr(self) -> str:
        return (
            self.proc.stderr.read().decode(errors="replace")
            if self.proc.poll() is not None and self.proc.stderr
            else ""
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def interactive() -> Iterator[Callable[..., Interactive]]:
    made: list[Interactive] = []

    def factory(exe: Path, *args: str, conf: Path | None, **env: str) -> Interactive:
        made.append(Interactive(exe, *args, conf=conf, **env))
        return made[-1]

    yield factory
    for p in made:
        p.kill()
