"""The checked-in ``api_protos/gen/`` matches a fresh generation, and the kubelet wire contract holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from api_protos import generate
from dra_kubeletplugin.protos.gen import (
    dra_health_v1_pb2,
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_v1_pb2,
)

REPO = Path(__file__).resolve().parents[2]


def _locked(package: str) -> str:
    """The version ``constraints.txt`` (the locked toolchain) holds ``package`` at."""
    for line in (REPO / "constraints.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and name.strip().lower() == package:
            return version.strip()
    raise AssertionError(f"constraints.txt does not lock {package}")


def _generated_version(directory: Path) -> set[str]:
    return {
        line.split("=", 1)[1].strip().strip("'\"")
        for p in directory.glob("*_pb2_grpc.py")
        for line in p.read_text().splitlines()
        if line.startswith("GRPC_GENERATED_VERSION")
    }


def _generated_files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in directory.iterdir() if p.is_file()}


SETS = [pytest.param(s, id=name) for name, s in generate.SETS.items()]


@pytest.mark.parametrize("proto_set", SETS)
def test_the_locked_generator_made_the_checked_in_code(proto_set: generate.ProtoSet) -> None:
    """Upgrading grpcio-tools in constraints.txt without regenerating fails here, and only then."""
    assert _generated_version(proto_set.gen_dir) == {_locked("grpcio-tools")}


@pytest.mark.parametrize("proto_set", SETS)
def test_checked_in_code_matches_fresh_generation(tmp_path: Path, proto_set: generate.ProtoSet) -> None:
    from importlib.metadata import version

    assert version("grpcio-tools") == _locked("grpcio-tools"), (
        "the installed generator is not the locked one: install with scripts/bootstrap.sh (constraints.txt)"
    )
    out = tmp_path / "gen"
    generate.generate(out, proto_set=proto_set)
    fresh = _generated_files(out)
    checked_in = _generated_files(proto_set.gen_dir)
    assert sorted(fresh) == sorted(checked_in), (
        "generated file set differs: run python -m api_protos.generate"
    )
    stale = [name for name in fresh if fresh[name] != checked_in[name]]
    assert stale == [], f"out of date: {stale}; run python -m api_protos.generate"


@pytest.mark.parametrize("proto_set", SETS)
def test_every_proto_has_its_three_generated_files(proto_set: generate.ProtoSet) -> None:
    names = set(_generated_files(proto_set.gen_dir))
    for proto in proto_set.proto_dir.glob("*.proto"):
        stem = proto.stem
        assert {f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"} <= names


def test_stale_generated_files_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    out.mkdir()
    (out / "gone_pb2.py").write_text("x = 1\n")
    (out / "keep.txt").write_text("not generated\n")
    generate.generate(out)
    assert not (out / "gone_pb2.py").exists()
    assert (out / "keep.txt").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "import dra_v1_pb2 as dra__v1__pb2\n",
            "from dra_kubeletplugin.protos.gen import dra_v1_pb2 as dra__v1__pb2\n",
            id="aliased",
        ),
        pytest.param(
            "import dra_v1_pb2\n", "from dra_kubeletplugin.protos.gen import dra_v1_pb2\n", id="plain"
        ),
        pytest.param(
            "from dra_v1_pb2 import Claim\n",
            "from dra_kubeletplugin.protos.gen.dra_v1_pb2 import Claim\n",
            id="from",
        ),
        pytest.param("import other_pb2 as o\n", "import other_pb2 as o\n", id="foreign-module-untouched"),
        pytest.param(
            "from google.protobuf import descriptor_pb2\n",
            "from google.protobuf import descriptor_pb2\n",
            id="google",
        ),
    ],
)
def test_rewrite_imports(text: str, expected: str) -> None:
    assert generate.rewrite_imports(text, {"dra_v1_pb2"}, package="dra_kubeletplugin.protos.gen") == expected


@pytest.mark.parametrize(
    ("module", "service", "method", "path", "server_streaming"),
    [
        pytest.param(dra_v1_pb2, "DRAPlugin", "NodePrepareResources", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources", False, id="v1-prepare"),
        pytest.param(dra_v1_pb2, "DRAPlugin", "NodeUnprepareResources", "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources", False, id="v1-unprepare"),
        pytest.param(dra_v1beta1_pb2, "DRAPlugin", "NodePrepareResources", "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources", False, id="v1beta1-prepare"),
        pytest.param(dra_v1beta1_pb2, "DRAPlugin", "NodeUnprepareResources", "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources", False, id="v1beta1-unprepare"),
        pytest.param(pluginregistration_v1_pb2, "Registration", "GetInfo", "/pluginregistration.Registration/GetInfo", False, id="reg-getinfo"),
        pytest.param(pluginregistration_v1_pb2, "Registration", "NotifyRegistrationStatus", "/pluginregistration.Registration/NotifyRegistrationStatus", False, id="reg-notify"),
        pytest.param(dra_health_v1alpha1_pb2, "DRAResourceHealth", "NodeWatchResources", "/v1alpha1.DRAResourceHealth/NodeWatchResources", True, id="health-v1alpha1"),
        pytest.param(dra_health_v1_pb2, "DRAResourceHealth", "NodeWatchResources", "/v1.DRAResourceHealth/NodeWatchResources", True, id="health-v1"),
    ],
)  # fmt: skip
def test_method_paths(module: Any, service: str, method: str, path: str, server_streaming: bool) -> None:
    svc = module.DESCRIPTOR.services_by_name[service]
    m = svc.methods_by_name[method]
    assert f"/{svc.full_name}/{m.name}" == path
    assert m.server_streaming is server_streaming
    assert m.client_streaming is False


_STR = FieldDescriptor.TYPE_STRING
_MSG = FieldDescriptor.TYPE_MESSAGE
_DRA_FIELDS = {
    "NodePrepareResourcesRequest": {"claims": (1, _MSG)},
    "NodePrepareResourcesResponse": {"claims": (1, _MSG)},
    "NodePrepareResourceResponse": {"devices": (1, _MSG), "error": (2, _STR)},
    "Device": {
        "request_names": (1, _STR),
        "pool_name": (2, _STR),
        "device_name": (3, _STR),
        "cdi_device_ids": (4, _STR),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, _MSG)},
    "NodeUnprepareResourcesResponse": {"claims": (1, _MSG)},
    "NodeUnprepareResourceResponse": {"error": (1, _STR)},
    "Claim": {"namespace": (1, _STR), "uid": (2, _STR), "name": (3, _STR)},
}
_HEALTH_FIELDS = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, _STR), "device_name": (2, _STR)},
    "DeviceHealth": {
        "device": (1, _MSG),
        "health": (2, FieldDescriptor.TYPE_ENUM),
        "last_updated_time": (3, FieldDescriptor.TYPE_INT64),
        "health_check_timeout_seconds": (4, FieldDescriptor.TYPE_INT64),
        "message": (5, _STR),
    },
    "NodeWatchResourcesResponse": {"devices": (1, _MSG)},
}
_REG_FIELDS = {
    "InfoRequest": {},
    "PluginInfo": {
        "type": (1, _STR),
        "name": (2, _STR),
        "endpoint": (3, _STR),
        "supported_versions": (4, _STR),
    },
    "RegistrationStatus": {"plugin_registered": (1, FieldDescriptor.TYPE_BOOL), "error": (2, _STR)},
    "RegistrationStatusResponse": {},
}
_V1_FIELDS = {**_DRA_FIELDS, "Device": {**_DRA_FIELDS["Device"], "share_id": (5, _STR)}}


@pytest.mark.parametrize(
    ("module", "package", "messages"),
    [
        pytest.param(dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1", _V1_FIELDS, id="dra-v1"),
        pytest.param(dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1", _DRA_FIELDS, id="dra-v1beta1"),
        pytest.param(dra_health_v1alpha1_pb2, "v1alpha1", _HEALTH_FIELDS, id="health-v1alpha1"),
        pytest.param(dra_health_v1_pb2, "v1", _HEALTH_FIELDS, id="health-v1"),
        pytest.param(pluginregistration_v1_pb2, "pluginregistration", _REG_FIELDS, id="registration"),
    ],
)
def test_field_numbers(module: Any, package: str, messages: dict[str, dict[str, tuple[int, int]]]) -> None:
    assert module.DESCRIPTOR.package == package
    assert set(module.DESCRIPTOR.message_types_by_name) == set(messages)
    for msg_name, fields in messages.items():
        desc = module.DESCRIPTOR.message_types_by_name[msg_name]
        got = {f.name: (f.number, f.type) for f in desc.fields}
        assert got == fields, msg_name


@pytest.mark.parametrize(
    ("module", "key_field"),
    [
        pytest.param(dra_v1_pb2, "NodePrepareResourcesResponse", id="v1-prepare"),
        pytest.param(dra_v1_pb2, "NodeUnprepareResourcesResponse", id="v1-unprepare"),
        pytest.param(dra_v1beta1_pb2, "NodePrepareResourcesResponse", id="v1beta1-prepare"),
        pytest.param(dra_v1beta1_pb2, "NodeUnprepareResourcesResponse", id="v1beta1-unprepare"),
    ],
)
def test_claims_results_are_string_keyed_maps(module: Any, key_field: str) -> None:
    field = module.DESCRIPTOR.message_types_by_name[key_field].fields_by_name["claims"]
    entry = field.message_type
    assert entry.GetOptions().map_entry
    assert entry.fields_by_name["key"].type == _STR


def test_v1_share_id_has_explicit_presence() -> None:
    field = dra_v1_pb2.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert field.has_presence
    device = dra_v1_pb2.Device()
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")


@pytest.mark.parametrize(
    "module", [pytest.param(dra_health_v1alpha1_pb2, id="v1alpha1"), pytest.param(dra_health_v1_pb2, id="v1")]
)
def test_health_status_enum(module: Any) -> None:
    values = {v.name: v.number for v in module.DESCRIPTOR.enum_types_by_name["HealthStatus"].values}
    assert values == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
