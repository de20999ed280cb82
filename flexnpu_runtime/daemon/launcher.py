"""How aclservers are started: forked from a pre-imported zygote (fast) or spawned (simple).

Both return :class:`~flexnpu_runtime.daemon.processes.Launched` for a process that leads its own
session, with stdout/stderr going to the claim's stderr file. The zygote
(:mod:`flexnpu_runtime.daemon.zygote`) is a separate small child of the daemon that never imports
grpc; if it cannot be used, :class:`ZygoteLauncher` falls back to spawning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from dra_driver.errors import ErrorCode, StateError
from flexnpu_runtime.daemon import processes, zygote_marker

log = logging.getLogger("flexnpu.daemon")


class Launcher(Protocol):
    def launch(
        self, *, spec_path: Path, stderr_path: Path, cgroup: Sequence[Path] = ()
    ) -> processes.Launched:
        """Start an aclserver for ``spec_path``; with ``cgroup`` (``cgroup.procs`` files) it
        joins those cgroups before it runs (see :func:`processes.launch`)."""
        ...

    def close(self) -> None: ...


class SpawnLauncher:
    """``<command> --spec <file>`` as a new process (a fresh interpreter each time)."""

    def __init__(self, command: Sequence[str]) -> None:
        self.command = tuple(command)

    def launch(
        self, *, spec_path: Path, stderr_path: Path, cgroup: Sequence[Path] = ()
    ) -> processes.Launched:
        return processes.launch(self.command, spec_path=spec_path, stderr_path=stderr_path, cgroup=cgroup)

    def close(self) -> None:
        pass


class ZygoteLauncher:
    """Forks aclservers from one long-lived, pre-imported zygote process; thread-safe.

    **Parameters:**
    * run_dir - the daemon's run dir (the zygote's log goes there; its argv marks its children).
    * fallback - used when the zygote does not answer.
    * timeout - seconds to wait for the zygote's answer to one request.
    """

    def __init__(self, *, run_dir: Path, fallback: SpawnLauncher, timeout: float = 5.0) -> None:
        self.run_dir = run_dir
        self.fallback = fallback
        self.timeout = timeout
        self.argv = zygote_marker.zygote_argv(sys.executable, run_dir)
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the zygote now and wait until it has imported the aclserver; log if it cannot."""
        with self._lock:
            try:
                self._ensure()
            except (OSError, ValueError, TimeoutError) as exc:
                log.warning("zygote did not start (%s); aclservers will be spawned until it does", exc)
                self._stop_locked()

    def launch(
        self, *, spec_path: Path, stderr_path: Path, cgroup: Sequence[Path] = ()
    ) -> processes.Launched:
        stderr_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        request: dict[str, Any] = {
            "spec": str(spec_path),
            "stderr": str(stderr_path),
            "cgroup": [str(p) for p in cgroup],
        }
        with self._lock:
            reply: dict[str, Any] | None = None
            for attempt in (1, 2):  # a zygote that died since the last launch is replaced once
                try:
                    reply = self._ask(self._ensure(), request)
                    break
                except (OSError, ValueError, TimeoutError) as exc:
                    self._stop_locked()
                    if attempt == 2:
                        log.warning("zygote unusable (%s); spawning the aclserver instead", exc)
            if reply is None:
                return self.fallback.launch(spec_path=spec_path, stderr_path=stderr_path, cgroup=cgroup)
        if "cgroup_error" in reply:
            raise StateError(str(reply["cgroup_error"]), code=ErrorCode.CGROUP_FAILED, field="cgroup")
        if "pid" not in reply:
            log.warning("zygote refused: %s; spawning the aclserver instead", reply.get("error"))
            return self.fallback.launch(spec_path=spec_path, stderr_path=stderr_path, cgroup=cgroup)
        pid = int(reply["pid"])
        st = processes.stat(pid)
        return processes.Launched(
            pid=pid, start_time=st.start_time if st else 0, cmdline=self.argv, popen=None
        )

    def close(self) -> None:
        with self._lock:
            self._stop_locked()

    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop_locked()
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (self.run_dir / "zygote.stderr.log").open("ab") as err:
            self._proc = subprocess.Popen(
                list(self.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, close_fds=True
            )
        self._buf = b""
        hello = self._answer(self._proc)
        if "ready" not in hello:
            raise ValueError(f"unexpected first line from the zygote: {hello}")
        return self._proc

    def _ask(self, proc: subprocess.Popen[bytes], request: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        return self._answer(proc)

    def _answer(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        """The zygote's next line, as JSON, within ``timeout``."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer within {self.timeout:.1f}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise OSError(f"zygote exited (status {proc.poll()})")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        doc = json.loads(line)
        if not isinstance(doc, dict):
            raise ValueError(f"unexpected answer {line!r}")
        return doc

    def _stop_locked(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
