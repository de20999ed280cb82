"""libascendcl.so refuses bad input with clear codes and messages, within a bounded time.

A missing or malformed client.conf, a wrong token, an aclserver that is down, killed or stopped:
each gets the documented ACL code and a message naming the file, field or claim, and no call
waits past its timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexnpu_testing import aclserver_harness
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from tests.c.conftest import Claim, Interactive, run

INVALID_FILE, PARSE_FILE, MISSING_ATTR, ATTR_INVALID = 100003, 100006, 100007, 100008
INTERNAL, NO_PERMISSION, UNINITIALIZE = 500000, 207006, 100001


def _stop(pid: int) -> None:
    """SIGSTOP and wait until the kernel reports every thread of ``pid`` stopped."""
    os.kill(pid, signal.SIGSTOP)

    def stopped() -> bool:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks)

    wait_for(stopped, what=f"pid {pid} stopped", timeout=10)


def _doc(claim: Claim) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(claim.conf.read_text())
    return doc


def _without(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != key}


BAD_CONFS = [
    pytest.param(lambda d: "{not json", PARSE_FILE, "is not valid JSON", id="not-json"),
    pytest.param(lambda d: "[1, 2]", PARSE_FILE, "must hold a JSON object", id="not-an-object"),
    pytest.param(lambda d: {**d, "version": 2}, ATTR_INVALID, "field version", id="version-2"),
    pytest.param(lambda d: _without(d, "version"), MISSING_ATTR, "field version", id="no-version"),
    pytest.param(lambda d: _without(d, "token"), MISSING_ATTR, "field token", id="no-token"),
    pytest.param(lambda d: {**d, "token": 7}, ATTR_INVALID, "field token", id="token-not-a-string"),
    pytest.param(lambda d: {**d, "claim_uid": ""}, ATTR_INVALID, "field claim_uid", id="empty-claim-uid"),
    pytest.param(lambda d: {**d, "shm_dir": "rel/dir"}, ATTR_INVALID, "field shm_dir", id="relative-shm-dir"),
    pytest.param(lambda d: {**d, "endpoints": {}}, MISSING_ATTR, "field endpoints", id="no-endpoint"),
    pytest.param(
        lambda d: {**d, "endpoints": {"udp": "x"}}, ATTR_INVALID, "field endpoints.udp", id="unknown-endpoint"
    ),
    pytest.param(
        lambda d: {**d, "endpoints": {"tcp": "localhost"}},
        ATTR_INVALID,
        "field endpoints.tcp",
        id="tcp-no-port",
    ),
    pytest.param(
        lambda d: {**d, "endpoints": {"unix": "sock"}},
        ATTR_INVALID,
        "field endpoints.unix",
        id="unix-relative",
    ),
    pytest.param(lambda d: {**d, "shares": []}, ATTR_INVALID, "field shares", id="no-shares"),
    pytest.param(
        lambda d: {**d, "shares": [{"virtual_id": 1}]},
        ATTR_INVALID,
        "field shares[0].virtual_id",
        id="bad-vid",
    ),
    pytest.param(lambda d: json.dumps(d) + " x", PARSE_FILE, "extra data", id="trailing-garbage"),
    pytest.param(lambda d: '{"a": "\\ud800"}', PARSE_FILE, "surrogate", id="bad-unicode"),
    pytest.param(lambda d: "[" * 100 + "]" * 100, PARSE_FILE, "nested too deeply", id="deep-nesting"),
]


@pytest.mark.parametrize(("mutate", "code", "text"), BAD_CONFS)
def test_malformed_client_conf(
    acl_check: Path,
    claim: Claim,
    tmp_path: Path,
    mutate: Callable[[dict[str, Any]], Any],
    code: int,
    text: str,
) -> None:
    bad = mutate(_doc(claim))
    conf = tmp_path / "client.conf"
    conf.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    values = run(acl_check, "init", conf=conf).values
    assert int(values["init_code"]) == code, values
    assert f"client.conf {conf}" in values["init_msg"] and text in values["init_msg"], values


def test_python_reader_refuses_the_same_files(claim: Claim, tmp_path: Path) -> None:
    """The C reader is not laxer than the Python one (flexnpu_wire.clientconf.parse) on the same inputs."""
    for param in BAD_CONFS:
        mutate = param.values[0]
        bad = mutate(_doc(claim))  # type: ignore[operator]
        text = bad if isinstance(bad, str) else json.dumps(bad)
        with pytest.raises(Exception):  # noqa: B017 - InvalidInput or a JSON error, both refusals
            clientconf.parse(text, source="x")


def test_missing_client_conf_and_symlink(acl_check: Path, claim: Claim, tmp_path: Path) -> None:
    missing = tmp_path / "nope.conf"
    values = run(acl_check, "init", conf=missing).values
    assert int(values["init_code"]) == INVALID_FILE
    assert f"cannot read client.conf {missing}: No such file or directory" in values["init_msg"]
    link = tmp_path / "link.conf"
    link.symlink_to(claim.conf)
    values = run(acl_check, "init", conf=link).values
    assert int(values["init_code"]) == INVALID_FILE, values
    assert "symbolic links" in values["init_msg"], values


def test_wrong_token_is_refused_by_the_server(acl_check: Path, claim: Claim, tmp_path: Path) -> None:
    conf = tmp_path / "client.conf"
    conf.write_text(json.dumps({**_doc(claim), "token": "0" * 32}))
    values = run(acl_check, "init", conf=conf).values
    assert int(values["init_code"]) == NO_PERMISSION, values
    assert claim.server.spec.claim_uid in values["init_msg"] and "invalid token" in values["init_msg"]


def test_a_shm_dir_without_the_data_link(acl_check: Path, claim: Claim, tmp_path: Path) -> None:
    """The staging file the aclserver names is not in the client's shm dir: a clear refusal."""
    conf = tmp_path / "client.conf"
    conf.write_text(json.dumps({**_doc(claim), "shm_dir": str(tmp_path)}))
    values = run(acl_check, "init", conf=conf).values
    assert int(values["init_code"]) == INTERNAL, values
    assert "cannot open data-link region" in values["init_msg"] and str(tmp_path) in values["init_msg"]
    run(acl_check, "quota", str(64 << 20), "1", conf=claim.conf).ok()  # the server released that session


