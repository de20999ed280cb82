"""CDI spec: minimum version, validation rules, file naming, schema conformance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft7Validator
from referencing import Registry
from referencing.jsonschema import DRAFT7

from dra_driver import cdi
from dra_driver.claims import claim_error
from dra_driver.errors import ErrorCode, InvalidInput
from dra_kubeletplugin import claimbatch
from dra_kubeletplugin.claims import ClaimRef

KIND = cdi.Kind.parse("flexnpu.io/vnpu")
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "data" / "cdi-schema"


def _validator() -> Draft7Validator:
    base = "file:///cdi-schema/"
    registry = Registry().with_resources(
        [
            (base + n, DRAFT7.create_resource(json.loads((SCHEMA_DIR / n).read_text())))
            for n in ("schema.json", "defs.json")
        ]
    )
    return Draft7Validator({"$ref": base + "schema.json"}, registry=registry)


def _spec(name: str = "abc-npu-0", *, edits: cdi.Edits | None = None, kind: cdi.Kind = KIND) -> cdi.Spec:
    return cdi.Spec(kind=kind, devices=(cdi.CDIDevice(name=name, edits=edits or cdi.Edits(env=("A=1",))),))


@pytest.mark.parametrize(
    ("spec", "version"),
    [
        pytest.param(_spec(), "0.3.0", id="env-only"),
        pytest.param(_spec(edits=cdi.Edits(mounts=(cdi.Mount("/h", "/c"),))), "0.4.0", id="mount-type"),
        pytest.param(
            _spec(edits=cdi.Edits(device_nodes=(cdi.DeviceNode("/dev/davinci0", "/r/dev/davinci0"),))),
            "0.5.0",
            id="device-node-hostpath",
        ),
        pytest.param(_spec(name="0f2e-npu-0"), "0.5.0", id="name-starts-with-digit"),
        pytest.param(_spec(kind=cdi.Kind.parse("flexnpu.io/v.npu")), "0.6.0", id="dot-in-class"),
    ],
)
def test_required_version(spec: cdi.Spec, version: str) -> None:
    assert cdi.required_version(spec) == version
    assert spec.to_json()["cdiVersion"] == version


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param(cdi.Spec(kind=KIND, devices=()), "devices", id="no-devices"),
        pytest.param(_spec(name="claim 123!"), "devices[0].name", id="bad-name"),
        pytest.param(_spec(edits=cdi.Edits()), "devices[0].containerEdits", id="empty-edits"),
        pytest.param(_spec(edits=cdi.Edits(env=("NOEQUALS",))), "containerEdits.env", id="bad-env"),
        pytest.param(
            _spec(edits=cdi.Edits(mounts=(cdi.Mount("rel", "/c"),))),
            "containerEdits.mounts",
            id="relative-mount",
        ),
        pytest.param(
            cdi.Spec(
                kind=KIND,
                devices=(
                    cdi.CDIDevice("a", cdi.Edits(env=("A=1",))),
                    cdi.CDIDevice("a", cdi.Edits(env=("A=1",))),
                ),
            ),
            "devices[1].name",
            id="duplicate-device",
        ),
    ],
)
def test_invalid_specs_are_refused(spec: cdi.Spec, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        cdi.validate(spec, claim_uid="u-1")
    assert info.value.code == ErrorCode.INVALID_CDI
    assert info.value.field == field
    assert "u-1" in str(info.value)


@pytest.mark.parametrize("kind", ["vnpu", "/vnpu", "flexnpu.io/v npu", "1abc/x"])
def test_bad_kind(kind: str) -> None:
    with pytest.raises(InvalidInput):
        cdi.Kind.parse(kind)


def test_write_list_remove(tmp_path: Path) -> None:
    uid = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    edits = cdi.whole_die_edits(["/dev/davinci3"], device_root=Path("/tmp/root"))
    spec = cdi.Spec(
        kind=KIND,
        devices=(cdi.CDIDevice(cdi.device_name(uid, "npu-3"), edits),),
        edits=cdi.shared_edits(
            ["/dev/davinci_manager"], ["/usr/local/dcmi"], device_root=Path("/tmp/root"), env={"X": "1"}
        ),
    )
    path = cdi.write_spec(tmp_path / cdi.spec_file_name(spec.kind, uid), spec, uid)
    assert path.name == f"flexnpu.io-vnpu_{uid}.json"
    assert path.stat().st_mode & 0o777 == 0o644
    doc = json.loads(path.read_text())
    assert list(_validator().iter_errors(doc)) == []
    assert doc["cdiVersion"] == "0.5.0"
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/davinci3", "hostPath": "/tmp/root/dev/davinci3", "permissions": "rw"}
    ]
    assert cdi.qualified_id(KIND, doc["devices"][0]["name"]) == f"flexnpu.io/vnpu={uid}-npu-3"
    assert cdi.list_specs(tmp_path, KIND) == {uid: path}
    assert cdi.remove_spec(path) is True
    assert cdi.remove_spec(path) is False  # idempotent
    assert cdi.list_specs(tmp_path, KIND) == {}


@pytest.mark.parametrize("uid", ["../etc", "a/b", "", ".", "x" * 80, "a b"])
def test_unsafe_uid_is_refused_before_any_spec_path(uid: str) -> None:
    """The UID a spec file is named by is checked once, where the kubelet's call comes in."""
    problem = claimbatch.claim_problem(ClaimRef("ns", uid, "c"))
    assert problem is not None
    with pytest.raises(InvalidInput) as info:
        raise claim_error(problem, uid)
    assert info.value.code == ErrorCode.INVALID_PATH
