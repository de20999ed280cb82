"""How a soft share's CDI spec makes unmodified ACL programs use FlexNPU's ``libascendcl.so``.

Pure: given the claim's ``interposition`` choices (opaque config, ``dra_driver/sharing.py``) and
where the client library lives on the host, return the CDI container edits. Nothing here reads
the file system; the caller passes the probe that says whether the library is installed.

The mechanism is an ``/etc/ld.so.preload`` mount. The spec mounts the library read-only at
``/usr/lib/flexnpu/libascendcl.so`` and a one-line preload list naming that path at
``/etc/ld.so.preload``. glibc's loader loads it into every dynamic process of the container
before the program's own libraries. Its SONAME is ``libascendcl.so``, so a ``-lascendcl``
dependency (DT_NEEDED) and ``dlopen("libascendcl.so")`` (pyACL, ctypes, framework plugins) both
match the already loaded shim by SONAME before any path is searched. This holds whether or not
the image ships CANN and whatever ``LD_LIBRARY_PATH`` it sets. The other two options fail on
some images:

* a mount over the CANN library path helps only images that have CANN at exactly that path
  (or that set ``LD_LIBRARY_PATH`` to it);
* a loader-path environment variable (``LD_LIBRARY_PATH`` set by CDI) replaces the image's own
  value, and CANN images depend on theirs.

The closure: frameworks load more of CANN than ``libascendcl.so`` (torch_npu links
``libhccl.so``, ``libacl_op_compiler.so``, ``libge_runner.so``, ``libgraph.so``,
``libacl_tdt_channel.so``, the ``rt*`` and ``Msprof*`` functions, and ``dlopen``s ``libopapi.so``).
FlexNPU builds each under CANN's SONAME beside the library (``libascendcl/api/closure.json``); the spec
mounts every one of them into ``/usr/lib/flexnpu/`` and the preload list names them all, so each
wins by SONAME exactly as ``libascendcl.so`` does, with or without CANN in the image.

Limits: a program that ``dlopen``s CANN's library by its absolute path gets CANN's copy;
statically linked and musl programs ignore ``/etc/ld.so.preload``; an image's own
``/etc/ld.so.preload`` is hidden while the mount is in place.

Modes: ``preload`` injects the shim and fails the prepare (naming the field) if the node has no
client library; ``auto`` (the default) injects it when the library is installed and otherwise
leaves the container as it is; ``none`` never injects (the application brings its own client,
e.g. the Python ``flexnpu_client``). All shares of one claim must agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from dra_driver import cdi
from dra_driver.errors import ErrorCode, InvalidInput
from dra_driver.sharing import Interposition, VnpuConfig

__all__ = [
    "CONTAINER_LIBRARY",
    "CONTAINER_PRELOAD",
    "PRELOAD_LIST_NAME",
    "ClientLibrary",
    "Interposition",
    "Plan",
    "client_library",
    "for_claim",
    "plan",
    "resolve_mode",
]

CONTAINER_LIBRARY = "/usr/lib/flexnpu/libascendcl.so"
"""Where a container sees the shim (the only line of the preload list)."""
CLOSURE_LIBRARIES = (
    "libacl_op_compiler.so",
    "libruntime.so",
    "libhccl.so",
    "libprofapi.so",
    "libge_runner.so",
    "libgraph.so",
    "libacl_tdt_channel.so",
    "libnnopbase.so",
    "libopapi.so",
    "libaclnn_ops_infer.so",
    "libaclnn_ops_train.so",
    "libaclnn_math.so",
    "libaclnn_sparse.so",
    "libaclnn_fft.so",
    "libaclnn_rand.so",
)
"""The closure's libraries (``libascendcl/api/closure.json``, in its order), installed beside the library."""
CONTAINER_PRELOAD = "/etc/ld.so.preload"
PRELOAD_LIST_NAME = "ld.so.preload"
"""The preload list's file name, beside the library on the host (``make install`` puts it there)."""
_RO = ("ro", "nosuid", "nodev", "rbind")


@dataclass(frozen=True, slots=True)
class ClientLibrary:
    """The client library on the host: the shared object and the preload list beside it."""

    library: str
    preload_list: str
    installed: bool

    @property
    def closure(self) -> tuple[str, ...]:
        """The host paths of the closure's libraries (beside the library)."""
        return tuple(str(PurePosixPath(self.library).parent / name) for name in CLOSURE_LIBRARIES)


@dataclass(frozen=True, slots=True)
class Plan:
    """What the spec gets: the mode in effect (``preload`` or ``none``) and its container edits."""

    mode: Interposition
    edits: cdi.Edits


def client_library(library: str, *, is_file: Callable[[str], bool]) -> ClientLibrary:
    """The host paths for a library path (the ``--client-library`` flag); ``is_file`` (the caller's
    file-system probe, e.g. ``os.path.isfile``) decides whether both files are installed."""
    preload_list = str(PurePosixPath(library).parent / PRELOAD_LIST_NAME)
    found = ClientLibrary(library, preload_list, installed=False)
    installed = all(is_file(p) for p in (library, preload_list, *found.closure))
    return ClientLibrary(library, preload_list, installed=installed)


def resolve_mode(modes: Iterable[Interposition], *, claim_uid: str) -> Interposition:
    """The one mode of a claim from the modes of its shares (AUTO when it has none)."""
    distinct = sorted(set(modes))
    if len(distinct) > 1:
        raise InvalidInput(
            f"claim {claim_uid}: every share of a claim must use the same interposition, got "
            + ", ".join(distinct),
            code=ErrorCode.INVALID_OPAQUE_CONFIG,
            claim_uid=claim_uid,
            field="interposition",
        )
    return distinct[0] if distinct else Interposition.AUTO


def plan(mode: Interposition, library: ClientLibrary, *, claim_uid: str) -> Plan:
    """The container edits for a share claim's chosen ``mode`` (InvalidInput for an impossible one)."""
    if mode == Interposition.NONE or (mode == Interposition.AUTO and not library.installed):
        return Plan(Interposition.NONE, cdi.Edits())
    if not library.installed:
        raise InvalidInput(
            f"claim {claim_uid}: interposition 'preload' needs FlexNPU's client library on the node, but"
            f" {library.library}, {library.preload_list} or a library of its closure"
            f" ({', '.join(CLOSURE_LIBRARIES)}) is missing beside it (install them with"
            " `make -C libascendcl install`, or point --client-library at it)",
            code=ErrorCode.INVALID_OPAQUE_CONFIG,
            claim_uid=claim_uid,
            field="interposition",
        )
    return Plan(
        Interposition.PRELOAD,
        cdi.Edits(
            env=(f"FLEXNPU_INTERPOSITION={Interposition.PRELOAD}",),
            mounts=(
                cdi.Mount(library.library, CONTAINER_LIBRARY, _RO),
                *(
                    cdi.Mount(host, str(PurePosixPath(CONTAINER_LIBRARY).parent / name), _RO)
                    for host, name in zip(library.closure, CLOSURE_LIBRARIES, strict=True)
                ),
                cdi.Mount(library.preload_list, CONTAINER_PRELOAD, _RO),
            ),
        ),
    )


def for_claim(configs: Iterable[VnpuConfig], library: ClientLibrary, *, claim_uid: str) -> Plan:
    """``plan`` for the resolved opaque configs of a claim's shares (they must agree)."""
    return plan(
        resolve_mode((c.interposition for c in configs), claim_uid=claim_uid), library, claim_uid=claim_uid
    )
