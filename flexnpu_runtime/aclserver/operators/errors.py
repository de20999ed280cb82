"""The operator library's one error type: an ACL error number and a sentence naming the op and the field.

``OperatorError.code`` is the number the program sees (``aclopCompileAndExecute``'s return, or the stream's
error after an ``aclnn`` launch); the codes are CANN's (``acl/acl_base_rt.h``; ``aclnn/opdev/op_errno.h``).
"""

from __future__ import annotations

__all__ = [
    "ACLNN_ERR_PARAM_INVALID",
    "ACL_ERROR_INVALID_PARAM",
    "ACL_ERROR_OP_ATTR_NOT_MATCH",
    "ACL_ERROR_OP_INPUT_NOT_MATCH",
    "ACL_ERROR_OP_NOT_FOUND",
    "ACL_ERROR_OP_OUTPUT_NOT_MATCH",
    "ACL_ERROR_UNSUPPORTED_DATA_TYPE",
    "OperatorError",
    "UnknownOperator",
]

ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_OP_INPUT_NOT_MATCH = 100021
"""An input is missing, or its shape or dtype does not fit the op."""
ACL_ERROR_OP_OUTPUT_NOT_MATCH = 100022
"""An output is missing, or its shape does not fit the result."""
ACL_ERROR_OP_ATTR_NOT_MATCH = 100023
"""An attribute (or an aclnn scalar parameter) is missing or of the wrong kind or value."""
ACL_ERROR_OP_NOT_FOUND = 100024
"""No kernel for the op type (or aclnn function)."""
ACL_ERROR_UNSUPPORTED_DATA_TYPE = 100026
"""A dtype the op does not compute."""
ACLNN_ERR_PARAM_INVALID = 161002
"""CANN's aclnn status for a bad parameter (``aclnn/opdev/op_errno.h``)."""

MESSAGE_MAX = 500


class OperatorError(Exception):
    """An op could not run; ``code`` is its ACL error number, ``message`` names the op and the field."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = message if len(message) <= MESSAGE_MAX else message[:MESSAGE_MAX] + "…"
        super().__init__(f"{self.message} [ACL {code}]")


class UnknownOperator(OperatorError):
    """No kernel has this op's name (``ACL_ERROR_OP_NOT_FOUND``)."""

    def __init__(self, op: str) -> None:
        shown = op if len(op) <= 100 else op[:100] + "…"
        super().__init__(
            ACL_ERROR_OP_NOT_FOUND, f"operator {shown!r} is not in FlexNPU's emulated operator set"
        )
        self.op = op
