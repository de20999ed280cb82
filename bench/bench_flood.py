"""A real prepare next to a flood of bogus claims (issue 16 item 6): p50/p99 with and without the flood, interleaved.

Real processes and sockets: a minimal driver on the kubelet-plugin helper (``flexnpu_testing/toy_driver.py``)
in its own process, the fake API server in this one, the kubelet simulator over the DRA socket. A
flood is ``--callers`` connections, each sending one NodePrepareResources of ``--bogus`` claims the
API does not have (fresh UIDs every round, so the negative cache cannot answer them). Each round
times ``--samples`` real prepares (a fresh claim each, unprepared after) once alone and once while
a flood is being read, alternating, and prints medians, p99 and the ratio. The issue measured
34 ms alone and 10.7 s next to 8 x 2,000 bogus claims before the helper's fair fetch pool.

    .venv/bin/python bench/bench_flood.py [--rounds 3] [--samples 10] [--callers 8] [--bogus 2000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402

from bench._node import ms, pct  # noqa: E402
from dra_kubeletplugin.claims import ClaimRef  # noqa: E402
from flexnpu_testing.fake_apiserver import FakeAPIServer  # noqa: E402
from flexnpu_testing.waiting import wait_for  # noqa: E402
from tests.dra_kubeletplugin.conftest import NAMESPACE, NODE, claim_body  # noqa: E402
from tests.dra_kubeletplugin.test_flood import DRIVER, _bogus, _claim_gets, _dra_socket, _flood, _start_toy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--bogus", type=int, default=2000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bf", dir="/tmp"))
    alone: list[float] = []
    flooded: list[float] = []
    try:
        with FakeAPIServer() as api:
            core = client.CoreV1Api(api.api_client())
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            toy = _start_toy(api, api.write_kubeconfig(work / "kubeconfig"), work)
            counter = iter(range(1_000_000))

            def one_prepare() -> float:
                name = f"real-{next(counter)}"
                stored = api.put_object("resourceclaims", claim_body(name, devices=[(DRIVER, "dev-0")]))
                ref = ClaimRef(NAMESPACE, stored["metadata"]["uid"], name)
                t0 = time.perf_counter()
                result = toy.kubelet.prepare([ref])[ref.uid]
                took = time.perf_counter() - t0
                if result.error:
                    raise SystemExit(f"real prepare failed: {result.error}")
                toy.kubelet.unprepare([ref])
                return took

            try:
                for r in range(args.rounds):
                    alone += [one_prepare() for _ in range(args.samples)]
                    batches = [_bogus(c + 100 * r, args.bogus) for c in range(args.callers)]
                    api.clear_request_log()
                    threads, _ = _flood(_dra_socket(toy), batches)
                    wait_for(lambda: len(_claim_gets(api)) >= 2 * args.callers, what="the flood", timeout=120)
                    for _ in range(args.samples):
                        flooded.append(one_prepare())
                    still = len(_claim_gets(api)) < args.callers * args.bogus
                    for t in threads:
                        t.join()
                    print(f"round {r + 1}: flood still being read after the samples: {still}", flush=True)
            finally:
                toy.kubelet.close()
                toy.proc.terminate()
                toy.proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med_a, med_f = statistics.median(alone), statistics.median(flooded)
    print(f"real prepare alone       : p50 {ms(med_a)}  p99 {ms(pct(alone, 0.99))}  (n={len(alone)})")
    print(f"real prepare next to flood: p50 {ms(med_f)}  p99 {ms(pct(flooded, 0.99))}  (n={len(flooded)}, "
          f"{args.callers} x {args.bogus} bogus claims)")  # fmt: skip
    print(f"ratio flood/alone: p50 {med_f / med_a:.2f}x  p99 {pct(flooded, 0.99) / pct(alone, 0.99):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
