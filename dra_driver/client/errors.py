"""Exceptions of the client library::

ClientError
├── AclError        the aclserver answered with a non-zero ACL code (``.ret``)
└── ConnectError    no endpoint of client.conf answered (also a dra_driver Unavailable)
"""

from __future__ import annotations

from dra_driver.errors import ErrorCode, Unavailable

__all__ = ["AclError", "ClientError", "ConnectError"]


class ClientError(Exception):
    """Base of client-library errors."""


class AclError(ClientError):
    """An ACL call failed; ``ret`` is the ACL error code, ``message`` the server's explanation."""

    def __init__(self, ret: int, message: str) -> None:
        super().__init__(f"ACL error {ret}: {message}")
        self.ret = ret
        self.message = message


class ConnectError(ClientError, Unavailable):
    """The aclserver could not be reached or refused the connection."""

    def __init__(self, message: str, *, claim_uid: str | None = None) -> None:
        Unavailable.__init__(self, message, code=ErrorCode.DAEMON_UNAVAILABLE, claim_uid=claim_uid)
