"""A small pre-imported process that forks aclservers fast (the daemon's optional launcher).

``python -m flexnpu_runtime.daemon.zygote --run-dir DIR`` imports ``flexnpu_runtime.aclserver.main`` once,
announces ``{"ready": pid}``, then reads one JSON request per line on stdin
(``{"spec": path, "stderr": path, "cgroup": [cgroup.procs paths]}``) and answers one line on
stdout: ``{"pid": n}``, ``{"cgroup_error": text}`` or ``{"error": text}``. Each child starts its
own session and sends stdout/stderr to the given file, then waits until the zygote has moved it
into every cgroup named (so not a line of the aclserver runs outside them), and runs
``flexnpu_runtime.aclserver.main.main``; when a cgroup cannot be joined the zygote kills the child and
says why. Children carry the zygote's command line (with ``--run-dir``), which is how a
restarted daemon finds orphans. The zygote ignores SIGCHLD (children are reaped by the kernel)
and exits when stdin closes, i.e. when the daemon goes; the aclservers it forked keep running.

It must never import grpc (forking a process with gRPC threads is unsafe) or anything heavy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence

from flexnpu_runtime.aclserver import main as aclserver_main  # pre-imported once: the point of the zygote
from flexnpu_runtime.daemon.zygote_marker import JOIN_CGROUP_STATUS, MODULE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("--run-dir", required=True, help="the daemon's run dir (marks forked aclservers)")
    parser.add_argument("--title-room", default="", help="spare argv bytes for the children's process titles")
    parser.parse_args(argv)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when we stop (stdin EOF)
    requests = sys.stdin.buffer
    replies = sys.stdout
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")  # imports done: launches are fast now
    replies.flush()
    for line in requests:
        try:
            req = json.loads(line)
            spec_path, stderr_path = str(req["spec"]), str(req["stderr"])
            cgroup = [str(p) for p in req.get("cgroup") or ()]
        except (ValueError, KeyError, TypeError) as exc:
            replies.write(json.dumps({"error": f"bad request: {exc}"}) + "\n")
            replies.flush()
            continue
        replies.write(json.dumps(_fork(spec_path, stderr_path, cgroup)) + "\n")
        replies.flush()
    return 0


def _fork(spec_path: str, stderr_path: str, cgroup: Sequence[str]) -> dict[str, object]:
    """Fork one aclserver, move it into ``cgroup`` before it runs, and say how that went."""
    go_r, go_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(go_r)
        os.close(go_w)
        return {"error": f"fork failed: {exc}"}
    if pid == 0:
        os.close(go_w)
        _child(spec_path, stderr_path, go_r, aclserver_main.main)
    os.close(go_r)
    try:
        for procs in cgroup:
            try:
                _write_pid(procs, pid)
            except OSError as exc:
                os.kill(pid, signal.SIGKILL)
                return {"cgroup_error": f"cannot move the aclserver into {procs}: {exc.strerror or exc}"}
        os.write(go_w, b"1")
    finally:
        os.close(go_w)
    return {"pid": pid}


def _write_pid(procs: str, pid: int) -> None:
    fd = os.open(procs, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def _child(spec_path: str, stderr_path: str, go: int, run: Callable[[Sequence[str]], int]) -> None:
    """In the forked child: detach, redirect, wait to be in its cgroups, run the aclserver; never return."""
    code = 1
    try:
        os.setsid()
        # Dispositions as a freshly started Python has them (SIGPIPE stays ignored, as Python sets it).
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        out = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.dup2(go, 3)
        os.closerange(4, 1024)  # the zygote's pipes to the daemon must not leak into the aclserver
        placed = os.read(3, 1) == b"1"  # the zygote moved us into our cgroups (EOF: it could not)
        os.close(3)
        if not placed:
            code = JOIN_CGROUP_STATUS
            return
        code = run(["--spec", spec_path])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
