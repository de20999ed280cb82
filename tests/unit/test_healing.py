"""The node's aclserver watch: what it writes to a claim's Ready condition, and when it heals (no processes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from dra_driver.daemon_api.values import Endpoints, EntityInfo, EntityState, RegisterResult
from dra_driver.errors import ErrorCode, Unavailable
from kubeletplugin import healing

UID = "c1"


def entity(state: EntityState, pid: int, message: str = "") -> EntityInfo:
    return EntityInfo(UID, "ns", "n", (), pid, state, Endpoints(), message=message)


@dataclass
class World:
    """The daemon's answers, the preparer's heal and status writes, and a clock."""

    answers: list[list[EntityInfo] | None]
    heals: list[str] = field(default_factory=list)
    ready: list[tuple[bool, str]] = field(default_factory=list)
    healed_pid: int = 300
    now: float = 0.0

    def list(self) -> list[EntityInfo]:
        answer = self.answers.pop(0)
        if answer is None:
            raise Unavailable("daemon down", code=ErrorCode.DAEMON_UNAVAILABLE)
        return answer

    def heal(self, uid: str, clog: Any, *, get_claim: Any) -> RegisterResult | None:
        self.heals.append(uid)
        return RegisterResult(uid, self.healed_pid, Endpoints())

    def set_ready(self, uid: str, ready: bool, reason: str, message: str) -> bool:
        self.ready.append((ready, reason))
        return True

    def read(self) -> Any:
        entry = SimpleNamespace(
            state="PrepareCompleted",
            namespace="ns",
            name="n",
            registration=SimpleNamespace(pid=100),
            effect=lambda kind: [kind],
        )
        return SimpleNamespace(claims={UID: entry})


def run(world: World, looks: int) -> World:
    watch = healing.AclserverWatch(
        preparer=world,  # type: ignore[arg-type]
        daemon=world,  # type: ignore[arg-type]
        store=world,  # type: ignore[arg-type]
        get_claim=lambda namespace, name: {},
        clock=lambda: world.now,
    )
    for _ in range(looks):
        watch.look()
        world.now += healing.ACLSERVER_PERIOD
    return world


RUNNING = entity(EntityState.RUNNING, 100)
EXITED = entity(EntityState.EXITED, 100, "exited with status -9")


@pytest.mark.parametrize(
    ("answers", "heals", "ready"),
    [
        pytest.param([[RUNNING], [RUNNING]], 0, [], id="serving-writes-nothing"),
        pytest.param(
            [[], [entity(EntityState.RUNNING, 300)]],
            1,
            [(True, "AclserverRestarted")],
            id="unknown-to-the-daemon-healed-at-once",
        ),
        pytest.param(
            [[EXITED], [EXITED], [entity(EntityState.RUNNING, 300)]],
            1,
            [(False, "AclserverDown"), (True, "AclserverRestarted")],
            id="exited-twice-past-the-budget-healed",
        ),
        pytest.param(
            [[EXITED], [entity(EntityState.RUNNING, 200)]],
            0,
            [(False, "AclserverDown"), (True, "AclserverRestarted")],
            id="the-daemon-restarted-it-itself",
        ),
        pytest.param([None, None], 0, [], id="daemon-unreachable-changes-nothing"),
        pytest.param(
            [[entity(EntityState.UNKNOWN, 100, "does not answer PING")], [RUNNING]],
            0,
            [(False, "AclserverDown"), (True, "Prepared")],
            id="silent-then-serving-again-same-pid",
        ),
    ],
)
def test_watch(answers: list[list[EntityInfo] | None], heals: int, ready: list[tuple[bool, str]]) -> None:
    world = run(World(answers=answers), len(answers))
    assert (len(world.heals), world.ready) == (heals, ready)


def test_heals_of_one_claim_back_off() -> None:
    """An aclserver that dies again at once is not restarted in a loop: 2 s, then 4 s, 8 s, … between heals."""
    world = World(answers=[[] for _ in range(12)])
    run(world, 12)  # 12 looks 2 s apart, the daemon never keeps it
    assert len(world.heals) == 4  # at 0 s, 2 s, 6 s, 14 s; the next one is due at 30 s
