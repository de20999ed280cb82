"""PyTorch on a share vs the emulated operators called in-process, interleaved (issue 24).

* share: an unmodified torch program (``bench/_torch_share.py``, torch 2.13.0 CPU + torch-npu 2.13.0 from
  ``scripts/torch-venv.sh``) with the share's client libraries preloaded (as the CDI spec's
  ``/etc/ld.so.preload`` does), against a real aclserver over its unix socket: ``x.add_(1)`` on 16 floats
  (per op: K launches then one synchronize, divided by K), and one forward pass of a GPT-style block
  (embedding, layer norm, causal attention, GELU MLP, residuals) with its synchronize;
* in-process: the same operator calls — recorded once from a second aclserver that runs the same program
  (``bench/_torch_record/sitecustomize.py``) — replayed in this process on an ``EmulatedBackend`` die as the
  aclserver runs them: queued on a stream, each computed by the device's worker while it holds the die
  through the same ledger, for max(modelled, measured) (``Streams.submit``, then ``drain``), with one BLAS
  thread as in the aclserver. No torch, no client, no socket, no framing.

Both run on their own emulated die at 100 % compute (fixed), in alternating blocks. Prints medians, p99s
and the ratio of medians (goal for the block: <= 1.2x where its ops hold the die >= 1 ms), and the median of
each block's own ratio (on a machine whose load drifts, the paired figure).
Usage: ``.venv/bin/python bench/bench_torch.py [--blocks 10] [--per 5] [--k 200] [--d 256 --seq 128 --batch 4]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the aclserver computes: one BLAS thread (main.py)

import argparse
import dataclasses
import math
import pickle
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _aclbench import med, p99, workdir

from flexnpu_runtime.aclserver import operators
from flexnpu_runtime.aclserver.backend_emulated import EmulatedBackend
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_testing import aclserver_harness, clibrary
from flexnpu_wire import clientconf

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MIB = 1 << 20
SOC = "Ascend910B3"
"""What the driver writes into client.conf for an A2 die (the harness's conf names none)."""
Call = tuple[str, list[Any], list[Any], dict[str, Any]]
"""(op, inputs, outputs, attributes) as ``_torch_record/sitecustomize.py`` wrote them: each array as the
bytes its view spans (an input's copied, an output's count) and the view's layout, strides kept."""


def torch_python() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "torch-venv.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    return out.stdout.strip().splitlines()[-1] + "/bin/python"


def preload() -> str:
    lib = clibrary.build_library()
    names = (lib.parent / "ld.so.preload").read_text().split()
    return ":".join(str(lib.parent / Path(n).name) for n in names)


class Share:
    """The torch program on a share, driven line by line."""

    def __init__(self, python: str, conf: Path, shape: list[str], env: dict[str, str] | None = None) -> None:
        self.log = (conf.parent / f"{conf.stem}.torch.log").open("w")
        environ = {**os.environ, "FLEXNPU_CONF": str(conf), "LD_PRELOAD": preload(), **(env or {})}
        self.proc = subprocess.Popen(
            [python, str(HERE / "_torch_share.py"), *shape],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=environ,
        )
        first = self._line()
        assert first == "ready", first

    def _line(self) -> str:
        """The next answer (torch_npu prints warnings on stdout too: skipped)."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                rc = self.proc.wait()
                raise RuntimeError(
                    f"the torch program ended (rc {rc}): {Path(self.log.name).read_text()[-3000:]}"
                )
            if not line.startswith(("Warning", "[W", "[ERROR]", "/")):
                return line.strip()

    def ask(self, cmd: str) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return float(self._line())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _records(path: Path) -> list[Call]:
    out: list[Call] = []
    with path.open("rb") as fh:
        while True:
            try:
                out.append(pickle.load(fh))
            except EOFError:
                return out


def record(python: str, work: Path, shape: list[str]) -> tuple[list[Call], list[Call]]:
    """The operator calls of one block forward and of one small add, as the aclserver saw them."""
    rec = work / "calls.pickle"
    env = {
        "PYTHONPATH": f"{HERE / '_torch_record'}:{os.environ.get('PYTHONPATH', '')}",
        "FLEXNPU_BENCH_RECORD": str(rec),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the aclserver process inherits them
    try:
        with aclserver_harness.running_aclserver(
            work / "rec", shares=[aclserver_harness.share(0, die=2, memory=1024 * MIB, compute=100)],
            ledger_dir=str(work / "ledger"),
        ) as server:  # fmt: skip
            conf = work / "rec.conf"
            conf.write_text(clientconf.render(dataclasses.replace(server.conf(tcp=False), soc_name=SOC)))
            for k, v in old.items():  # the torch program itself records nothing
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
            share = Share(python, conf, shape)
            n0 = len(_records(rec))
            share.ask("gpt")
            n1 = len(_records(rec))
            share.ask("op 1")
            share.close()
            calls = _calls(rec)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return calls[n0:n1], calls[n1:]


def _array(rec: Any) -> np.ndarray[Any, Any] | None:
    """A recorded operand, rebuilt with the strides and offset the aclserver's view had."""
    if rec is None:
        return None
    raw, offset, shape, dtype, strides = rec
    if isinstance(raw, int):  # an output: the count of bytes its view spans
        raw = bytes(raw)
    if not raw:
        return np.empty(shape, dtype=dtype)
    return np.ndarray(shape, dtype=dtype, buffer=bytearray(raw), offset=offset, strides=strides)


def _calls(path: Path) -> list[Call]:
    return [(op, [_array(x) for x in ins], outs, attrs) for op, ins, outs, attrs in _records(path)]


def replayer(backend: EmulatedBackend, calls: list[Call]) -> tuple[Callable[[], float], Streams]:
    """Run ``calls`` in this process as the aclserver runs queued operators: queued on a stream in
    order, each computed by the device's worker while it holds the die (``streams._run_operator``),
    into outputs allocated once (as the share's device memory is)."""
    streams = Streams(backend, backend.book, session_id=1, current=lambda: 0)
    stream = streams.create(0)
    outputs = [[_array(o) for o in outs] for _op, _in, outs, _a in calls]

    def compute(call: Call, outs: list[np.ndarray[Any, Any]]) -> int:
        op, inputs, _outs, attrs = call
        return max(1, math.ceil(operators.run(op, inputs, outs, attrs) / 1000))

    def once() -> float:
        t0 = time.perf_counter()
        tasks = []
        for call, outs in zip(calls, outputs, strict=True):
            task = Task(stream, 0, lambda: None, sticky=True)
            task.prepare = lambda c=call, o=outs: compute(c, o)  # type: ignore[misc]
            streams.submit(task, [])
            tasks.append(task)
        streams.drain()
        elapsed = time.perf_counter() - t0
        assert all(t.error is None for t in tasks), [t.error for t in tasks if t.error]
        return elapsed

    return once, streams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per", type=int, default=5, help="block forwards per block")
    parser.add_argument("--k", type=int, default=200, help="small ops per measurement")
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    shape = [str(args.d), str(args.seq), str(args.batch), str(args.heads)]
    python = torch_python()
    with workdir() as work:
        (work / "rec").mkdir()
        gpt_calls, add_calls = record(python, work, shape)
        die_us = [max(1, math.ceil(operators.run(c[0], c[1], [_array(o) for o in c[2]], c[3]) / 1000)) for c in gpt_calls]  # fmt: skip
        spec = aclserver_harness.make_spec(
            work, shares=[aclserver_harness.share(0, die=1, memory=1024 * MIB, compute=100)], ledger_dir=str(work / "ledger")
        )  # fmt: skip
        backend = EmulatedBackend(spec)
        gpt_direct, s1 = replayer(backend, gpt_calls)
        add_direct, s2 = replayer(backend, add_calls * args.k)  # K launches, then the wait: as the share
        with aclserver_harness.running_aclserver(
            work, shares=[aclserver_harness.share(0, die=0, memory=1024 * MIB, compute=100)], ledger_dir=str(work / "ledger")
        ) as server:  # fmt: skip
            conf = work / "client.conf"
            conf.write_text(clientconf.render(dataclasses.replace(server.conf(tcp=False), soc_name=SOC)))
            share = Share(python, conf, shape)
            got: dict[str, list[float]] = {
                "op share": [],
                "op in-process": [],
                "gpt share": [],
                "gpt in-process": [],
            }
            paired: dict[str, list[float]] = {"op": [], "gpt": []}
            try:
                for block in range(args.blocks + 1):
                    times = {
                        "op share": [share.ask(f"op {args.k}")],
                        "op in-process": [add_direct() / args.k],
                        "gpt share": [share.ask("gpt") for _ in range(args.per)],
                        "gpt in-process": [gpt_direct() for _ in range(args.per)],
                    }
                    if block:  # the first block warms everything up
                        for name, xs in times.items():
                            got[name] += xs
                        for kind in ("op", "gpt"):  # the block's own ratio: load drifts slower than a block
                            paired[kind].append(
                                med(times[f"{kind} share"]) / med(times[f"{kind} in-process"])
                            )
            finally:
                share.close()
                s1.close()
                s2.close()
                backend.close()
    load = os.getloadavg()
    print(
        f"PyTorch on a share vs in-process, {args.blocks} interleaved blocks; load average {load[0]:.1f} {load[1]:.1f}"
    )
    print(f"  ops: {add_calls[0][0] if add_calls else '?'} (small); block d={args.d} seq={args.seq} batch={args.batch}:"
          f" {len(gpt_calls)} ops, {sum(die_us) / 1e3:.2f} ms of modelled die time, {sum(u >= 1000 for u in die_us)} ops >= 1 ms")  # fmt: skip
    for kind, unit, scale in (("op", "us", 1e6), ("gpt", "ms", 1e3)):
        share_xs, direct_xs = got[f"{kind} share"], got[f"{kind} in-process"]
        print(
            f"  {kind:4} share p50 {med(share_xs) * scale:9.2f} {unit}  p99 {p99(share_xs) * scale:9.2f} {unit}   "
            f"in-process p50 {med(direct_xs) * scale:9.2f} {unit}  p99 {p99(direct_xs) * scale:9.2f} {unit}   "
            f"ratio {med(share_xs) / med(direct_xs):.2f}x (per block: p50 {med(paired[kind]):.2f}x)"
        )


if __name__ == "__main__":
    main()
