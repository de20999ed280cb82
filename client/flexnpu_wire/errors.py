"""The one error the wire contracts raise: a document or frame that breaks its contract.

The contracts are shared by the driver (which translates ``ContractError`` into its own
``InvalidInput`` at one boundary: ``dra_driver/wirefiles.py``)
and the container client (which turns it into an ACL return code). Nothing here imports the
driver, so the client distribution stays free of its dependencies.
"""

from __future__ import annotations

__all__ = ["ContractError", "Unreadable"]


class ContractError(ValueError):
    """A malformed document: ``source`` (a file path), ``field`` and ``claim_uid`` when known."""

    def __init__(
        self, message: str, *, source: str = "", field: str | None = None, claim_uid: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.field = field
        self.claim_uid = claim_uid


class Unreadable(ContractError):
    """The document could not be read at all (missing, unreadable, too large, not UTF-8)."""
