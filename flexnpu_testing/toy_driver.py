"""A minimal DRA driver on the kubelet-plugin helper, as a real process: the helper's tests and bench run it.

It knows nothing of NPUs. It publishes ``--devices`` devices ``dev-<i>`` in one pool named after
the node, and prepares a claim by answering one CDI ID ``<driver>/dev=<device>`` per allocated
device of this driver (it writes no CDI spec: the tests check the kubelet face, not a runtime).
Each prepare and unprepare appends one JSON line (verb, claim UIDs, monotonic time) to
``--journal``, so a test can see which calls reached the driver and in which order.

    python -m flexnpu_testing.toy_driver --kubeconfig KC --node node-1 --registry-dir R --plugins-dir P \\
        --journal J [--driver toy.example.com] [--devices 4] [--pod-uid U] [--prepare-seconds 0]

It prints ``ready`` once serving and publishing; SIGTERM stops it (sockets removed).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

import dra_kubeletplugin
from dra_kubeletplugin import ClaimRef, DriverResources, Pool, PreparedDevice, PrepareResult, ResourceClaim
from dra_kubeletplugin.kubeapi import KubeClient

__all__ = ["ToyDriver", "main", "toy_pool"]


def toy_pool(node: str, devices: int) -> Pool:
    """``devices`` plain devices ``dev-<i>`` with one int attribute each."""
    return Pool(
        name=node,
        slices=[
            {"devices": [{"name": f"dev-{i}", "attributes": {"index": {"int": i}}} for i in range(devices)]}
        ],
    )


class ToyDriver:
    """``dra_kubeletplugin.DRAPlugin``: every allocated device of this driver becomes one CDI ID."""

    def __init__(
        self, driver_name: str, *, journal: Path | None = None, prepare_seconds: float = 0.0
    ) -> None:
        self.driver_name = driver_name
        self.journal = journal
        self.prepare_seconds = prepare_seconds
        self._lock = threading.Lock()

    def prepare_resource_claims(self, claims: Sequence[ResourceClaim]) -> Mapping[str, PrepareResult]:
        self._record("prepare", [c.uid for c in claims])
        if self.prepare_seconds:
            time.sleep(self.prepare_seconds)  # a slow driver, for the serializer tests
        out: dict[str, PrepareResult] = {}
        for claim in claims:
            devices = tuple(
                PreparedDevice(
                    request_names=(str(r.get("request", "")),),
                    pool=str(r.get("pool", "")),
                    device=str(r.get("device", "")),
                    cdi_device_ids=(f"{self.driver_name}/dev={r.get('device', '')}",),
                )
                for r in claim.results(self.driver_name)
            )
            out[claim.uid] = PrepareResult(devices=devices)
        return out

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        self._record("unprepare", [c.uid for c in claims])
        return {c.uid: "" for c in claims}

    def _record(self, verb: str, uids: list[str]) -> None:
        if self.journal is None:
            return
        line = json.dumps({"verb": verb, "uids": uids, "at": time.monotonic()})
        with self._lock, self.journal.open("a") as fh:
            fh.write(line + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flexnpu_testing.toy_driver", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument("--driver", default="toy.example.com")
    parser.add_argument("--registry-dir", type=Path, required=True)
    parser.add_argument("--plugins-dir", type=Path, required=True)
    parser.add_argument("--journal", type=Path)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--pod-uid")
    parser.add_argument("--prepare-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    driver = ToyDriver(args.driver, journal=args.journal, prepare_seconds=args.prepare_seconds)
    helper = dra_kubeletplugin.start(
        driver,
        driver_name=args.driver,
        node_name=args.node,
        kube=KubeClient.from_config(args.kubeconfig),
        pod_uid=args.pod_uid,
        registry_dir=args.registry_dir,
        plugins_dir=args.plugins_dir,
    )
    helper.publish_resources(DriverResources.single(toy_pool(args.node, args.devices)))
    print("ready", flush=True)
    stop.wait()
    helper.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
