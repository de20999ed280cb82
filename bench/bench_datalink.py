"""Data-link throughput: 64 MiB host->device and back through the aclserver's shared memory,
against an in-process numpy copy of the same buffer measured in the same run (target >= 0.7x).

Two client paths: a ``malloc_host`` buffer (lives in /dev/shm: the server copies straight from
it, zero copy on the client) and a plain numpy array (copied through the staging region in
chunks: two copies). The baseline and every path are measured in interleaved rounds (``--rounds``
rounds of ``--reps`` copies each, order rotating), so machine drift lands on all of them.
Usage: ``.venv/bin/python bench/bench_datalink.py [--rounds 5] [--reps 3]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _aclbench import med, p99, workdir

from flexnpu_client import Session
from flexnpu_testing import aclserver_harness
from flexnpu_wire import launch
from flexnpu_wire.codes import MemcpyKind

SIZE = 64 << 20
H2D, D2H = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST


def timed(fn, reps: int) -> list[float]:  # type: ignore[no-untyped-def]
    fn()  # warm
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def gbps(seconds: float, nbytes: int = SIZE) -> float:
    return nbytes / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--no-shm-mount", dest="shm_mount", action="store_false", help="plain /dev/shm dir (4 KiB pages)"
    )
    args = parser.parse_args()
    src = np.random.default_rng(1).integers(0, 255, SIZE, dtype=np.uint8)
    dst = np.empty_like(src)
    with (
        workdir() as work,
        aclserver_harness.running_aclserver(
            work,
            shares=[aclserver_harness.share(0, memory=2 * SIZE + (1 << 20))],
            ledger_dir=str(work / "ledger"),
            staging_bytes=launch.DEFAULT_STAGING_BYTES,
            # the claim's own tmpfs, as flexnpu-daemon makes it (huge pages; needs root)
            shm_mount_bytes=(3 * SIZE) if args.shm_mount else None,
        ) as srv,
        Session.open(srv.conf()) as s,
    ):
        s.init()
        s.set_device(0)
        dev = s.malloc(SIZE)
        hp = s.malloc_host(SIZE)
        view = np.frombuffer(s.host_view(hp), dtype=np.uint8)
        view[:] = src
        paths = [
            ("baseline", lambda: np.copyto(dst, src)),
            ("malloc_host H2D", lambda: s.memcpy(dev, SIZE, hp, SIZE, H2D)),
            ("malloc_host D2H", lambda: s.memcpy(hp, SIZE, dev, SIZE, D2H)),
            ("numpy staged H2D", lambda: s.memcpy(dev, SIZE, src, SIZE, H2D)),
            ("numpy staged D2H", lambda: s.memcpy(dst, SIZE, dev, SIZE, D2H)),
        ]
        rows: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for name, fn in paths[r % len(paths) :] + paths[: r % len(paths)]:
                rows.setdefault(name, []).extend(timed(fn, args.reps))
        base = rows.pop("baseline")
        assert (dst == src).all() and (view == src).all()
        rows["malloc_host H2D+D2H"] = [
            a + b for a, b in zip(rows["malloc_host H2D"], rows["malloc_host D2H"], strict=True)
        ]
        rows["numpy staged H2D+D2H"] = [
            a + b for a, b in zip(rows["numpy staged H2D"], rows["numpy staged D2H"], strict=True)
        ]
    print(
        f"64 MiB copies, {args.rounds} interleaved rounds x {args.reps} reps per path"
        " (median / p99 of time; GB/s and ratio from the median)"
    )
    print(f"{'path':24} {'median ms':>10} {'p99 ms':>8} {'GB/s':>6} {'vs numpy':>9}")
    print(
        f"{'numpy copyto (baseline)':24} {med(base) * 1e3:10.2f} {p99(base) * 1e3:8.2f} {gbps(med(base)):6.2f} {1.0:9.2f}"
    )
    for name, xs in rows.items():
        ref = med(base) * (2 if "+" in name else 1)
        print(
            f"{name:24} {med(xs) * 1e3:10.2f} {p99(xs) * 1e3:8.2f} {gbps(med(xs)) * (2 if '+' in name else 1):6.2f}"
            f" {ref / med(xs):9.2f}"
        )


if __name__ == "__main__":
    main()
