"""The control link: a host link that aclservers listen on for TCP (the only pyroute2 import, made
inside the functions that talk netlink, so importing this module costs nothing).

The node keeps one link (default a bridge ``flexnpu0``; this kernel family may lack ``dummy``
links, so ``bridge`` or ``tap`` are used) with a link-local address (default
``169.254.213.1/24``, in the range node-local services such as NodeLocal DNSCache use, never
routed off the node). Each share's aclserver listens on that address with its own port; the
address goes into ``client.conf``. A per-claim extra address can be added and is recorded in
the checkpoint so cleanup removes it.

Errors are translated once, here: a link that cannot be created is a clear
:class:`~dra_driver.errors.Unavailable` at start, never a hang.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyroute2 import IPRoute

from dra_driver.errors import ErrorCode, InvalidInput, Unavailable

log = logging.getLogger("flexnpu.netlink")

DEFAULT_LINK = "flexnpu0"
DEFAULT_CIDR = "169.254.213.1/24"
LINK_KINDS = ("bridge", "tap")


@dataclass(frozen=True, slots=True)
class LinkSpec:
    name: str = DEFAULT_LINK
    cidr: str = DEFAULT_CIDR
    kind: str = "bridge"

    def validate(self) -> None:
        if not 1 <= len(self.name) <= 15 or "/" in self.name or " " in self.name:
            raise InvalidInput(
                f"link name {self.name!r} is not a valid interface name (1-15 chars)",
                code=ErrorCode.INVALID_CONFIG,
                field="control-link",
            )
        if self.kind not in LINK_KINDS:
            raise InvalidInput(
                f"link kind {self.kind!r} is not supported; use {' or '.join(LINK_KINDS)}",
                code=ErrorCode.INVALID_CONFIG,
                field="control-link-kind",
            )
        try:
            iface = ipaddress.ip_interface(self.cidr)
        except ValueError as exc:
            raise InvalidInput(
                f"{self.cidr!r} is not an address with a prefix length",
                code=ErrorCode.INVALID_CONFIG,
                field="control-link-cidr",
            ) from exc
        if iface.version != 4:
            raise InvalidInput(
                "only IPv4 control links", code=ErrorCode.INVALID_CONFIG, field="control-link-cidr"
            )

    @property
    def address(self) -> str:
        return str(ipaddress.ip_interface(self.cidr).ip)

    @property
    def prefixlen(self) -> int:
        return ipaddress.ip_interface(self.cidr).network.prefixlen


def _fail(what: str, exc: BaseException) -> Unavailable:
    return Unavailable(f"{what}: {exc}", code=ErrorCode.INTERNAL, field="control-link")


def ensure_link(spec: LinkSpec) -> int:
    """Create (or adopt) the link, set it up and give it its address. Returns the ifindex."""
    from pyroute2 import IPRoute  # imported on first use: a node without a link never loads it
    from pyroute2.netlink.exceptions import NetlinkError

    spec.validate()
    try:
        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=spec.name)
            if not found:
                if spec.kind == "tap":
                    ipr.link("add", ifname=spec.name, kind="tuntap", mode="tap")
                else:
                    ipr.link("add", ifname=spec.name, kind="bridge")
                found = ipr.link_lookup(ifname=spec.name)
                log.info("created control link %s (%s)", spec.name, spec.kind)
            index = int(found[0])
            kind = _kind(ipr, index)
            wanted = "tun" if spec.kind == "tap" else spec.kind
            if kind != wanted:
                raise Unavailable(
                    f"link {spec.name} already exists and is a {kind or 'plain'} link, not a {spec.kind}; "
                    "choose another --control-link name",
                    code=ErrorCode.INVALID_CONFIG,
                    field="control-link",
                )
            have = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=index, family=2)}
            if (spec.address, spec.prefixlen) not in have:
                ipr.addr("add", index=index, address=spec.address, prefixlen=spec.prefixlen)
            ipr.link("set", index=index, state="up")
            return index
    except NetlinkError as exc:
        raise _fail(f"cannot create control link {spec.name} {spec.cidr}", exc) from exc
    except OSError as exc:
        raise _fail(f"netlink unavailable for control link {spec.name}", exc) from exc


def remove_link(name: str) -> bool:
    """Delete the link if present (idempotent)."""
    from pyroute2 import IPRoute  # imported on first use: a node without a link never loads it
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        with IPRoute() as ipr:
            found = ipr.link_lookup(ifname=name)
            if not found:
                return False
            ipr.link("del", index=found[0])
            return True
    except NetlinkError as exc:
        raise _fail(f"cannot remove link {name}", exc) from exc


def _kind(ipr: IPRoute, index: int) -> str | None:
    info = ipr.get_links(index)[0].get_attr("IFLA_LINKINFO")
    return str(info.get_attr("IFLA_INFO_KIND")) if info is not None else None
