"""The device behind the aclserver: the ``Backend`` protocol the session layer calls, and ``AclFailure``.

Two implementations: ``backend_emulated.py`` (host memory as device memory, ledger-scheduled
sleeps as kernels) and
``backend_ascend.py`` (the host's CANN runtime through ctypes). What both share — shares, the
memory quota, allocations, die time, ``release_all`` — is written once in ``quota.py``
(``QuotaBook``): each backend builds its book with how to drop its device memory, and the
wiring (``main.py``) hands that book to whom needs it; a backend itself only touches its device.
The values both sides share — ``Allocation``, ``Buffer``, ``AclFailure`` — are defined here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from flexnpu_wire.modelfile import ModelFile

if TYPE_CHECKING:
    from flexnpu_runtime.aclserver import datalink

__all__ = ["KERNEL_RESULT_BYTES", "AclFailure", "Allocation", "Backend", "Buffer", "LoadedModel"]

KERNEL_RESULT_BYTES = 16


class AclFailure(Exception):
    """An ACL call failed with a numeric ACL error code; nothing was changed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True, eq=False)
class Allocation:
    """One device allocation (the quota book's record); ``payload`` is the backend's handle of its memory."""

    base: int
    size: int
    accounted: int
    device: int
    owner: int
    payload: Any = None
    pins: int = 0
    freed: bool = False


@dataclass(frozen=True, slots=True)
class Buffer:
    """A range of device memory a model uses: ``size`` bytes at ``ptr`` inside ``alloc``."""

    ptr: int
    size: int
    alloc: Allocation


@dataclass(slots=True, eq=False)
class LoadedModel:
    """A model a backend loaded: its description and the device memory it holds.

    ``own`` is memory the load took from the quota (freed at unload); ``lent`` is what the caller
    provided (``...WithMem``), pinned while the model is loaded. ``handle`` is the backend's."""

    device: int
    desc: ModelFile
    weight: Buffer | None
    work: Buffer | None
    own: list[Allocation] = field(default_factory=list)
    lent: list[Allocation] = field(default_factory=list)
    handle: Any = None
    last_cost_us: int = 0


class Backend(Protocol):
    """What the session layer needs from a device. Pointers are opaque ints the backend owns.

    ``owner`` is the session an allocation belongs to; the backend's quota book (``quota.py``)
    answers for shares, quotas, lookups, frees, compute slices and ``release_all``.
    """

    def mem_info(self, device: int) -> tuple[int, int]:
        """(free, total) of the device's memory quota (free never more than the device has)."""
        ...

    def malloc(self, device: int, size: int, policy: int, *, owner: int = 0) -> int: ...

    def memset(self, ptr: int, value: int, count: int, *, owner: int = 0) -> None: ...

    def memcpy(
        self,
        *,
        dst: int,
        src: int,
        count: int,
        span: int,
        dst_region: datalink.AnyRegion | None,
        src_region: datalink.AnyRegion | None,
        owner: int = 0,
    ) -> None:
        """One copy: a host side is a data-link region (``None`` for a device side); a device side
        is checked for all of ``span`` first, so a bad chunked copy changes nothing."""
        ...

    def device_view(self, ptr: int, count: int, *, owner: int = 0) -> memoryview:
        """A writable view of ``count`` bytes at ``ptr`` (AclFailure if the host cannot address
        device memory, or if it is not one owned allocation)."""
        ...

    def complete_kernel(
        self, *, out_ptr: int, tag: int, input_view: memoryview | None, owner: int = 0
    ) -> None:
        """Produce a finished kernel's visible result (tag and CRC32 of its input at ``out_ptr``)."""
        ...

    def peek(self, ptr: int, count: int, *, owner: int) -> bytes:
        """``count`` bytes of device memory at ``ptr`` (a model's dynamic-shape input, say)."""
        ...

    def describe_model(self, data: memoryview) -> ModelFile:
        """The description of the model in ``data`` (AclFailure 100013 if it is not one)."""
        ...

    def load_model(
        self, device: int, data: memoryview, desc: ModelFile, *, weight: Buffer | None, work: Buffer | None
    ) -> LoadedModel:
        """Load the model in ``data`` (described by ``desc``) on ``device`` into the weight and
        work memory given (the session layer took it from the quota or the caller)."""
        ...

    def execution(
        self,
        model: LoadedModel,
        inputs: list[Buffer],
        outputs: list[Buffer],
        *,
        batch: int,
        hw: tuple[int, int],
    ) -> tuple[int, Callable[[], None]]:
        """(die microseconds the execution is charged, the step that computes the outputs)."""
        ...

    def unload_model(self, model: LoadedModel) -> None:
        """Release what the backend holds for ``model`` (its memory goes through the book)."""
        ...

    def close(self) -> None: ...
