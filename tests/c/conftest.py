"""Fixtures of the C client tests: the built libascendcl.so, C programs linked against it, and
real aclservers (``dra_driver.testing.aclservers``) with a host-side client.conf for FLEXNPU_CONF."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver import clientconf
from dra_driver.testing import aclservers, clibrary
from dra_driver.testing.aclservers import RunningAclServer, ShareSpec

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
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout, env=environ, check=False)
    return Result(res.returncode, res.stdout, res.stderr)


@pytest.fixture(scope="session")
def library() -> Path:
    return clibrary.build_library()


@pytest.fixture(scope="session")
def acl_check(library: Path) -> Path:
    return clibrary.compile_program(HERE / "acl_check.c", link_library=library)


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
        cm = aclservers.running_aclserver(work, shares=shares, ledger_dir=str(work / "ledger"), **spec)
        server = cm.__enter__()
        stack.append(cm)
        conf = work / f"{server.spec.claim_uid}.conf"
        conf.write_text(clientconf.render(server.conf(unix=unix, tcp=tcp)))
        return Claim(server, conf)

    yield factory
    for cm in reversed(stack):
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]
    subprocess.run(["rm", "-rf", str(work)], check=False)


@pytest.fixture
def claim(claim_factory: Callable[..., Claim]) -> Claim:
    """One vNPU of 64 MiB, 4 MiB staging."""
    return claim_factory([aclservers.share(0, memory=64 * MIB)], staging_bytes=4 * MIB)
