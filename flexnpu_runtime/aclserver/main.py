"""Entry point of the aclserver process: ``python -m flexnpu_runtime.aclserver --spec <path>``.

The launch contract with flexnpu-daemon: read the spec (``load_spec``), register every share in
its die's ledger, listen on TCP and the unix socket, then write ``ready_file`` atomically. On
SIGTERM (or SIGINT): stop accepting, release sessions, ledger entries and shm buffers, remove
the unix socket and the ready file, exit 0. ``run`` can be called in a process forked from a
pre-imported zygote. At start it raises its soft ``RLIMIT_NOFILE`` to the hard limit (a
connection flood then meets ``max_connections`` before the fd table) and names itself
``flexnpu-aclserver <claim uid>`` (``flexnpu_runtime/aclserver/proctitle.py``), so ``ps`` and
``pgrep aclserver`` show one process per share whether it was spawned or forked. Exit codes:
0 clean, 2 bad spec, 3 ledger refused (policy conflict, full), 4 cannot listen.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Sequence
from types import FrameType

from dra_driver import logs, wirefiles
from dra_driver.errors import FlexNPUError, InvalidInput
from flexnpu_runtime.aclserver import proctitle
from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.backend_ascend import DEFAULT_LIBRARY as ASCEND_LIBRARY
from flexnpu_runtime.aclserver.backend_ascend import AscendBackend
from flexnpu_runtime.aclserver.backend_emulated import EmulatedBackend
from flexnpu_runtime.aclserver.server import Server
from flexnpu_wire.launch import AclServerSpec, ReadyInfo

__all__ = ["load_spec", "main", "run"]

EXIT_OK = 0
EXIT_BAD_SPEC = 2
EXIT_LEDGER = 3
EXIT_LISTEN = 4


def load_spec(path: str | os.PathLike[str]) -> AclServerSpec:
    """Read and validate a spec file (InvalidInput naming the file and field)."""
    return wirefiles.load_spec(path)


def run(spec: AclServerSpec, *, backend_name: str | None = None, ascend_library: str | None = None) -> int:
    """Serve ``spec`` until SIGTERM/SIGINT; return the process exit code."""
    log = logs.claim_logger(spec.claim_uid, base=logging.getLogger("flexnpu.aclserver"))
    raise_nofile_limit()
    # the emulated die is one host core computing (docs/pytorch.md): numpy, imported at the first
    # operator or model, then multiplies matrices on one BLAS thread, not on every core of the node
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        # each backend builds the quota book with how to drop its device memory; the server hands
        # the book to the claim's sessions
        if (backend_name or spec.backend) == "ascend":
            ascend = AscendBackend(spec, library=ascend_library or ASCEND_LIBRARY)
            backend: Backend = ascend
            book = ascend.book
        else:
            emulated = EmulatedBackend(spec)
            backend, book = emulated, emulated.book
    except AclFailure as exc:
        log.error("cannot start the ascend backend: %s", exc.message)
        return EXIT_LEDGER
    except (FlexNPUError, OSError) as exc:
        log.error("cannot register in the die ledger: %s", exc)
        return EXIT_LEDGER
    server = Server(spec, backend, book, log=log)
    stop_r, stop_w = socket.socketpair()
    old_wakeup = -1
    try:
        try:
            server.start()
        except OSError as exc:
            log.error("cannot listen: %s", exc)
            return EXIT_LISTEN
        stop_w.setblocking(False)
        old_wakeup = signal.set_wakeup_fd(stop_w.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _ignore)
        wirefiles.write_ready(
            spec.ready_file,
            ReadyInfo(
                pid=os.getpid(),
                tcp_host=spec.tcp_host,
                tcp_port=server.tcp_port,
                unix_socket=spec.unix_socket,
                started_at=time.time(),
            ),
        )
        log.info(
            "serving %d share(s) on %s and %s:%d",
            len(spec.shares),
            spec.unix_socket,
            spec.tcp_host,
            server.tcp_port,
        )
        server.serve(stop_r)
        log.info("stopping")
        return EXIT_OK
    finally:
        server.shutdown()
        backend.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spec.ready_file)
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(old_wakeup)
        stop_r.close()
        stop_w.close()


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flexnpu-aclserver", description="FlexNPU aclserver (one per claim)"
    )
    parser.add_argument("--spec", required=True, help="path of the JSON spec written by flexnpu-daemon")
    parser.add_argument(
        "--title-room", default="", help="ignored: spare argv bytes for the process title (see proctitle)"
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("FLEXNPU_LOG_LEVEL", "INFO"),
        help="log level (default INFO; env FLEXNPU_LOG_LEVEL)",
    )
    parser.add_argument(
        "--backend",
        choices=("emulated", "ascend"),
        default=os.environ.get("FLEXNPU_ACLSERVER_BACKEND") or None,
        help="device backend, overriding the spec's (env FLEXNPU_ACLSERVER_BACKEND; default: the spec's)",
    )
    parser.add_argument(
        "--ascend-library",
        default=os.environ.get("FLEXNPU_ASCEND_LIBRARY") or ASCEND_LIBRARY,
        help=f"CANN libascendcl.so for --backend ascend (env FLEXNPU_ASCEND_LIBRARY; default {ASCEND_LIBRARY})",
    )
    args = parser.parse_args(argv)
    logs.setup(args.log_level)
    try:
        spec = load_spec(args.spec)
    except InvalidInput as exc:
        print(f"flexnpu-aclserver: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    title = (spec.process_name or f"flexnpu-aclserver {spec.claim_uid}").split()
    proctitle.set_title([*title, "--spec", str(args.spec)], comm=proctitle.comm_name(spec.claim_uid))
    return run(spec, backend_name=args.backend, ascend_library=args.ascend_library)


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM/SIGINT only wake the accept loop through the wakeup fd."""