def test_a_long_token_is_sent_whole(acl_check: Path, claim: Claim, tmp_path: Path) -> None:
    """A 512-character token (longer than the claim's) reaches the server intact and is refused as
    wrong, not cut short by the client; one past the client's limit is refused locally."""
    conf = tmp_path / "client.conf"
    conf.write_text(json.dumps({**_doc(claim), "token": "f" * 512}))
    values = run(acl_check, "init", conf=conf).values
    assert int(values["init_code"]) == NO_PERMISSION and "invalid token" in values["init_msg"], values
    conf.write_text(json.dumps({**_doc(claim), "token": "f" * 612}))
    values = run(acl_check, "init", conf=conf).values
    assert int(values["init_code"]) == ATTR_INVALID and "field token" in values["init_msg"], values


def test_no_aclserver_listening_fails_fast(acl_check: Path, claim: Claim, tmp_path: Path) -> None:
    with socket.socket() as s:  # a TCP port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "client.conf"
    doc = {**_doc(claim), "endpoints": {"unix": str(tmp_path / "gone.sock"), "tcp": f"127.0.0.1:{port}"}}
    conf.write_text(json.dumps(doc))
    values = run(acl_check, "init", conf=conf, timeout=10).values
    assert int(values["init_code"]) == INTERNAL, values
    assert "no aclserver endpoint" in values["init_msg"] and "Connection refused" in values["init_msg"]
    assert float(values["init_ms"]) < 5000


