"""Safe paths from API strings: no path in this driver is built from an unchecked string.

Claim UIDs, namespaces and names come from the kubelet and the API. Before any of them is
used in a file name they pass through these checks, and the joined path is verified to stay
inside its root.
"""

from __future__ import annotations

import re
from pathlib import Path

from dra_driver.errors import ErrorCode, InvalidInput

_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_uid(uid: str, *, field: str = "uid") -> str:
    """A claim UID usable as one path component (letters, digits, dashes; ≤63)."""
    if not isinstance(uid, str) or not _UID_RE.match(uid):
        raise InvalidInput(
            f"claim UID {uid!r} is not a safe identifier (letters, digits and '-', at most 63)",
            code=ErrorCode.INVALID_PATH,
            claim_uid=uid if isinstance(uid, str) and _UID_RE.match(uid or "") else None,
            field=field,
        )
    return uid


def check_namespace(namespace: str, *, claim_uid: str | None = None) -> str:
    if not isinstance(namespace, str) or not _DNS_LABEL_RE.match(namespace):
        raise InvalidInput(
            f"namespace {namespace!r} is not a DNS label",
            code=ErrorCode.INVALID_PATH,
            claim_uid=claim_uid,
            field="namespace",
        )
    return namespace


def check_name(name: str, *, claim_uid: str | None = None, field: str = "name") -> str:
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN_RE.match(name):
        raise InvalidInput(
            f"name {name!r} is not a DNS subdomain",
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
                f"path component {part!r} is not allowed",
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
