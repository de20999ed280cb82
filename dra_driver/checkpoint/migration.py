"""The one-time move of a version-1 checkpoint file into the version-2 record directory.

This module owns the migration's file effects and their crash safety: every record of the new
directory is durable before the old file is renamed to ``checkpoint.json.v1``, a crash between
the two renames is finished on the next start, and a damaged version-1 file is kept aside and
leaves the store untrusted (``_untrusted.json``) instead of reading as "nothing prepared".
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from dra_driver import files
from dra_driver.checkpoint.format import (
    BOOT_FILE,
    UNTRUSTED_FILE,
    Checkpoint,
    decode,
    encode_record,
    encode_small,
)
from dra_driver.errors import StateError

log = logging.getLogger("flexnpu.checkpoint")


def migrate_v1(path: Path, boot_id: str, corrupt_copies: list[Path]) -> None:
    """Turn a version-1 file at ``path`` (or a migration a crash interrupted) into the version-2
    directory; a damaged file is kept aside, its copy appended to ``corrupt_copies``."""
    v1_copy = path.with_name(path.name + ".v1")
    stale = list(path.parent.glob(f".{path.name}.migrating-*"))
    if os.path.lexists(path) and not path.is_dir():
        source = path
    elif not os.path.lexists(path) and stale and v1_copy.exists():
        source = v1_copy  # a crash between the two renames of an earlier migration
    else:
        return
    for old in stale:
        shutil.rmtree(old, ignore_errors=True)
    raw = files.read_nofollow(source, max_bytes=files.DEFAULT_MAX_READ)
    reason = ""
    try:
        cp = decode(raw, source=str(source))
    except StateError as err:
        copy = path.with_name(f"{path.name}.corrupt-{int(time.time() * 1000)}")
        reason = f"{err}; the file is kept at {copy}"
        log.error("%s: keeping it aside and trusting nothing until it is adopted or discarded", err)
        cp = Checkpoint(boot_id=boot_id)
        v1_copy = copy
        corrupt_copies.append(copy)
    tmp = path.with_name(f".{path.name}.migrating-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o700)
    for uid, entry in cp.claims.items():
        files.write_atomic(tmp / f"{uid}.json", encode_record(entry), sync=False)
    files.write_atomic(tmp / BOOT_FILE, encode_small("bootID", cp.boot_id), sync=False)
    if reason:
        files.write_atomic(tmp / UNTRUSTED_FILE, encode_small("reason", reason), sync=False)
    os.sync()  # every record of the migration is durable before the old file goes
    if source == path:
        os.replace(path, v1_copy)
    os.replace(tmp, path)
    files.fsync_dir(path.parent)
    if not reason:
        log.warning(
            "migrated the version-1 checkpoint (%d claims); the old file is kept at %s",
            len(cp.claims),
            v1_copy,
        )
