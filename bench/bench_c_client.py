"""The C client (libascendcl.so) against a real aclserver, each figure next to a baseline
measured in the same run:

* small call: ``aclrtGetMemInfo`` round trip vs a raw C unix-socket ping-pong of the same frame
  sizes, interleaved in blocks within one process (targets: p50 <= 2x, p99 <= 4x). The raw
  ping-pong runs against a C echo server and, separately, a Python one (the aclserver is
  Python, so the second ratio is what the protocol and the shim add);
* 64 MiB ``aclrtMemcpy`` host->device and device->host from ``aclrtMallocHost`` buffers vs an
  in-process ``memcpy`` of the same size, interleaved (target >= 0.9x): on the unix socket (the
  data link is sealed memfds the aclserver maps), and on TCP (region files it reads with
  pread/pwrite; as root also on a tmpfs mounted ``huge=within_size``); the same copies from
  plain ``malloc`` memory (staged through the connection's staging region) are reported too;
* 16 sessions vs 4 on one claim: aggregate small-call throughput (target >= 0.9x; needs the
  multi-session aclserver);
* RSS the shim adds to a process;
* SIGKILL of a process holding memory until another session of the claim sees it free (target < 1 s).

Usage: ``.venv/bin/python bench/bench_c_client.py [--rounds 20] [--per 500]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from _aclbench import med, p99, workdir
from bench_roundtrip import ECHO

from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_wire import clientconf

HERE = Path(__file__).parent
MIB = 1 << 20


def samples(out: str) -> dict[str, list[float]]:
    got: dict[str, list[float]] = defaultdict(list)
    for line in out.splitlines():
        kind, _, value = line.partition(" ")
        if value and value.lstrip("-").isdigit():
            got[kind].append(int(value) / 1e9)
    return got


def run(exe: Path, *args: str, conf: Path) -> str:
    env = {**os.environ, "FLEXNPU_CONF": str(conf)}
    res = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=600, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{exe.name} {' '.join(args)} failed ({res.returncode}): {res.stderr}")
    return res.stdout


def roundtrip(
    bench: Path, echo: list[str], sock: Path, conf: Path, rounds: int, per: int
) -> dict[str, list[float]]:
    proc = subprocess.Popen(echo, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "ready" / the socket path: listening
        got = samples(run(bench, "roundtrip", str(sock), str(rounds), str(per), conf=conf))
    finally:
        proc.wait(10)
        sock.unlink(missing_ok=True)
    drop = per  # the first block of each kind is warm-up
    return {k: v[drop:] for k, v in got.items()}


def sessions_throughput(bench: Path, conf: Path, n: int, seconds: float) -> float | str:
    env = {**os.environ, "FLEXNPU_CONF": str(conf)}
    procs = [
        subprocess.Popen(
            [str(bench), "calls", str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                p.wait(10)
                return f"refused: {p.stderr.read().strip() if p.stderr else ''}"[:120]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("g")
            p.stdin.flush()
        total = 0
        for p in procs:
            out, _ = p.communicate(timeout=seconds + 30)
            total += int(out.split()[-1])
        return total / seconds
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@contextlib.contextmanager
def huge_page_server(work: Path) -> Iterator[Path | None]:
    """An aclserver whose shm dir is a tmpfs mounted with ``huge=within_size`` (root only; else
    None): the server's pread/pwrite of the data link then walks 2 MiB pages."""
    if os.geteuid() != 0:
        yield None
        return
    spec = aclserver_harness.make_spec(
        work,
        shares=[aclserver_harness.share(0, memory=1024 * MIB)],
        ledger_dir=str(work / "ledger-hp"),
        staging_bytes=16 * MIB,
    )
    mnt = Path(spec.shm_dir)
    mnt.mkdir(mode=0o711)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1g,huge=within_size", "fnpu-bench-hp", str(mnt)], check=True
    )
    try:
        srv = aclserver_harness.start_aclserver(spec, work)
        try:
            conf = work / "client-hp.conf"
            conf.write_text(clientconf.render(srv.conf(unix=False)))
            yield conf
        finally:
            srv.stop()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        mnt.rmdir()


def copy_rows(bench: Path, conf: Path, rounds: int, title: str) -> None:
    copy = samples(run(bench, "memcpy", str(64 * MIB), str(rounds), conf=conf))
    base = med(copy["memcpy"])
    print(f"\n64 MiB copies, {rounds} interleaved rounds, {title} (median GB/s, ratio to in-process memcpy)")
    for kind in ("h2d", "d2h", "memcpy", "h2d-staged", "d2h-staged"):
        gbs = 64 * MIB / med(copy[kind]) / 1e9
        print(f"  {kind:10} {gbs:6.2f} GB/s  {base / med(copy[kind]):5.2f}x")


