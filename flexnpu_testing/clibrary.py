"""Test and bench harness for the C client: build ``libascendcl/`` and compile C programs against it.

``build_library()`` runs ``make -C libascendcl`` (idempotent: make rebuilds only what changed)
under a file lock, so parallel test processes do not race, and returns the built
``libascendcl.so``. ``compile_program()`` compiles one C file of the repository with the system
compiler (warnings are errors) into a cache directory keyed by the source, the flags and the
library, and returns the executable. ``install_elf()`` and ``install_python()`` copy a host
executable with the dynamic loader and shared libraries it needs (as ``ldd`` resolves them)
into a container rootfs, so a dynamically linked program runs in the busybox rootfs of
``flexnpu_testing/podman.py``. Nothing here is used by the driver itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dra_driver import files

__all__ = [
    "LIBRARY_DIR",
    "SANITIZERS",
    "THREAD_SANITIZER",
    "build_library",
    "compile_program",
    "install_elf",
    "install_python",
    "library_path",
]

REPO = Path(__file__).resolve().parents[1]
LIBRARY_DIR = REPO / "libascendcl"
_BUILD = LIBRARY_DIR / "build"
_WARNINGS = ("-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror")
_CXX_WARNINGS = ("-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror")
_CXX_SUFFIXES = (".cc", ".cpp", ".cxx")


def library_path() -> Path:
    """Where ``make -C libascendcl`` puts the shared library."""
    return _BUILD / "libascendcl.so"


SANITIZERS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer")
THREAD_SANITIZER = ("-fsanitize=thread",)


def build_library(timeout: float = 300.0, *, sanitized: bool = False, thread_sanitized: bool = False) -> Path:
    """Build the library (if anything changed) and return its path; RuntimeError with make's output.

    ``sanitized``: a separate build in ``build/sanitized`` with AddressSanitizer and
    UndefinedBehaviorSanitizer (programs linked to it need ``SANITIZERS`` too);
    ``thread_sanitized``: one in ``build/tsan`` with ThreadSanitizer (``THREAD_SANITIZER``)."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        raise RuntimeError("make and a C compiler are needed (apt-get install gcc make)")
    _BUILD.mkdir(parents=True, exist_ok=True)
    variant, flags = ("sanitized", SANITIZERS) if sanitized else ("tsan", THREAD_SANITIZER)
    extra = (
        [f"BUILD=build/{variant}", f"CFLAGS=-O1 -g {' '.join(flags)}", f"LDFLAGS={flags[0]}"]
        if sanitized or thread_sanitized
        else []
    )
    with files.locked(_BUILD / ".lock", timeout=timeout):
        res = subprocess.run(
            ["make", "-s", "-C", str(LIBRARY_DIR), *extra],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    if res.returncode != 0:
        raise RuntimeError(f"make -C libascendcl failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return _BUILD / variant / "libascendcl.so" if sanitized or thread_sanitized else library_path()


def compile_program(
    source: Path,
    *,
    link_library: Path | None = None,
    include_acl_headers: bool = True,
    extra_flags: Sequence[str] = (),
    out_dir: Path | None = None,
    rpath: bool = True,
) -> Path:
    """Compile ``source`` (C11, or C++17 for ``.cc``/``.cpp``/``.cxx``) into an executable and return its path.

    ``link_library``: a ``libascendcl.so`` to link with ``-lascendcl`` (its directory is searched
    and, when ``rpath`` is set, recorded as RUNPATH). ``include_acl_headers``: add
    ``libascendcl/include`` to the include path (an "unmodified" program declares its own).
    """
    cxx = source.suffix in _CXX_SUFFIXES
    flags = [*(_CXX_WARNINGS if cxx else _WARNINGS), *extra_flags]
    if include_acl_headers:
        flags.append(f"-I{LIBRARY_DIR / 'include'}")
    libs: list[str] = []
    if link_library is not None:
        libs += [f"-L{link_library.parent}", "-lascendcl"]
        if rpath:
            libs.append(f"-Wl,-rpath,{link_library.parent}")
    libs += ["-pthread", "-ldl"]
    key = hashlib.sha256()
    key.update(source.read_bytes())
    for local in sorted(set(re.findall(rb'^#include "([^"/]+)"', source.read_bytes(), flags=re.M))):
        beside = source.parent / local.decode()
        if beside.is_file():  # a header next to the source (tests/c/check.h): part of the key
            key.update(beside.read_bytes())
    key.update("\0".join(flags + libs).encode())
    if link_library is not None:
        key.update(link_library.read_bytes())
    out_dir = out_dir or _BUILD / "programs"
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / f"{source.stem}-{key.hexdigest()[:16]}"
    if exe.exists():
        return exe
    tmp = exe.with_name(exe.name + ".tmp")
    res = subprocess.run(
        ["c++" if cxx else "cc", *flags, str(source), "-o", str(tmp), *libs],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(f"compiling {source} failed:\n{res.stderr}")
    tmp.replace(exe)
    return exe


_LDD_LINE = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")


def shared_libraries(path: Path) -> list[Path]:
    """The absolute paths ``ldd`` resolves for ``path`` (the loader included); [] for a static file."""
    res = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=30, check=False)
    if res.returncode != 0:
        return []
    return [Path(m.group(1)) for line in res.stdout.splitlines() if (m := _LDD_LINE.match(line))]


def _copy_into(rootfs: Path, host: Path, inside: Path | None = None) -> Path:
    target = rootfs / str(inside or host).lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        shutil.copy(host, target)  # follows symlinks: the rootfs gets a regular file at that path
    return target


def install_elf(rootfs: Path, host: Path, inside: str) -> None:
    """Copy ``host`` to ``inside`` in ``rootfs`` with every library it loads, at the host's paths."""
    _copy_into(rootfs, host, Path(inside))
    for lib in shared_libraries(host):
        _copy_into(rootfs, lib)


def install_python(rootfs: Path, *, modules: str = "ctypes") -> str:
    """Copy the system Python 3 (``/usr/bin/python3``), the stdlib files that ``python3 -S -I``
    loads to import ``modules``, and their libraries into ``rootfs``. Returns its path inside."""
    exe = Path("/usr/bin/python3").resolve()
    probe = (
        f"import sys, json, {modules}; "
        "print(json.dumps(sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)})))"
    )
    out = subprocess.run(
        [str(exe), "-S", "-I", "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    install_elf(rootfs, exe, str(exe))
    for name in json.loads(out.stdout):
        f = Path(name)
        _copy_into(rootfs, f)
        if f.suffix == ".so":
            for lib in shared_libraries(f):
                _copy_into(rootfs, lib)
    return str(exe)
