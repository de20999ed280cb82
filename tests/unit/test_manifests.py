"""Manifests: every YAML under manifests/ has a valid Kubernetes shape, the Helm chart renders
(with Helm itself: tests/helmchart.py) to the same objects as the plain manifest, and the
examples only use DeviceClasses the chart defines.

Regenerate the plain manifest after a chart change with its generator (from the repository root):
``.venv/bin/python scripts/render_manifest.py > manifests/deploy/flexnpu-dra-driver.yaml``
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes import client as k8s

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.discovery import emulated
from tests.helmchart import CHART, PLAIN, RELEASE, ROOT, chart_values, render_chart

__all__ = ["RELEASE", "chart_values", "render_chart"]  # the chart helpers other tests import from here

MANIFESTS = ROOT / "manifests"
DEPLOY = MANIFESTS / "deploy" / "flexnpu-dra-driver.yaml"
EXAMPLES = MANIFESTS / "examples"

MODELS: dict[str, type[Any]] = {
    "Namespace": k8s.V1Namespace,
    "ServiceAccount": k8s.V1ServiceAccount,
    "ConfigMap": k8s.V1ConfigMap,
    "Pod": k8s.V1Pod,
    "DaemonSet": k8s.V1DaemonSet,
    "ClusterRole": k8s.V1ClusterRole,
    "ClusterRoleBinding": k8s.V1ClusterRoleBinding,
    "DeviceClass": k8s.V1DeviceClass,
    "ResourceClaimTemplate": k8s.V1ResourceClaimTemplate,
    "ValidatingAdmissionPolicy": k8s.V1ValidatingAdmissionPolicy,
    "ValidatingAdmissionPolicyBinding": k8s.V1ValidatingAdmissionPolicyBinding,
    "Secret": k8s.V1Secret,
    "Service": k8s.V1Service,
    "Deployment": k8s.V1Deployment,
    "ValidatingWebhookConfiguration": k8s.V1ValidatingWebhookConfiguration,
}
API_VERSIONS = {
    "Namespace": "v1",
    "ServiceAccount": "v1",
    "ConfigMap": "v1",
    "Pod": "v1",
    "DaemonSet": "apps/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "DeviceClass": "resource.k8s.io/v1",
    "ResourceClaimTemplate": "resource.k8s.io/v1",
    "ValidatingAdmissionPolicy": "admissionregistration.k8s.io/v1",
    "ValidatingAdmissionPolicyBinding": "admissionregistration.k8s.io/v1",
    "Secret": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "ValidatingWebhookConfiguration": "admissionregistration.k8s.io/v1",
}
NAMESPACED = {
    "ServiceAccount",
    "ConfigMap",
    "Pod",
    "DaemonSet",
    "ResourceClaimTemplate",
    "Secret",
    "Service",
    "Deployment",
}
# The plain manifest has no admission webhook: its TLS key would be the same, published, on every cluster.


def yaml_files() -> Iterator[Path]:
    """Every plain YAML manifest (the chart is checked through its rendering)."""
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        if CHART not in path.parents:
            yield path


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def key(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = doc["metadata"]
    return (doc["kind"], meta.get("namespace", ""), meta["name"])


# Prometheus-operator kinds (no Python models): the fields the chart writes, checked by shape.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "PrometheusRule": {
        "type": "object",
        "required": ["groups"],
        "additionalProperties": False,
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["name", "rules"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string"},
                        "rules": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["alert", "expr", "labels", "annotations"],
                                "additionalProperties": False,
                                "properties": {
                                    "alert": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9]*$"},
                                    "expr": {"type": "string", "minLength": 1},
                                    "for": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                                    "labels": {"type": "object", "required": ["severity"]},
                                    "annotations": {"type": "object", "required": ["summary", "description"]},
                                },
                            },
                        },
                    },
                },
            }
        },
    },
    "PodMonitor": {
        "type": "object",
        "required": ["selector", "podMetricsEndpoints"],
        "additionalProperties": False,
        "properties": {
            "selector": {"type": "object", "required": ["matchLabels"]},
            "podMetricsEndpoints": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["targetPort"],
                    "additionalProperties": False,
                    "properties": {
                        "targetPort": {"type": "integer"},
                        "path": {"type": "string"},
                        "interval": {"type": "string"},
                    },
                },
            },
        },
    },
}


def check_shape(doc: dict[str, Any], where: str) -> None:
    kind = doc.get("kind")
    if kind in CRD_SCHEMAS:
        assert doc.get("apiVersion") == "monitoring.coreos.com/v1", where
        assert doc["metadata"].get("name") and doc["metadata"].get("namespace"), where
        jsonschema.validate(doc["spec"], CRD_SCHEMAS[kind])
        return
    kind = doc.get("kind")
    assert kind in MODELS, f"{where}: unexpected kind {kind!r}"
    assert doc.get("apiVersion") == API_VERSIONS[kind], f"{where}: {kind} must be {API_VERSIONS[kind]}"
    assert doc["metadata"].get("name"), f"{where}: {kind} without a name"
    if kind in NAMESPACED:
        assert doc["metadata"].get("namespace"), f"{where}: {kind} {doc['metadata']['name']} has no namespace"
    else:
        assert "namespace" not in doc["metadata"], f"{where}: cluster-scoped {kind} with a namespace"
    # The client's pydantic models forbid unknown fields and check types, recursively.
    MODELS[kind].model_validate(copy.deepcopy(doc))


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [pytest.param(p, id=str(p.relative_to(MANIFESTS))) for p in yaml_files()])
def test_plain_manifest_shapes(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path} is empty"
    for i, doc in enumerate(docs):
        check_shape(doc, f"{path.name}[{i}]")
    keys = [key(d) for d in docs]
    assert len(keys) == len(set(keys)), f"{path}: duplicate objects"


CHART_VARIANTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"emulated.enabled": True}, id="emulated"),
    pytest.param(
        {
            "deviceClasses.create": False,
            "validatingAdmissionPolicy.enabled": False,
            "plugin.probes.enabled": False,
            "webhook.enabled": False,
        },
        id="minimal",
    ),
    pytest.param(
        {
            "monitoring.dashboard.enabled": True,
            "monitoring.prometheusRule.enabled": True,
            "monitoring.podMonitor.enabled": True,
        },
        id="monitoring",
    ),
    pytest.param(
        {
            "plugin.nodeSelector": {"accelerator": "ascend"},
            "plugin.resources": {"limits": {"memory": "512Mi"}},
        },
        id="placement",
    ),
]


@pytest.mark.parametrize("overrides", CHART_VARIANTS)
def test_chart_renders_valid_objects(overrides: dict[str, Any]) -> None:
    values = chart_values(overrides)
    jsonschema.validate(values, json.loads((CHART / "values.schema.json").read_text()))
    docs = render_chart(values)
    for doc in docs:
        check_shape(doc, f"chart {doc.get('kind')}")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("DaemonSet") == 2
    configmaps = bool(overrides.get("emulated.enabled")) + bool(overrides.get("monitoring.dashboard.enabled"))
    assert kinds.count("ConfigMap") == configmaps
    assert kinds.count("DeviceClass") == (0 if overrides.get("deviceClasses.create") is False else 5)
    monitoring = bool(overrides.get("monitoring.prometheusRule.enabled"))
    assert ("PrometheusRule" in kinds) == monitoring and ("PodMonitor" in kinds) == monitoring
    webhook = overrides.get("webhook.enabled", True)
    assert [
        kinds.count(k) for k in ("Deployment", "Service", "Secret", "ValidatingWebhookConfiguration")
    ] == [int(webhook)] * 4


def test_plain_manifest_matches_the_chart() -> None:
    rendered = {key(d): d for d in render_chart(chart_values(PLAIN))}
    plain = {key(d): d for d in load_docs(DEPLOY) if d["kind"] != "Namespace"}
    assert sorted(plain) == sorted(rendered)
    for k, doc in rendered.items():
        assert plain[k] == doc, f"{k} differs from the chart; regenerate (see module docstring)"
    namespaces = [d for d in load_docs(DEPLOY) if d["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == [RELEASE["Namespace"]]


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        pytest.param("plugin.defaultMode", "shared", id="bad-mode"),
        pytest.param("driverName", "NPU_FlexNPU", id="bad-driver-name"),
        pytest.param("plugin.metricsPort", "9090", id="port-as-string"),
        pytest.param("plugin.metricsPort", -1, id="metrics-off-breaks-liveness"),
        pytest.param("monitoring.podMonitor.interval", "often", id="bad-interval"),
        pytest.param("image.pullPolicy", "Sometimes", id="bad-pull-policy"),
        pytest.param("emulated.inventory", {"chips": []}, id="empty-inventory"),
        pytest.param("unknownTopLevel", 1, id="unknown-field"),
        pytest.param("hostMemory.ratio", 0.5, id="host-memory-ratio-below-1"),
        pytest.param("hostMemory.ratio", "2", id="host-memory-ratio-as-string"),
        pytest.param("hostMemory.max", "lots", id="host-memory-max-not-a-quantity"),
        pytest.param("hostMemory.max", "1.5Gi", id="host-memory-max-a-fraction"),
        pytest.param("tracing.otlpEndpoint", "collector:4318", id="otlp-endpoint-no-scheme"),
        pytest.param("tracing.otlpEndpoint", "http://", id="otlp-endpoint-no-host"),
    ],
)
def test_values_schema_rejects(dotted: str, value: Any) -> None:
    values = chart_values({dotted: value} if "." in dotted else {})
    if "." not in dotted:
        values[dotted] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, json.loads((CHART / "values.schema.json").read_text()))


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"hostMemory.ratio": 1.5, "hostMemory.max": "8Gi"}, id="set"),
    ],
)
def test_plugin_and_webhook_enforce_the_same_host_memory_bound(overrides: dict[str, Any]) -> None:
    """Issue 25 class 2: the bound on a claim's hostMemory is the admin's, the same in prepare and the webhook."""
    from dra_driver import config as config_mod

    docs = {
        d["metadata"]["name"]: d
        for d in render_chart(chart_values(overrides))
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    plugin = {k: v["value"] for k, v in _container_env(docs["flexnpu-dra-plugin"]).items() if "value" in v}
    webhook = {k: v["value"] for k, v in _container_env(docs["flexnpu-dra-plugin-webhook"]).items()}
    names = ("FLEXNPU_HOST_MEMORY_RATIO", "FLEXNPU_MAX_HOST_MEMORY")
    assert [plugin[n] for n in names] == [webhook[n] for n in names]
    bound = config_mod.host_memory_bound(
        {"host_memory_ratio": plugin[names[0]], "max_host_memory": plugin[names[1]]}
    )
    want = (overrides.get("hostMemory.ratio", 2), overrides.get("hostMemory.max", "64Gi"))
    assert (bound.ratio, bound.cap_bytes) == (want[0], int(want[1][:-2]) << 30)


@pytest.mark.parametrize("endpoint", ["", "http://otel-collector.observability:4318"])
def test_the_plugin_and_the_extender_export_spans_to_the_same_endpoint(endpoint: str) -> None:
    """``tracing.otlpEndpoint`` reaches both processes as ``FLEXNPU_OTLP_ENDPOINT``; unset, neither has it."""
    from dra_driver import config as config_mod

    docs = {
        d["metadata"]["name"]: d
        for d in render_chart(chart_values({"tracing.otlpEndpoint": endpoint, "extender.enabled": True}))
        if d["kind"] in ("DaemonSet", "Deployment")
    }
    for name in ("flexnpu-dra-plugin", "flexnpu-dra-plugin-extender"):
        env = _container_env(docs[name])
        if not endpoint:
            assert "FLEXNPU_OTLP_ENDPOINT" not in env, name
            continue
        value = env["FLEXNPU_OTLP_ENDPOINT"]["value"]
        assert config_mod.otlp_endpoint({"otlp_endpoint": value}) == endpoint, name
    others = [n for n, d in docs.items() if "FLEXNPU_OTLP_ENDPOINT" in _container_env(d)]
    assert sorted(others) == (
        sorted(["flexnpu-dra-plugin", "flexnpu-dra-plugin-extender"]) if endpoint else []
    )


def test_default_emulated_inventory_is_valid() -> None:
    inv = emulated.parse_inventory(chart_values()["emulated"]["inventory"], source="values.yaml")
    assert [d.model for d in inv.dies] == ["910B3", "910B3"]
    rendered = {d["kind"]: d for d in render_chart(chart_values({"emulated.enabled": True}))}
    cm_inventory = yaml.safe_load(rendered["ConfigMap"]["data"]["inventory.yaml"])
    assert emulated.parse_inventory(cm_inventory, source="configmap").dies == inv.dies


def test_device_classes_select_by_driver_and_mode() -> None:
    classes = {d["metadata"]["name"]: d for d in render_chart(chart_values()) if d["kind"] == "DeviceClass"}
    expected = {
        "npu.flexnpu.io": "whole",
        "vnpu.flexnpu.io": "soft",  # elastic shares, the default policy (the name and selector it always had)
        "vnpu-fixed.flexnpu.io": "soft-fixed",
        "vnpu-best-effort.flexnpu.io": "soft-best-effort",
        "vnpu-template.flexnpu.io": "hard",
    }
    assert set(classes) == set(expected)
    for name, mode in expected.items():
        (selector,) = classes[name]["spec"]["selectors"]
        expr = " ".join(selector["cel"]["expression"].split())
        assert expr == (
            f'device.driver == "{DEFAULT_DRIVER_NAME}" && device.attributes["{DEFAULT_DRIVER_NAME}"].mode == "{mode}"'
        )


def test_rbac_rules() -> None:
    (role,) = [d for d in render_chart(chart_values()) if d["kind"] == "ClusterRole"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): r for r in role["rules"]}
    verbs = {k: set(r["verbs"]) for k, r in rules.items()}
    rs = (("resource.k8s.io",), ("resourceslices",))
    assert verbs[rs] == {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
    assert verbs[(("resource.k8s.io",), ("resourceclaims",))] == {"get", "list", "watch"}
    assert verbs[(("resource.k8s.io",), ("resourceclaims/status",))] == {"get", "update", "patch"}
    granular = rules[(("resource.k8s.io",), ("resourceclaims/driver",))]
    assert set(granular["verbs"]) == {"associated-node:update", "associated-node:patch"}
    assert granular["resourceNames"] == [DEFAULT_DRIVER_NAME]
    assert verbs[(("",), ("nodes",))] == {"get", "list", "watch"}
    assert verbs[(("",), ("events",))] == {"create", "patch"}
    assert verbs[(("events.k8s.io",), ("events",))] == {"create", "patch"}
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in role["rules"])


def test_admission_policy_pins_slices_to_the_plugin_node() -> None:
    docs = {d["kind"]: d for d in render_chart(chart_values())}
    policy, binding = docs["ValidatingAdmissionPolicy"], docs["ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (match,) = policy["spec"]["matchConditions"]
    assert f"system:serviceaccount:{RELEASE['Namespace']}:flexnpu-dra-driver" in match["expression"]
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "authentication.kubernetes.io/node-name" in variables["userNodeName"]
    exprs = [v["expression"] for v in policy["spec"]["validations"]]
    assert "variables.userNodeName == variables.objectNodeName" in exprs
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["resourceslices"]


def _container_env(ds: Mapping[str, Any]) -> dict[str, Any]:
    (ctr,) = ds["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in ctr["env"]}


@pytest.mark.parametrize(
    "emulated_node", [pytest.param(False, id="real-node"), pytest.param(True, id="emulated")]
)
def test_plugin_daemonset(emulated_node: bool) -> None:
    docs = {d["metadata"]["name"]: d for d in render_chart(chart_values({"emulated.enabled": emulated_node}))}
    ds = docs["flexnpu-dra-plugin"]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "flexnpu-dra-driver"
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["flexnpu-dra", "plugin"]
    sc = ctr["securityContext"]
    assert sc["runAsUser"] == 0 and sc["readOnlyRootFilesystem"] is True
    if emulated_node:
        # Without NPUs nothing needs a privileged container: exactly the control link and mknod.
        assert "privileged" not in sc and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "MKNOD"]}
    else:
        assert sc["privileged"] is True  # npu-smi opens the device nodes
    env = _container_env(ds)
    assert env["FLEXNPU_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["FLEXNPU_POD_UID"]["value"] == "$(POD_UID)"
    assert ("FLEXNPU_INVENTORY" in env) == emulated_node
    assert ("FLEXNPU_NPU_SMI" in env) != emulated_node
    assert ("FLEXNPU_BUILD_DEVICE_ROOT" in env) == emulated_node
    host_paths = {v["hostPath"]["path"]: v for v in pod["volumes"] if "hostPath" in v}
    required = {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/lib/flexnpu",
        "/var/run/flexnpu",
        "/var/run/cdi",
        "/dev/shm/flexnpu",
    }
    assert required <= set(host_paths)
    assert ("/dev" in host_paths) != emulated_node  # the emulated device root lives under /var/lib/flexnpu
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    assert set(mounts) == {v["name"] for v in pod["volumes"]}
    by_path = {v["hostPath"]["path"]: mounts[v["name"]] for v in host_paths.values()}
    # The kubelet dials the endpoint the plugin names: its dirs are mounted at their host paths.
    for kubelet_dir in ("/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins"):
        assert by_path[kubelet_dir]["mountPath"] == kubelet_dir
    assert env["FLEXNPU_KUBELET_REGISTRY_DIR"]["value"] == "/var/lib/kubelet/plugins_registry"
    assert env["FLEXNPU_KUBELET_PLUGINS_DIR"]["value"] == "/var/lib/kubelet/plugins"
    # The plugin mounts nothing, so nothing propagates back to the host; the shm root's directories are all it
    # needs of it, so that volume asks for no propagation, hence no host prerequisite.
    assert all(m.get("mountPropagation") in (None, "HostToContainer") for m in mounts.values())
    assert "mountPropagation" not in by_path["/dev/shm/flexnpu"]
    if not emulated_node:
        assert by_path["/dev"]["mountPropagation"] == "HostToContainer"
    assert ctr["readinessProbe"]["exec"]["command"] == ["python3", "-m", "dra_driver.probes", "plugin"]
    assert ctr["livenessProbe"]["exec"]["command"] == ["flexnpu-dra", "probe"]  # the loops are alive
    # hostNetwork: a declared port would become a hostPort and block the rolling update's surge pod.
    assert "ports" not in ctr
    assert int(env["FLEXNPU_METRICS_PORT"]["value"]) > 0  # what the liveness probe asks
    # The C client library reaches the host, at the path the plugin names in CDI specs.
    (init,) = pod["initContainers"]
    assert init["image"] == ctr["image"] and "/usr/lib/flexnpu/$f" in init["command"][2]
    lib = env["FLEXNPU_CLIENT_LIBRARY"]["value"]
    assert (
        lib == "/var/lib/flexnpu/client/libascendcl.so"
        and by_path["/var/lib/flexnpu"]["mountPath"] == "/var/lib/flexnpu"
    )
    assert {m["name"] for m in init["volumeMounts"]} == {"state-dir"}
    assert "privileged" not in init["securityContext"]
    if emulated_node:
        assert env["FLEXNPU_BUILD_DEVICE_ROOT"]["value"] == "true"
        assert env["FLEXNPU_DEVICE_ROOT"]["value"].startswith("/var/lib/flexnpu/")


def test_kubelet_dir_moves_every_kubelet_path() -> None:
    docs = {
        d["metadata"]["name"]: d for d in render_chart(chart_values({"kubeletDir": "/var/snap/k/kubelet"}))
    }
    ds = docs["flexnpu-dra-plugin"]
    pod = ds["spec"]["template"]["spec"]
    text = json.dumps(ds)
    assert "/var/lib/kubelet" not in text
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/snap/k/kubelet/plugins_registry", "/var/snap/k/kubelet/plugins"} <= paths
    assert (
        _container_env(ds)["FLEXNPU_KUBELET_REGISTRY_DIR"]["value"] == "/var/snap/k/kubelet/plugins_registry"
    )


@pytest.mark.parametrize(
    "emulated_node", [pytest.param(False, id="real-node"), pytest.param(True, id="emulated")]
)
def test_daemon_daemonset_rolls_with_aclservers_outside_its_pod(emulated_node: bool) -> None:
    docs = {d["metadata"]["name"]: d for d in render_chart(chart_values({"emulated.enabled": emulated_node}))}
    ds = docs["flexnpu-daemon"]
    # The old pod goes first (no surge: only one instance may adopt); its aclservers keep serving.
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0},
    }
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # aclservers in the host PID namespace, not one that dies with the pod
    (ctr,) = pod["containers"]
    assert ctr["command"] == ["flexnpu-daemon"]
    sc = ctr["securityContext"]
    assert sc["runAsUser"] == 0 and sc["readOnlyRootFilesystem"] is True
    # The claim tmpfs mounts must reach the host: Bidirectional, which needs a privileged container.
    assert sc["privileged"] is True
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert mounts["/dev/shm/flexnpu"]["mountPropagation"] == "Bidirectional"
    # ... of a shm root the init container first made a shared mount in the host's mount namespace
    (init,) = pod["initContainers"]
    assert init["image"] == ctr["image"] and init["securityContext"]["privileged"] is True
    assert init["command"] == [
        "python3", "-m", "flexnpu_runtime.daemon.shmroot", "--host-proc", "/host/proc", "/dev/shm/flexnpu",
    ]  # fmt: skip
    init_mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert set(init_mounts) == {"/dev/shm/flexnpu", "/host/proc"} and init_mounts["/host/proc"]["readOnly"]
    assert not any("mountPropagation" in m for m in init_mounts.values())  # no prerequisite of its own
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host[init_mounts["/host/proc"]["name"]] == "/proc"
    assert host[mounts["/dev/shm/flexnpu"]["name"]] == "/dev/shm/flexnpu"
    assert "env" not in init
    assert ctr["livenessProbe"]["exec"]["command"] == ["python3", "-m", "dra_driver.probes", "daemon"]
    assert ctr["readinessProbe"]["exec"]["command"] == ["python3", "-m", "dra_driver.probes", "daemon-ready"]
    assert pod["automountServiceAccountToken"] is False
    env = _container_env(ds)
    # The host's cgroup file system, where each aclserver gets a bounded cgroup outside the pod's.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/host/sys/fs/cgroup"]["name"]]["hostPath"]["path"] == "/sys/fs/cgroup"
    assert env["FLEXNPU_DAEMON_CGROUP_ROOT"]["value"] == "/host/sys/fs/cgroup"
    assert env["FLEXNPU_DAEMON_CGROUPS"]["value"] == "auto"
    assert env["FLEXNPU_DAEMON_CGROUP_PARENT"]["value"] == "flexnpu.slice"
    assert env["FLEXNPU_DAEMON_INSTANCE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert ("FLEXNPU_DAEMON_INVENTORY" in env) == emulated_node
    assert ("FLEXNPU_DAEMON_NPU_SMI" in env) != emulated_node
    used = {m["name"] for c in [*pod["containers"], *pod["initContainers"]] for m in c["volumeMounts"]}
    assert used == {v["name"] for v in pod["volumes"]}
    # The plugin reaches the daemon through the run dir both pods mount from the host.
    assert env["FLEXNPU_DAEMON_SOCKET"]["value"].startswith("/var/run/flexnpu/")
    selectors = [d["spec"]["selector"]["matchLabels"] for d in docs.values() if d["kind"] == "DaemonSet"]
    assert selectors[0] != selectors[1]  # the two DaemonSets never adopt each other's pods


EXAMPLE_DIRS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir())


@pytest.mark.parametrize("folder", [pytest.param(p, id=p.name) for p in EXAMPLE_DIRS])
def test_example_folder(folder: Path) -> None:
    readme = (folder / "README.md").read_text()
    headings = re.findall(r"^## (.+)$", readme, re.M)
    assert headings == ["Overview", "Requirements", "How to run", "Expected output", "Cleanup"]
    docs = load_docs(folder / f"{folder.name}.yaml")
    (namespace,) = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    cluster_scoped = ("Namespace", "DeviceClass")  # an example may add its own DeviceClass
    assert all(d["metadata"].get("namespace") == namespace for d in docs if d["kind"] not in cluster_scoped)
    assert f"{folder.name}.yaml" in readme
    classes = {d["metadata"]["name"] for d in render_chart(chart_values()) if d["kind"] == "DeviceClass"}
    own_classes = {d["metadata"]["name"] for d in docs if d["kind"] == "DeviceClass"}
    assert not own_classes & classes, f"{folder.name}: redefines a chart DeviceClass"
    for doc in docs:
        if doc["kind"] == "DeviceClass":
            (selector, *_) = doc["spec"]["selectors"]
            assert f'device.driver == "{DEFAULT_DRIVER_NAME}"' in selector["cel"]["expression"]
    classes |= own_classes
    templates = {d["metadata"]["name"] for d in docs if d["kind"] == "ResourceClaimTemplate"}
    for doc in docs:
        if doc["kind"] == "ResourceClaimTemplate":
            for request in doc["spec"]["spec"]["devices"]["requests"]:
                sub = request.get("firstAvailable") or [request["exactly"]]
                for r in sub:
                    assert r["deviceClassName"] in classes, (
                        f"{folder.name}: unknown class {r['deviceClassName']}"
                    )
        if doc["kind"] == "Pod":
            claims = {c["name"]: c for c in doc["spec"].get("resourceClaims") or []}
            # or the Pod asks for an extended resource that the chart's whole-die class serves
            extended = {
                name
                for ctr in doc["spec"]["containers"]
                for name in (ctr.get("resources", {}).get("limits") or {})
                if "/" in name
            }
            assert claims or extended, f"{folder.name}: Pod {doc['metadata']['name']} asks for no device"
            assert extended <= {chart_values()["deviceClasses"]["extendedResourceName"]}
            for ctr in doc["spec"]["containers"]:
                for ref in ctr.get("resources", {}).get("claims", []):
                    assert ref["name"] in claims
            for claim in claims.values():
                assert claim.get("resourceClaimTemplateName", "") in templates | {""}


def test_every_example_uses_a_chart_device_class() -> None:
    assert EXAMPLE_DIRS, "no examples"
    used = set()
    for folder in EXAMPLE_DIRS:
        text = (folder / f"{folder.name}.yaml").read_text()
        own = {d["metadata"]["name"] for d in yaml.safe_load_all(text) if d and d["kind"] == "DeviceClass"}
        used |= set(re.findall(r"deviceClassName:\s*(\S+)", text)) - own
    assert used and used <= {"npu.flexnpu.io", "vnpu.flexnpu.io", "vnpu-template.flexnpu.io"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, "flexnpu.io/npu", id="default"),
        pytest.param("huawei.com/Ascend910", "huawei.com/Ascend910", id="ascend-device-plugin-name"),
        pytest.param("", None, id="off"),
    ],
)
def test_whole_die_class_extended_resource_name(value: str | None, expected: str | None) -> None:
    values = chart_values({} if value is None else {"deviceClasses.extendedResourceName": value})
    jsonschema.validate(values, json.loads((CHART / "values.schema.json").read_text()))
    classes = {d["metadata"]["name"]: d for d in render_chart(values) if d["kind"] == "DeviceClass"}
    assert classes["npu.flexnpu.io"]["spec"].get("extendedResourceName") == expected
    # Shares and templates are not countable resources: only the whole-die class has a name.
    assert all("extendedResourceName" not in classes[c]["spec"] for c in classes if c != "npu.flexnpu.io")


@pytest.mark.parametrize("bad", ["npu", "flexnpu.io/", "Flexnpu.IO/npu", "flexnpu.io/npu/x"])
def test_values_schema_rejects_bad_extended_resource_name(bad: str) -> None:
    values = chart_values({"deviceClasses.extendedResourceName": bad})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, json.loads((CHART / "values.schema.json").read_text()))


def test_dashboard_and_alerts_files_are_well_formed() -> None:
    """Grafana loads the dashboard and Prometheus the rules: unique ids, a layout on the 24-column grid, the
    datasource variable everywhere; every alert has a severity and a summary. (That every expression names
    exported series is checked against a node's scrape: tests/integration/test_usage_metrics.py.)"""
    dash = json.loads((CHART / "monitoring" / "dashboard.json").read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "flexnpu-vnpus"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "node", "namespace"} <= names
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    rules = yaml.safe_load((CHART / "monitoring" / "alerts.yaml").read_text())
    jsonschema.validate(rules, CRD_SCHEMAS["PrometheusRule"])
    alerts = [r["alert"] for g in rules["groups"] for r in g["rules"]]
    assert len(alerts) == len(set(alerts))
    # What issue 13 asks the alerts to cover.
    assert {
        "FlexNPUPrepareErrors",
        "FlexNPUResidualsFound",
        "FlexNPULoopStalled",
        "FlexNPUAclserverRestarts",
        "FlexNPUDieNearShareLimit",
    } <= set(alerts)
    rendered = {
        d["kind"]: d
        for d in render_chart(
            chart_values({"monitoring.prometheusRule.enabled": True, "monitoring.dashboard.enabled": True})
        )
    }
    assert rendered["PrometheusRule"]["spec"] == rules  # the file, as is
    (dash_text,) = next(
        d
        for d in render_chart(chart_values({"monitoring.dashboard.enabled": True}))
        if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    )["data"].values()
    assert json.loads(dash_text) == dash
