"""client.conf: render/parse round trip and one clear error per malformed field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver import wirefiles
from dra_driver.errors import InvalidInput
from flexnpu_wire import clientconf
from flexnpu_wire.clientconf import ClientConf, Endpoints, ShareInfo
from flexnpu_wire.codes import Policy
from flexnpu_wire.errors import ContractError


def parse_client_conf(text: str, *, source: str) -> ClientConf:
    """client.conf text parsed as the driver reads the file (``wirefiles.load_client_conf``): a broken
    document becomes InvalidInput naming ``source``, the claim and the field."""
    try:
        return clientconf.parse(text, source=source)
    except ContractError as exc:
        raise wirefiles.invalid_input(exc) from exc


CONF = ClientConf(
    claim_uid="c-1",
    token="ab" * 16,
    endpoints=Endpoints(unix="/dev/shm/flexnpu/aclserver.sock", tcp="10.231.0.1:45678"),
    shm_dir="/dev/shm/flexnpu",
    shares=(
        ShareInfo(0, 1 << 30, 30, Policy.FIXED),
        ShareInfo(1, 1 << 29, 0, Policy.FIXED, memory_only=True),
    ),
    soc_name="Ascend910B3",
)


def _doc() -> dict[str, object]:
    return json.loads(clientconf.render(CONF))


def test_round_trip() -> None:
    assert parse_client_conf(clientconf.render(CONF), source="x") == CONF
    assert CONF.endpoints.tcp_address == ("10.231.0.1", 45678)


def test_soc_name_is_optional() -> None:
    doc = _set("soc_name", KeyError)
    assert parse_client_conf(json.dumps(doc), source="x").soc_name == ""
    assert json.loads(clientconf.render(CONF))["soc_name"] == "Ascend910B3"


def test_unix_only_and_tcp_only() -> None:
    for ep in (Endpoints(unix="/a.sock"), Endpoints(tcp="[::1]:5")):
        conf = ClientConf("c", "ab" * 8, ep, "/dev/shm/x", CONF.shares[:1])
        assert parse_client_conf(clientconf.render(conf), source="x") == conf
    assert Endpoints(tcp="[::1]:5").tcp_address == ("::1", 5)


def _set(path: str, value: object) -> dict[str, object]:
    doc = _doc()
    target: dict[str, object] = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]  # type: ignore[index,assignment]
    if value is KeyError:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        pytest.param(_set("version", 2), "version", id="wrong-version"),
        pytest.param(_set("version", KeyError), "version", id="missing-version"),
        pytest.param(_set("token", KeyError), "token", id="missing-token"),
        pytest.param(_set("token", ""), "token", id="empty-token"),
        pytest.param(_set("claim_uid", 5), "claim_uid", id="claim-not-string"),
        pytest.param(_set("shm_dir", "relative"), "shm_dir", id="relative-shm-dir"),
        pytest.param(_set("endpoints", {}), "endpoints", id="no-endpoint"),
        pytest.param(_set("endpoints", "x"), "endpoints", id="endpoints-not-object"),
        pytest.param(_set("endpoints.tcp", "nohost"), "endpoints.tcp", id="tcp-without-port"),
        pytest.param(_set("endpoints.tcp", "h:99999"), "endpoints.tcp", id="tcp-port-range"),
        pytest.param(_set("endpoints.unix", "rel.sock"), "endpoints.unix", id="unix-relative"),
        pytest.param(_set("endpoints.grpc", "x"), "endpoints.grpc", id="unknown-endpoint"),
        pytest.param(_set("shares", []), "shares", id="no-shares"),
        pytest.param(_set("shares.0.policy", "greedy"), "shares[0].policy", id="bad-policy"),
        pytest.param(
            _set("shares.0.compute_percent", 101), "shares[0].compute_percent", id="compute-over-100"
        ),
        pytest.param(_set("shares.0.memory_bytes", 0), "shares[0].memory_bytes", id="zero-memory"),
        pytest.param(_set("shares.0.memory_only", "yes"), "shares[0].memory_only", id="memory-only-not-bool"),
        pytest.param(_set("shares.1.virtual_id", 0), "shares", id="duplicate-virtual-id"),
        pytest.param(_set("soc_name", 910), "soc_name", id="soc-not-string"),
        pytest.param(_set("soc_name", "A" * 64), "soc_name", id="soc-over-the-c-clients-63"),
    ],
)
def test_malformed_fields_are_named(doc: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_client_conf(json.dumps(doc), source="/etc/flexnpu/client.conf")
    assert err.value.field == field
    assert "/etc/flexnpu/client.conf" in str(err.value)


@pytest.mark.parametrize("text", [pytest.param("{", id="not-json"), pytest.param("[]", id="not-object")])
def test_not_a_document(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"client\.conf src"):
        parse_client_conf(text, source="src")


def test_load_explicit_env_and_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "client.conf"
    path.write_text(clientconf.render(CONF))
    assert wirefiles.load_client_conf(path) == CONF
    monkeypatch.setenv("FLEXNPU_CONF", str(path))
    assert wirefiles.load_client_conf() == CONF
    with pytest.raises(InvalidInput, match=r"cannot read client\.conf .*nope"):
        wirefiles.load_client_conf(tmp_path / "nope")