def test_stopped_aclserver_bounded_by_the_connect_timeout(acl_check: Path, claim: Claim) -> None:
    _stop(claim.server.proc.pid)
    try:
        values = run(acl_check, "init", conf=claim.conf, FLEXNPU_CONNECT_TIMEOUT_MS="300", timeout=20).values
    finally:
        os.kill(claim.server.proc.pid, signal.SIGCONT)
    assert int(values["init_code"]) == INTERNAL, values
    assert "no reply in time" in values["init_msg"], values
    assert 250 <= float(values["init_ms"]) < 3000, values


def test_aclserver_killed_mid_session(
    acl_check: Path, claim: Claim, interactive: Callable[..., Interactive]
) -> None:
    prog = interactive(acl_check, "afterline", conf=claim.conf)
    prog.read_until("ready")
    claim.server.stop(signal.SIGKILL)
    prog.send("go\n")
    values = prog.finish().values
    assert int(values["first_code"]) == INTERNAL, values
    assert "the aclserver closed the connection" in values["first_msg"], values
    assert float(values["first_ms"]) < 2000
    assert int(values["second_code"]) == INTERNAL and "was lost" in values["second_msg"], values
    assert int(values["finalize_code"]) == 0


def test_stopped_aclserver_bounded_by_the_call_timeout(
    acl_check: Path, claim: Claim, interactive: Callable[..., Interactive]
) -> None:
    prog = interactive(acl_check, "afterline", conf=claim.conf, FLEXNPU_CALL_TIMEOUT_MS="400")
    prog.read_until("ready")
    _stop(claim.server.proc.pid)
    try:
        prog.send("go\n")
        values = prog.finish().values
    finally:
        os.kill(claim.server.proc.pid, signal.SIGCONT)
    assert int(values["first_code"]) == INTERNAL and "no reply in time" in values["first_msg"], values
    assert 350 <= float(values["first_ms"]) < 3000, values


def test_fork_child_gets_a_clean_error_and_the_parent_keeps_its_session(
    acl_check: Path, claim: Claim
) -> None:
    res = run(acl_check, "fork", conf=claim.conf).ok()
    v = res.values
    assert int(v["child_malloc_code"]) == UNINITIALIZE
    assert (
        "was forked from pid" in v["child_malloc_msg"]
        and "call aclInit in this process" in v["child_malloc_msg"]
    )
    assert int(v["child_free_parent_code"]) == UNINITIALIZE
    # its own session: granted by a multi-session aclserver, refused (207005, one client) by a
    # single-session one; never the parent's socket
    assert int(v["child_init_code"]) in (0, 207005), v
    if int(v["child_init_code"]) == 0:
        assert int(v["child_own_malloc_code"]) == 0 and int(v["child_finalize_code"]) == 0
    else:
        assert "already serves a client" in v["child_init_msg"]


def test_fork_does_not_wait_for_another_threads_call(acl_check: Path, claim: Claim) -> None:
    """Another thread waits in aclrtSynchronizeStream for a 3 s kernel, holding the client's lock:
    the child is forked, refused and gone while that call is still waiting."""
    res = run(acl_check, "forkbusy", "3000000", conf=claim.conf).ok()
    assert int(res.values["child_malloc_code"]) == UNINITIALIZE
    assert res.values["sync_done_when_child_exited"] == "0", res.values


def test_a_full_aclserver_says_so(acl_check: Path, claim_factory: Callable[..., Claim]) -> None:
    """Past max_connections the aclserver answers with an Op.NONE refusal and closes: aclInit
    reports its reason (207005, "too many connections"), however the race with HELLO goes."""
    claim = claim_factory([aclserver_harness.share(0, memory=64 << 20)], max_sessions=1, max_connections=2)
    holders = []
    try:
        for _ in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(claim.server.spec.unix_socket)
            holders.append(s)
        for _ in range(3):
            values = run(acl_check, "init", conf=claim.conf).values
            assert int(values["init_code"]) == 207005, values
            assert "too many connections" in values["init_msg"], values
    finally:
        for s in holders:
            s.close()
