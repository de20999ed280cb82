"""Which aclservers and cgroups are provably this daemon's: an install identity, recorded and checked.

The claims' cgroups live under one parent (``flexnpu.slice``) that every daemon on a host may
share: a second install, or a daemon whose registry was lost or damaged, finds live aclservers it
has no registry entry for. None of them is proof that its claim is gone (issue 25, class 7). So:

- Each daemon state (``--state-dir``, one daemon at a time by its lock) has an install identity,
  made once and kept in ``<state-dir>/daemon.id`` (:func:`install_id`).
- Each claim cgroup it makes carries that identity in the extended attribute
  :data:`OWNER_XATTR` (``trusted.*``: only CAP_SYS_ADMIN writes it, no tenant can forge it).
- At recovery a live aclserver no entry owns is a :class:`Doubt`: kept, reported, counted, never
  killed. An *empty* claim cgroup no entry owns is removed only when it carries our identity (or
  none: one made before the identity existed); another install's stays.
- The plugin's Register or Unregister of a kept claim is the proof: its aclserver is then stopped
  (to be started again, or for good) like any of ours, but only when the doubt is ours.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from dra_driver import files

__all__ = ["ID_FILE", "OWNER_XATTR", "Doubt", "install_id", "read_owner", "tag"]

ID_FILE = "daemon.id"
OWNER_XATTR = "trusted.flexnpu.owner"
_ID_BYTES = 16


@dataclass(frozen=True, slots=True)
class Doubt:
    """A live aclserver (or a cgroup with processes) at recovery that no registry entry owns: kept."""

    claim_uid: str
    pids: tuple[int, ...]
    owner: str
    """The install identity it carries: ours, another daemon's, or "" when unknown."""
    found: str
    """How it was found (its cgroup, its command line, our zygote's marker)."""

    def ours(self, install: str) -> bool:
        return bool(install) and self.owner == install

    def describe(self, install: str) -> str:
        whose = (
            "this daemon's"
            if self.ours(install)
            else (f"another daemon's ({self.owner})" if self.owner else "of unknown owner")
        )
        return f"claim {self.claim_uid}: pids {list(self.pids)} ({self.found}; {whose})"


def install_id(state_dir: Path) -> str:
    """This daemon state's identity, made on first use (hex; a damaged file is made again)."""
    path = state_dir / ID_FILE
    with contextlib.suppress(OSError, UnicodeDecodeError):
        text = files.read_nofollow(path, max_bytes=256).decode().strip()
        if len(text) == 2 * _ID_BYTES and all(c in "0123456789abcdef" for c in text):
            return text
    made = secrets.token_hex(_ID_BYTES)
    files.write_atomic(path, (made + "\n").encode(), mode=0o600, dir_mode=0o700)
    return made


def tag(cgroup_dir: Path, install: str) -> bool:
    """Record ``install`` on a cgroup directory; False where the file system keeps no such attribute."""
    if not install:
        return False
    try:
        os.setxattr(cgroup_dir, OWNER_XATTR, install.encode(), follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES):
            return False
        raise
    return True


def read_owner(cgroup_dir: Path) -> str:
    """The install identity a cgroup directory carries ("" when none or unreadable)."""
    try:
        return os.getxattr(cgroup_dir, OWNER_XATTR, follow_symlinks=False).decode(errors="replace")[:64]
    except OSError:
        return ""
