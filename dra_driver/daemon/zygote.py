"""A small pre-imported process that forks aclservers fast (the daemon's optional launcher).

``python -m dra_driver.daemon.zygote --run-dir DIR`` imports ``dra_driver.aclserver.main`` once,
announces ``{"ready": pid}``, then reads one JSON request per line on stdin (``{"spec": path, "stderr": path}``) and answers
one line on stdout (``{"pid": n}`` or ``{"error": text}``); a request may also name ``"cgroup"``:
``cgroup.procs`` files the child writes its PID to before anything else runs. Each child starts
its own session, sends stdout/stderr to the given file, joins its cgroups (exit status 121 when
it cannot, the reason in that file) and runs ``dra_driver.aclserver.main.main``. Children
carry the zygote's command line (with ``--run-dir``), which is how a restarted daemon finds
orphans. The zygote ignores SIGCHLD (children are reaped by the kernel) and exits when stdin
closes, i.e. when the daemon goes; the aclservers it forked keep running.

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

from dra_driver.aclserver import main as aclserver_main  # pre-imported once: the point of the zygote
from dra_driver.daemon.zygote_marker import JOIN_CGROUP_STATUS, MODULE


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
        try:
            pid = os.fork()
        except OSError as exc:
            replies.write(json.dumps({"error": f"fork failed: {exc}"}) + "\n")
            replies.flush()
            continue
        if pid == 0:
            _child(spec_path, stderr_path, cgroup, aclserver_main.main)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
    return 0


def _child(
    spec_path: str, stderr_path: str, cgroup: Sequence[str], run: Callable[[Sequence[str]], int]
) -> None:
    """In the forked child: detach, redirect, join the claim's cgroups, run the aclserver; never return."""
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
        os.closerange(3, 1024)  # the zygote's pipes to the daemon must not leak into the aclserver
        for procs in cgroup:
            try:
                fd = os.open(procs, os.O_WRONLY | os.O_NOFOLLOW)
                try:
                    os.write(fd, str(os.getpid()).encode())
                finally:
                    os.close(fd)
            except OSError as exc:
                print(f"flexnpu-cgroup-join: cannot join {procs}: {exc.strerror or exc}", file=sys.stderr)
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
