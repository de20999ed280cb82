"""Bogus claims do not starve real ones (issue 16 item 6): a flood over the real socket next to a real prepare.

A minimal driver on the helper runs as its own process (``flexnpu_testing/toy_driver.py``); eight
callers, each on its own gRPC connection, send prepares of bogus claims (names the API does not
have) while the kubelet simulator prepares one real claim. What is asserted are queueing facts,
read from the fake API server's request log and the driver's journal, not wall-clock times: the
real claim's GET is among the first few GETs served after it arrived (the fetch pool takes turns
between calls instead of serving the flood first), the real prepare returns while the flood is
still being read, no bogus claim ever reaches the driver, what the API proved gone is not asked
for again, malformed references cost no API call, and the wait for the call serializer ends at
the kubelet's deadline with a per-claim answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_kubeletplugin.claims import ClaimRef
from dra_kubeletplugin.protos.gen import dra_v1_pb2, dra_v1_pb2_grpc
from flexnpu_testing import REPO, pythonpath_env
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.kubelet import KubeletSimulator, PluginHandle
from flexnpu_testing.waiting import wait_for
from tests.dra_kubeletplugin.conftest import NAMESPACE, NODE, ClaimMaker

DRIVER = "toy.example.com"
CALLERS = 8
BOGUS_PER_CALL = 400
TURN_BOUND = 48
"""GETs of other calls that may be served between a new call's arrival and its first GET: the GETs
in flight (≤ workers) plus one turn of every other lane (≤ callers * per-call), with room to spare.
Serving the flood first would put thousands there."""


@dataclass
class Toy:
    proc: subprocess.Popen[str]
    journal: Path
    registry: Path
    plugins: Path
    kubelet: PluginHandle

    def journal_lines(self) -> list[dict[str, Any]]:
        if not self.journal.exists():
            return []
        return [json.loads(line) for line in self.journal.read_text().splitlines() if line.strip()]


def _start_toy(api: FakeAPIServer, kubeconfig: Path, short_tmp: Path, *extra: str) -> Toy:
    registry, plugins, journal = short_tmp / "registry", short_tmp / "plugins", short_tmp / "journal.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "flexnpu_testing.toy_driver", "--kubeconfig", str(kubeconfig), "--node", NODE,
         "--driver", DRIVER, "--registry-dir", str(registry), "--plugins-dir", str(plugins),
         "--journal", str(journal), *extra],
        cwd=REPO, env=pythonpath_env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the driver serves and publishes (or exits)
    assert line.strip() == "ready", f"toy driver did not start (exit {proc.poll()})"
    kubelet = KubeletSimulator(registry).wait_for_plugin(DRIVER, timeout=30)
    return Toy(proc, journal, registry, plugins, kubelet)


@pytest.fixture
def toy_factory(api: FakeAPIServer, kubeconfig: Path, short_tmp: Path) -> Iterator[Callable[..., Toy]]:
    started: list[Toy] = []

    def start(*extra: str) -> Toy:
        toy = _start_toy(api, kubeconfig, short_tmp, *extra)
        started.append(toy)
        return toy

    yield start
    for toy in started:
        toy.kubelet.close()
        toy.proc.terminate()
        assert toy.proc.wait(timeout=30) == 0


def _claim_gets(api: FakeAPIServer) -> list[str]:
    """The claim names GET in the request log, in order."""
    prefix = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/"
    return [p.removeprefix(prefix) for m, p in api.request_log() if m == "GET" and p.startswith(prefix)]


def _bogus(caller: int, n: int) -> list[ClaimRef]:
    return [ClaimRef(NAMESPACE, str(uuid.uuid4()), f"bogus-{caller}-{i}") for i in range(n)]


def _flood(dra_socket: Path, batches: list[list[ClaimRef]]) -> tuple[list[threading.Thread], list[Any]]:
    """One thread and one connection per batch, each sending one NodePrepareResources; replies collected."""
    replies: list[Any] = []

    def call(batch: list[ClaimRef]) -> None:
        with grpc.insecure_channel(f"unix:{dra_socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
            claims = [dra_v1_pb2.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in batch]
            replies.append(
                stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=300)
            )

    threads = [threading.Thread(target=call, args=(b,), name=f"flood-{i}") for i, b in enumerate(batches)]
    for t in threads:
        t.start()
    return threads, replies


def _dra_socket(toy: Toy) -> Path:
    return toy.plugins / DRIVER / "dra.sock"


@pytest.mark.timeout(900)
def test_a_real_prepare_is_served_in_turn_next_to_a_flood_of_bogus_claims(
    api: FakeAPIServer, toy_factory: Callable[..., Toy], make_claim: ClaimMaker
) -> None:
    toy = toy_factory()
    real = make_claim("real", devices=[(DRIVER, "dev-0")])
    batches = [_bogus(c, BOGUS_PER_CALL) for c in range(CALLERS)]
    api.clear_request_log()
    threads, replies = _flood(_dra_socket(toy), batches)
    wait_for(
        lambda: len(_claim_gets(api)) >= 2 * CALLERS, what="the flood's GETs to be under way", timeout=120
    )

    before = len(_claim_gets(api))
    result = toy.kubelet.prepare([real])[real.uid]
    after = _claim_gets(api)

    assert result.error == "" and [d.device for d in result.devices] == ["dev-0"]
    position = after.index("real") - before
    assert position <= TURN_BOUND, f"{position} flood GETs were served before the real claim's"
    assert len(after) < CALLERS * BOGUS_PER_CALL, "the real prepare waited for the flood to be read"
    for t in threads:
        t.join(timeout=600)
    assert len(replies) == CALLERS
    answered = {uid: entry for reply in replies for uid, entry in reply.claims.items()}
    assert set(answered) == {r.uid for batch in batches for r in batch}
    assert all("not found" in e.error and not e.devices for e in answered.values())
    reached = [uid for line in toy.journal_lines() for uid in line["uids"]]
    assert reached == [real.uid], "only the real claim reached the driver"


def test_proven_gone_claims_are_not_asked_for_twice_and_malformed_ones_never(
    api: FakeAPIServer, toy_factory: Callable[..., Toy]
) -> None:
    toy = toy_factory()
    bogus = _bogus(0, 200)
    malformed = [ClaimRef(NAMESPACE, f"../x{i}", f"m-{i}") for i in range(200)]
    api.clear_request_log()
    first = toy.kubelet.prepare(bogus)
    assert len(_claim_gets(api)) == 200 and all("not found" in r.error for r in first.values())
    again = toy.kubelet.prepare(bogus + malformed)
    assert len(_claim_gets(api)) == 200, "the second flood of the same gone claims made GETs"
    assert all("not found" in again[r.uid].error for r in bogus)
    assert all("claim.uid" in again[r.uid].error for r in malformed)
    assert toy.journal_lines() == []


def test_a_claim_created_under_a_gone_name_is_served(
    api: FakeAPIServer, toy_factory: Callable[..., Toy], make_claim: ClaimMaker
) -> None:
    """The negative cache is keyed by UID: a new claim with a name that was not found before is fetched."""
    toy = toy_factory()
    gone = ClaimRef(NAMESPACE, str(uuid.uuid4()), "later")
    assert "not found" in toy.kubelet.prepare([gone])[gone.uid].error
    fresh = make_claim("later", devices=[(DRIVER, "dev-1")])
    assert toy.kubelet.prepare([fresh])[fresh.uid].error == ""
    assert "not found" in toy.kubelet.prepare([gone])[gone.uid].error  # the old UID stays gone


@pytest.mark.timeout(300)
def test_the_serializer_wait_ends_at_the_kubelets_deadline(
    api: FakeAPIServer, toy_factory: Callable[..., Toy], make_claim: ClaimMaker
) -> None:
    """A call waiting behind a slow one is answered (per claim, "not started") before its deadline passes."""
    toy = toy_factory("--prepare-seconds", "20")
    slow, waiting = (
        make_claim("slow", devices=[(DRIVER, "dev-0")]),
        make_claim("waiting", devices=[(DRIVER, "dev-1")]),
    )
    threads, replies = _flood(_dra_socket(toy), [[slow]])
    wait_for(
        lambda: [line["uids"] for line in toy.journal_lines()] == [[slow.uid]],
        what="the slow prepare to start",
    )
    with grpc.insecure_channel(f"unix:{_dra_socket(toy)}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
        request = dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace=NAMESPACE, uid=waiting.uid, name="waiting")]
        )
        reply = stub.NodePrepareResources(request, timeout=8.0)  # answered, not DEADLINE_EXCEEDED
    assert "not started" in reply.claims[waiting.uid].error
    assert [line["uids"] for line in toy.journal_lines()] == [[slow.uid]]  # it never reached the driver
    for t in threads:
        t.join(timeout=120)
    assert replies and replies[0].claims[slow.uid].error == ""
