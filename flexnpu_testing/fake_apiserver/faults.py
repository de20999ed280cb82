"""Answers that prove nothing, on demand: the ambiguous replies real apiservers and proxies give.

A test arms a :class:`AmbiguityRule` with :meth:`FakeAPIServer.answer_ambiguously
<flexnpu_testing.fake_apiserver.harness.FakeAPIServer.answer_ambiguously>`; while it holds
(for a number of seconds, or until :meth:`~flexnpu_testing.fake_apiserver.harness.FakeAPIServer.answer_normally`),
matching item requests get the rule's answer instead of the stored object. Each answer is one a
real deployment produces: ``404 page not found`` in plain text when ``resource.k8s.io/v1`` is
not served, a Status 404 about another object, empty or truncated bodies from a proxy, a 200
with another kind, 5xx, and a request that is never answered.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from enum import StrEnum

from flexnpu_testing.fake_apiserver.resources import Obj


class Ambiguity(StrEnum):
    """One kind of answer that proves nothing about the object asked for."""

    NOT_FOUND_TEXT = "404-text"  # "404 page not found", text/plain (group/version not served)
    NOT_FOUND_OTHER_KIND = "404-other-kind"  # a Status 404 about the namespace, not the object
    NOT_FOUND_OTHER_NAME = "404-other-name"  # a Status 404 for the same kind, another name
    EMPTY_200 = "200-empty"  # 200 with no body
    EMPTY_OBJECT = "200-empty-object"  # 200 with {}
    MALFORMED = "200-malformed"  # 200 with truncated JSON
    WRONG_KIND = "200-wrong-kind"  # 200 with an object of another kind
    NO_UID = "200-no-uid"  # 200 with the object stripped of its UID
    SERVER_ERROR = "500"  # 500 InternalError Status
    BAD_GATEWAY = "502-text"  # 502 from a proxy, text/plain
    TIMEOUT = "timeout"  # the request is held until the rule ends, then the connection closes


@dataclass(frozen=True, slots=True)
class AmbiguityRule:
    """Answer ``mode`` to ``method`` requests on items of ``resource`` (``names``: only those)."""

    mode: Ambiguity
    resource: str = "resourceclaims"
    method: str = "GET"
    names: frozenset[str] = frozenset()
    until: float | None = None  # time.monotonic() deadline; None: until answer_normally()

    def matches(self, *, method: str, plural: str, name: str) -> bool:
        return (
            method == self.method
            and plural == self.resource
            and (not self.names or name in self.names)
            and (self.until is None or time.monotonic() < self.until)
        )


class Ambiguities:
    """The armed rule (at most one) and an event that ends held (``TIMEOUT``) requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rule: AmbiguityRule | None = None
        self._released = threading.Event()
        self.answered = 0

    def arm(self, rule: AmbiguityRule) -> None:
        with self._lock:
            self._rule = rule
            self._released = threading.Event()

    def disarm(self) -> None:
        with self._lock:
            self._rule = None
            self._released.set()

    def match(self, *, method: str, plural: str, name: str) -> tuple[AmbiguityRule, threading.Event] | None:
        with self._lock:
            rule = self._rule
            if rule is None or not rule.matches(method=method, plural=plural, name=name):
                return None
            self.answered += 1
            return rule, self._released


def body_for(mode: Ambiguity, *, obj: Obj | None, name: str, namespace: str | None) -> tuple[int, str, bytes]:
    """(HTTP code, content type, body) of one ambiguous answer; ``obj`` is the stored object."""

    def status(code: int, reason: str, message: str, details: Obj) -> bytes:
        return json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason,
                "details": details,
                "code": code,
            }
        ).encode()

    if mode is Ambiguity.NOT_FOUND_TEXT:
        return 404, "text/plain; charset=utf-8", b"404 page not found\n"
    if mode is Ambiguity.NOT_FOUND_OTHER_KIND:
        ns = namespace or "default"
        return (
            404,
            "application/json",
            status(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}),
        )
    if mode is Ambiguity.NOT_FOUND_OTHER_NAME:
        other = f"{name}-other"
        return (
            404,
            "application/json",
            status(
                404,
                "NotFound",
                f'resourceclaims.resource.k8s.io "{other}" not found',
                {"name": other, "group": "resource.k8s.io", "kind": "resourceclaims"},
            ),
        )
    if mode is Ambiguity.EMPTY_200:
        return 200, "application/json", b""
    if mode is Ambiguity.EMPTY_OBJECT:
        return 200, "application/json", b"{}"
    if mode is Ambiguity.MALFORMED:
        return (
            200,
            "application/json",
            b'{"kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1", "metadata": {"na',
        )
    if mode is Ambiguity.WRONG_KIND:
        ns = namespace or "default"
        return (
            200,
            "application/json",
            json.dumps(
                {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": ns, "uid": "0" * 36}}
            ).encode(),
        )
    if mode is Ambiguity.NO_UID:
        if obj is None:
            return 200, "application/json", b"{}"
        stripped = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
        return 200, "application/json", json.dumps(stripped).encode()
    if mode is Ambiguity.SERVER_ERROR:
        return (
            500,
            "application/json",
            status(500, "InternalError", "Internal error occurred: etcdserver: leader changed", {}),
        )
    if mode is Ambiguity.BAD_GATEWAY:
        return 502, "text/plain; charset=utf-8", b"502 Bad Gateway\n"
    raise ValueError(f"no body for {mode}")
