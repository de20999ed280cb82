"""An in-process fake Kubernetes API server that speaks the real REST and watch protocol.

It owns: serving the handful of resources FlexNPU touches (core ``nodes``, ``namespaces``,
``events``, ``pods``; ``events.k8s.io/v1`` ``events``; ``resource.k8s.io/v1`` ``resourceslices``,
``resourceclaims`` (+ ``/status``), ``resourceclaimtemplates``, ``deviceclasses``;
``admissionregistration.k8s.io/v1`` ``validatingwebhookconfigurations``) over HTTP/1.1 JSON
to the official ``kubernetes`` client, with the apiserver semantics drivers depend on: one global
resourceVersion, optimistic concurrency, Status error bodies, delete preconditions, finalizers,
label/field selectors, status-subresource isolation, merge / strategic-merge / JSON / server-side
apply patches, watches with history, bookmarks and 410 Gone, and the validation rules that catch
driver bugs. It must not grow endpoints a real apiserver lacks: driver code talks to it only
through the ``kubernetes`` client, so it runs unchanged against a real cluster. Test-only hooks
(``set_down``, ``answer_ambiguously``, ``compact``, ``request_log``, ``get_object``, ``put_object``,
``route_service``) are Python methods. Validating admission webhooks are called as kube-apiserver calls them
(``webhooks.py``).

Usage::

    with FakeAPIServer() as srv:
        api = kubernetes.client.ResourceV1Api(srv.api_client())
        api.list_resource_slice(field_selector="spec.nodeName=node-1")

Run standalone: ``python -m flexnpu_testing.fake_apiserver --port 6443 --kubeconfig-out kc``.

Simplified on purpose: ``limit``/``continue`` page lists, but a
continued page shows the objects after the token's key as they are now (not a snapshot); the list
``resourceVersion``/``resourceVersionMatch`` parameters are ignored (lists are current);
the garbage collector runs synchronously inside the delete (background propagation; ``Orphan``
leaves dependents and their ownerReferences as they are; ``Foreground`` acts like background);
no namespace cascade; pods are deleted at once (no graceful termination); ``dryRun`` is refused
with 400 rather than silently written; server-side apply tracks ownership only between *apply*
managers (fields written by PUT/merge patches have no owner); managedFields are not returned;
unknown fields are kept rather than pruned; core and ``events.k8s.io`` events are separate stores.

The package, one module per concern (each imports only the ones above it):

* ``resources.py`` — the served types and ``Status`` errors;
* ``quantities.py`` — Kubernetes quantities;
* ``selectors.py`` — label and field selectors;
* ``patch.py`` — merge, strategic-merge, JSON and server-side-apply patches;
* ``validation.py`` — validation and normalisation rules of the served types;
* ``object_store.py`` — objects, resourceVersions, watch history, watchers;
* ``webhooks.py`` — validating admission webhooks (HTTPS, caBundle, matchConditions in CEL);
* ``faults.py`` — ambiguous answers on demand (test hook);
* ``http.py`` — routing, discovery, watch streams;
* ``harness.py`` — :class:`FakeAPIServer` and ``main``.
"""

from __future__ import annotations

from flexnpu_testing.fake_apiserver.faults import Ambiguity
from flexnpu_testing.fake_apiserver.harness import FakeAPIServer, main
from flexnpu_testing.fake_apiserver.quantities import canonical_quantity, format_quantity, parse_quantity
from flexnpu_testing.fake_apiserver.resources import RESOURCES, APIError, Resource

__all__ = [
    "RESOURCES",
    "APIError",
    "Ambiguity",
    "FakeAPIServer",
    "Resource",
    "canonical_quantity",
    "format_quantity",
    "main",
    "parse_quantity",
]
