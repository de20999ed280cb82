"""The flags node and daemon share: one declaration, every old spelling, the same answer from both CLIs."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver import config
from dra_driver.errors import ErrorCode, InvalidInput
from flexnpu_runtime.daemon import main as daemon_main
from tests.unit.test_config import from_args

Build = Callable[[Sequence[str], Mapping[str, str]], config.SharedSettings]


def _node(argv: Sequence[str], env: Mapping[str, str]) -> config.SharedSettings:
    cfg = from_args(["--node-name", "n", *argv], dict(env))
    return config.SharedSettings(cfg.paths.run_dir, cfg.paths.shm_root, cfg.max_shares_per_die)


def _daemon(argv: Sequence[str], env: Mapping[str, str]) -> config.SharedSettings:
    cfg = daemon_main.build_config(["--shm-mount", "never", *argv], dict(env))
    s = cfg.settings
    return config.SharedSettings(s.run_dir, s.shm_root, s.max_shares_per_die)


CLIS = [
    pytest.param(_node, "FLEXNPU_", id="node"),
    pytest.param(_daemon, "FLEXNPU_DAEMON_", id="daemon"),
]

# (spelling on the command line, its environment twin without the prefix, a value, the field, its value)
SPELLINGS = [
    pytest.param("run-dir", "RUN_DIR", "/r/x", "run_dir", Path("/r/x"), id="run-dir"),
    pytest.param("shm-root", "SHM_ROOT", "/s/x", "shm_root", Path("/s/x"), id="shm-root"),
    pytest.param("shm-dir", "SHM_DIR", "/s/y", "shm_root", Path("/s/y"), id="shm-dir-alias"),
    pytest.param("max-shares-per-die", "MAX_SHARES_PER_DIE", "7", "max_shares_per_die", 7, id="max-shares"),
]


def test_both_clis_take_the_one_declaration() -> None:
    daemon_flags = {f.name: f for f in daemon_main.FLAGS}
    node_flags = {f.name: f for f in config.PLUGIN_FLAGS}
    for shared in config.SHARED_FLAGS:
        assert node_flags[shared.name] is shared
        assert daemon_flags[shared.name] == shared.with_env_prefix("FLEXNPU_DAEMON_")
        assert (daemon_flags[shared.name].default, daemon_flags[shared.name].help) == (
            shared.default,
            shared.help,
        )


@pytest.mark.parametrize(("build", "prefix"), CLIS)
def test_defaults_are_the_same(build: Build, prefix: str) -> None:
    assert build([], {}) == config.SharedSettings(Path("/var/run/flexnpu"), Path("/dev/shm/flexnpu"), 63)


@pytest.mark.parametrize(("build", "prefix"), CLIS)
@pytest.mark.parametrize(("flag", "env", "value", "attr", "expected"), SPELLINGS)
def test_flag_spelling(
    build: Build, prefix: str, flag: str, env: str, value: str, attr: str, expected: Any
) -> None:
    assert getattr(build([f"--{flag}", value], {}), attr) == expected


@pytest.mark.parametrize(("build", "prefix"), CLIS)
@pytest.mark.parametrize(("flag", "env", "value", "attr", "expected"), SPELLINGS)
def test_environment_twin(
    build: Build, prefix: str, flag: str, env: str, value: str, attr: str, expected: Any
) -> None:
    assert getattr(build([], {prefix + env: value}), attr) == expected


@pytest.mark.parametrize(("build", "prefix"), CLIS)
def test_canonical_spelling_beats_the_old_one_in_the_environment(build: Build, prefix: str) -> None:
    env = {f"{prefix}SHM_ROOT": "/new", f"{prefix}SHM_DIR": "/old"}
    assert build([], env).shm_root == Path("/new")
    assert build(["--shm-dir", "/flag"], env).shm_root == Path("/flag")


@pytest.mark.parametrize(("build", "prefix"), CLIS)
def test_relative_directories_are_made_absolute(build: Build, prefix: str) -> None:
    assert build(["--run-dir", "rel/run"], {}).run_dir == Path.cwd() / "rel/run"


@pytest.mark.parametrize(("build", "prefix"), CLIS)
@pytest.mark.parametrize(
    ("argv", "env", "field", "text"),
    [
        pytest.param(["--max-shares-per-die", "0"], {}, "max-shares-per-die", "1..1024, got '0'", id="zero"),
        pytest.param(["--max-shares-per-die", "2.5"], {}, "max-shares-per-die", "got '2.5'", id="fraction"),
        pytest.param(
            ["--max-shares-per-die", "1025"], {}, "max-shares-per-die", "got '1025'", id="above-ledger"
        ),
        pytest.param([], {"MAX_SHARES_PER_DIE": "many"}, "max-shares-per-die", "got 'many'", id="env-word"),
        pytest.param(
            ["--shm-dir", ""], {}, "shm-root", "expected a directory path, got ''", id="empty-alias"
        ),
        pytest.param([], {"RUN_DIR": ""}, "run-dir", "expected a directory path, got ''", id="empty-env"),
    ],
)
def test_bad_value_gets_the_same_error(
    build: Build, prefix: str, argv: list[str], env: dict[str, str], field: str, text: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        build(argv, {prefix + k: v for k, v in env.items()})
    assert info.value.field == field
    assert info.value.code is ErrorCode.INVALID_CONFIG
    assert text in str(info.value)


@pytest.mark.parametrize(("build", "prefix"), CLIS)
def test_help_names_the_old_spelling(build: Build, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build(["--help"], {})
    out = " ".join(capsys.readouterr().out.split())
    assert f"--shm-dir / {prefix}SHM_DIR still work" in out
    assert f"env {prefix}SHM_ROOT" in out
