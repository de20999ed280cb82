"""``ps`` / ``pgrep aclserver`` show one process per share, named with its claim UID, whether the
daemon forked it from its zygote or spawned it."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from tests.integration.daemon_harness import DaemonProc, request, share


@pytest.mark.parametrize("launcher", ["zygote", "spawn"])
def test_pgrep_aclserver_lists_each_claim_once(launcher: str) -> None:
    daemon = DaemonProc(extra=("--launcher", launcher))
    try:
        daemon.start()
        claims = [str(uuid.uuid4()) for _ in range(2)]
        with daemon.client() as c:
            pids = {
                uid: c.register(request(uid, share(2 + i, mem_gib=0.25))).pid for i, uid in enumerate(claims)
            }
        out = subprocess.run(["pgrep", "-a", "aclserver"], capture_output=True, text=True, check=False).stdout
        for uid, pid in pids.items():
            lines = [line for line in out.splitlines() if uid in line]
            assert len(lines) == 1, (uid, out)
            assert lines[0].split()[0] == str(pid)
            assert lines[0].split()[1:3] == ["flexnpu-aclserver", uid]
        ps = subprocess.run(
            ["ps", "-o", "comm=", "-p", ",".join(map(str, pids.values()))],
            capture_output=True,
            text=True,
            check=True,
        )
        assert sorted(ps.stdout.split()) == sorted(f"aclserver-{uid}"[:15] for uid in claims)
    finally:
        daemon.cleanup()
