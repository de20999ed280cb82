"""Safe paths from API strings: no path in this driver is built from an unchecked string.

Claim UIDs come from the kubelet and the API, under one rule (``dra_kubeletplugin.claims.CLAIM_UID_RE``),
checked once, where the kubelet's reference comes in: the helper refuses a malformed UID, namespace
or name before the driver sees it (``dra_kubeletplugin/claimbatch.py``), so the layers inside take
the reference as checked. Every joined path is still verified to stay inside its root
(:func:`inside`: no separator, no ``..``, no escape through a symlink).
"""

from __future__ import annotations

from pathlib import Path

from dra_driver.errors import ErrorCode, InvalidInput, quote
from dra_kubeletplugin.claims import CLAIM_UID_RE

UID_RE = CLAIM_UID_RE
"""The one claim-UID rule (``dra_kubeletplugin.claims.CLAIM_UID_RE``, where it is explained); the daemon uses it too."""


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


def contained(path: Path, *, claim_uid: str | None = None) -> Path:
    """``path`` as :func:`inside` its own directory would join it: refused unless its last part is a
    plain name that does not lead out of that directory (checked where the path is written)."""
    return inside(path.parent, path.name, claim_uid=claim_uid)
