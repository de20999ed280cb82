"""Safe paths from API strings: no path in this driver is built from an unchecked string.

Claim UIDs come from the kubelet and the API, under one rule (``dra_kubeletplugin.claims.CLAIM_UID_RE``):
the helper refuses a malformed kubelet reference before the driver sees it
(``dra_kubeletplugin/claimbatch.py``); the driver's preparer checks the references it is handed
(:func:`check_ref`, prepare and unprepare alike: it is also called by tools and tests), and the
CDI path builder the UID it puts in a file name (:func:`check_uid`). Every joined path is verified to
stay inside its root (:func:`inside`).
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.errors import ErrorCode, InvalidInput, quote
from dra_kubeletplugin.claims import CLAIM_UID_RE, DNS_LABEL_RE, DNS_SUBDOMAIN_RE

UID_RE = CLAIM_UID_RE
"""The one claim-UID rule (``dra_kubeletplugin.claims.CLAIM_UID_RE``, where it is explained); the daemon uses it too."""


def check_uid(uid: str, *, field: str = "uid") -> str:
    """A claim UID usable as one path component (letters, digits, dashes; ≤63)."""
    if not isinstance(uid, str) or not UID_RE.match(uid):
        raise InvalidInput(
            f"claim UID {quote(uid)} is not a safe identifier (letters, digits and '-', at most 63)",
            code=ErrorCode.INVALID_PATH,
            claim_uid=uid if isinstance(uid, str) and UID_RE.match(uid or "") else None,
            field=field,
        )
    return uid


def check_namespace(namespace: str, *, claim_uid: str | None = None) -> str:
    if not isinstance(namespace, str) or not DNS_LABEL_RE.match(namespace):
        raise InvalidInput(
            f"namespace {quote(namespace)} is not a DNS label",
            code=ErrorCode.INVALID_PATH,
            claim_uid=claim_uid,
            field="namespace",
        )
    return namespace


def check_name(name: str, *, claim_uid: str | None = None, field: str = "name") -> str:
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN_RE.match(name):
        raise InvalidInput(
            f"name {quote(name)} is not a DNS subdomain",
            code=ErrorCode.INVALID_PATH,
            claim_uid=claim_uid,
            field=field,
        )
    return name


def check_ref(uid: str, namespace: str, name: str) -> None:
    """A claim reference usable in paths: its UID, namespace and name all pass."""
    check_uid(uid)
    check_namespace(namespace, claim_uid=uid)
    check_name(name, claim_uid=uid)


def inside(root: Path, *parts: str, claim_uid: str | None = None) -> Path:
    """Join ``parts`` under ``root`` and refuse anything that would leave ``root``."""
    for part in parts:
        if not part or part in (".", "..") or "/" in part or "\0" in part:
            raise InvalidInput(
                f"path component {quote(part)} is not allowed",
                code=ErrorCode.INVALID_PATH,
                claim_uid=claim_uid,
                field="path",
            )
    path = root.joinpath(*parts)
    resolved_root = root.resolve()
    if not path.resolve().is_relative_to(resolved_root):
        raise InvalidInput(
            f"{path} escapes {root}", code=ErrorCode.INVALID_PATH, claim_uid=claim_uid, field="path"
        )
    return path
