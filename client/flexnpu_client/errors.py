"""Exceptions of the client library (the pyACL-shaped functions turn each into a return code)::

ClientError
├── AclError        the aclserver answered with a non-zero ACL code (``.ret``)
├── ConfigError     client.conf is missing or malformed (also a flexnpu_wire ContractError)
└── ConnectError    no endpoint of client.conf answered, or the aclserver refused the session
"""

from __future__ import annotations

from flexnpu_wire.errors import ContractError, Unreadable

__all__ = ["AclError", "ClientError", "ConfigError", "ConnectError"]


class ClientError(Exception):
    """Base of client-library errors."""


class AclError(ClientError):
    """An ACL call failed; ``ret`` is the ACL error code, ``message`` the server's explanation."""

    def __init__(self, ret: int, message: str) -> None:
        super().__init__(f"ACL error {ret}: {message}")
        self.ret = ret
        self.message = message


class ConfigError(ClientError, ContractError):
    """client.conf could not be read or is malformed (``field`` names the bad field)."""

    unreadable: bool = False
    """True when the file could not be read at all (missing, unreadable), not merely malformed."""

    @classmethod
    def of(cls, exc: ContractError) -> ConfigError:
        err = cls(exc.message, source=exc.source, field=exc.field, claim_uid=exc.claim_uid)
        err.unreadable = isinstance(exc, Unreadable)
        return err


class ConnectError(ClientError):
    """The aclserver could not be reached or refused the connection."""

    def __init__(self, message: str, *, claim_uid: str | None = None, ret: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.claim_uid = claim_uid
        self.ret = ret
        """The ACL code of a refusal (0 when the aclserver was not reached)."""
