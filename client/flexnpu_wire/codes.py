"""ACL numeric error codes and enums (aclrtMemcpyKind, aclrtMemAttr, policies) used on the wire.

Values follow the public acl_base.h / rt_error_codes.h headers. Pure constants only.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

__all__ = [
    "ACL_ERROR_API_NOT_SUPPORT",
    "ACL_ERROR_BAD_ALLOC",
    "ACL_ERROR_INTERNAL_ERROR",
    "ACL_ERROR_INVALID_DEVICE",
    "ACL_ERROR_INVALID_FILE",
    "ACL_ERROR_INVALID_MODEL_ID",
    "ACL_ERROR_INVALID_PARAM",
    "ACL_ERROR_INVALID_RESOURCE_HANDLE",
    "ACL_ERROR_MODEL_INPUT_NOT_MATCH",
    "ACL_ERROR_MODEL_NOT_DYNAMIC",
    "ACL_ERROR_MODEL_OUTPUT_NOT_MATCH",
    "ACL_ERROR_MODEL_SIZE_INVALID",
    "ACL_ERROR_PARSE_FILE",
    "ACL_ERROR_PARSE_MODEL",
    "ACL_ERROR_READ_MODEL_FAILURE",
    "ACL_ERROR_REPEAT_FINALIZE",
    "ACL_ERROR_REPEAT_INITIALIZE",
    "ACL_ERROR_RT_MEMORY_ALLOCATION",
    "ACL_ERROR_RT_NO_PERMISSION",
    "ACL_ERROR_RT_NO_STREAM_RESOURCE",
    "ACL_ERROR_RT_RESOURCE_ALLOC_FAIL",
    "ACL_ERROR_UNINITIALIZE",
    "ACL_SUCCESS",
    "MALLOC_POLICY_BASES",
    "MALLOC_POLICY_FLAGS",
    "MEM_ATTR_VALUES",
    "MallocPolicy",
    "MemAttr",
    "MemcpyKind",
    "Policy",
    "Priority",
]

ACL_SUCCESS = 0
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
"""aclInit: client.conf is missing or cannot be read."""
ACL_ERROR_PARSE_FILE = 100006
"""aclInit: client.conf is not a valid document (``get_last_error`` names the field)."""
ACL_ERROR_INVALID_MODEL_ID = 100011
ACL_ERROR_PARSE_MODEL = 100013
"""The bytes are not a model the backend can load (for the emulated one: docs/model-format.md)."""
ACL_ERROR_READ_MODEL_FAILURE = 100014
ACL_ERROR_MODEL_SIZE_INVALID = 100015
ACL_ERROR_MODEL_INPUT_NOT_MATCH = 100017
ACL_ERROR_MODEL_OUTPUT_NOT_MATCH = 100018
ACL_ERROR_MODEL_NOT_DYNAMIC = 100019
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_API_NOT_SUPPORT = 200001
ACL_ERROR_INVALID_DEVICE = 200002
ACL_ERROR_INVALID_RESOURCE_HANDLE = 200005
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_RESOURCE_ALLOC_FAIL = 207005
ACL_ERROR_RT_NO_PERMISSION = 207006
ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_INTERNAL_ERROR = 500000


class MemcpyKind(IntEnum):
    """aclrtMemcpyKind."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4


class MemAttr(IntEnum):
    """aclrtMemAttr (the emulated die has one memory pool; every attribute reports the quota)."""

    DDR_MEM = 0
    HBM_MEM = 1
    DDR_HUGE = 2
    DDR_NORMAL = 3
    HBM_HUGE = 4
    HBM_NORMAL = 5


class MallocPolicy(IntEnum):
    """aclrtMemMallocPolicy (accepted and recorded; the emulated backend has one page size)."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2
    HUGE_FIRST_P2P = 3
    HUGE_ONLY_P2P = 4
    NORMAL_ONLY_P2P = 5


MEM_ATTR_VALUES = range(18)
"""Every aclrtMemAttr CANN defines (ACL_DDR_MEM = 0 … ACL_MEM_P2P_HUGE1G = 17), as the server accepts them."""
MALLOC_POLICY_BASES = range(8)
"""Every base aclrtMemMallocPolicy (HUGE_FIRST = 0 … ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7)."""
MALLOC_POLICY_FLAGS = 0x0100 | 0x1000 | 0x100000
"""Flags CANN accepts or-ed onto a base policy: ACL_MEM_TYPE_LOW_BAND_WIDTH, ACL_MEM_TYPE_HIGH_BAND_WIDTH,
ACL_MEM_ACCESS_USER_SPACE_READONLY."""


class Policy(StrEnum):
    """AI-Core scheduling policy of a die (vCANN-RT numbering in ``number``)."""

    FIXED = "fixed"
    ELASTIC = "elastic"
    BEST_EFFORT = "best-effort"

    @property
    def number(self) -> int:
        return _POLICY_NUMBERS[self]

    @classmethod
    def from_number(cls, number: int) -> Policy:
        for policy, value in _POLICY_NUMBERS.items():
            if value == number:
                return policy
        raise ValueError(f"unknown policy number {number}")


_POLICY_NUMBERS = {Policy.FIXED: 1, Policy.ELASTIC: 2, Policy.BEST_EFFORT: 3}


class Priority(StrEnum):
    """When a share's work gets its die (``docs/latency.md``); never how much of it (that is the policy).

    ``rank`` orders the shares waiting for a die (lower first); ``number`` is its code in the die ledger
    (0 reads as ``normal``: an entry written before priorities existed)."""

    LATENCY_CRITICAL = "latency-critical"
    NORMAL = "normal"
    BATCH = "batch"

    @property
    def number(self) -> int:
        return _PRIORITY_NUMBERS[self]

    @property
    def rank(self) -> int:
        return _PRIORITY_NUMBERS[self] - 1

    @classmethod
    def from_number(cls, number: int) -> Priority:
        for priority, value in _PRIORITY_NUMBERS.items():
            if value == number:
                return priority
        if number == 0:
            return cls.NORMAL
        raise ValueError(f"unknown priority number {number}")


_PRIORITY_NUMBERS = {Priority.LATENCY_CRITICAL: 1, Priority.NORMAL: 2, Priority.BATCH: 3}