def kill_to_free(check: Path, conf: Path, trials: int) -> list[float]:
    """Seconds from SIGKILL of a process holding 256 MiB until another session sees it free again."""
    env = {**os.environ, "FLEXNPU_CONF": str(conf)}
    out: list[float] = []
    watcher = subprocess.Popen(
        [str(check), "hold", "4096"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert watcher.stdin is not None and watcher.stdout is not None

    def free_now() -> int:
        watcher.stdin.write("i")
        watcher.stdin.flush()
        while True:
            line = watcher.stdout.readline()
            if line.startswith("val hold_free "):
                return int(line.split()[-1])

    try:
        while watcher.stdout.readline().strip() != "held":
            pass
        for _ in range(trials):
            holder = subprocess.Popen(
                [str(check), "hold", str(256 * MIB)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            assert holder.stdout is not None
            while holder.stdout.readline().strip() != "held":
                pass
            before = free_now()
            t0 = time.monotonic()
            holder.kill()
            while free_now() < before + 256 * MIB:
                pass
            out.append(time.monotonic() - t0)
            holder.wait()
    finally:
        watcher.kill()
        watcher.wait()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per", type=int, default=500)
    parser.add_argument("--copy-rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    lib = clibrary.build_library()
    bench = clibrary.compile_program(HERE / "c" / "acl_bench.c", link_library=lib)
    echo_c = clibrary.compile_program(HERE / "c" / "echo.c", include_acl_headers=False)
    baseline = clibrary.compile_program(HERE / "c" / "baseline_rss.c", include_acl_headers=False)
    with (
        workdir() as work,
        aclserver_harness.running_aclserver(
            work,
            shares=[aclserver_harness.share(0, memory=1024 * MIB)],
            ledger_dir=str(work / "ledger"),
            staging_bytes=16 * MIB,  # the production default (spec.DEFAULT_STAGING_BYTES)
        ) as srv,
    ):
        conf = work / "client.conf"
        conf.write_text(clientconf.render(srv.conf()))
        tcp_conf = work / "client-tcp.conf"
        tcp_conf.write_text(clientconf.render(srv.conf(unix=False)))
        sock = work / "echo.sock"
        rows = {
            "C echo": roundtrip(bench, [str(echo_c), str(sock), "21", "37"], sock, conf, args.rounds, args.per),
            "Python echo": roundtrip(bench, [sys.executable, "-c", ECHO, "unix", str(sock)], sock, conf,
                                     args.rounds, args.per),
        }  # fmt: skip
        print(f"small call: {args.rounds} interleaved blocks of {args.per} (first block dropped)")
        print(
            f"{'baseline':12} {'acl p50 us':>11} {'raw p50 us':>11} {'p50 x':>6} {'acl p99':>8} {'raw p99':>8} {'p99 x':>6}"
        )
        for name, got in rows.items():
            a, r = got["acl"], got["raw"]
            print(
                f"{name:12} {med(a) * 1e6:11.1f} {med(r) * 1e6:11.1f} {med(a) / med(r):6.2f}"
                f" {p99(a) * 1e6:8.1f} {p99(r) * 1e6:8.1f} {p99(a) / p99(r):6.2f}"
            )
        copy_rows(bench, conf, args.copy_rounds, "unix socket: sealed memfds the aclserver maps")
        copy_rows(bench, tcp_conf, args.copy_rounds, "TCP: region files on /dev/shm, pread/pwrite")
        with huge_page_server(work) as hp_conf:
            if hp_conf is None:
                print("  (not root: no huge-page tmpfs comparison)")
            else:
                copy_rows(bench, hp_conf, args.copy_rounds, "TCP: region files on a huge=within_size tmpfs")
        rss = {k: int(v) for k, v in (line.split()[1:] for line in run(bench, "rss", conf=conf).splitlines())}
        rss.update(
            {k: int(v) for k, v in (line.split()[1:] for line in run(baseline, conf=conf).splitlines())}
        )
        print(
            f"\nRSS: baseline program {rss['baseline']} kB; with the shim loaded {rss['loaded']} kB"
            f" (+{rss['loaded'] - rss['baseline']}); after aclInit {rss['initialized']} kB"
            f" (+{rss['initialized'] - rss['baseline']}; the staging region is mapped lazily);"
            f" after a malloc and a copy {rss['used']} kB"
        )
        check = clibrary.compile_program(HERE.parent / "tests" / "c" / "acl_check.c", link_library=lib)
        freed = kill_to_free(check, conf, 5)
        print(
            f"\nSIGKILL of a process holding 256 MiB -> another session sees it free: median"
            f" {med(freed) * 1e3:.1f} ms, max {max(freed) * 1e3:.1f} ms ({len(freed)} trials; target < 1 s)"
        )
        four = sessions_throughput(bench, conf, 4, args.seconds)
        sixteen = sessions_throughput(bench, conf, 16, args.seconds)
        print("\nsessions on one claim, aggregate aclrtGetMemInfo calls/s")
        if isinstance(four, float) and isinstance(sixteen, float):
            print(f"  4: {four:,.0f}/s  16: {sixteen:,.0f}/s  ratio {sixteen / four:.2f}")
        else:
            print(f"  4: {four}\n  16: {sixteen}")


if __name__ == "__main__":
    main()
