"""Asks an aclserver whether it still serves: the unauthenticated PING op on its unix socket.

Process liveness (``processes.is_alive``) says the process exists; this says it answers. Used by
``List`` to report a live but unresponsive aclserver as ``Unknown``. Never raises.
"""

from __future__ import annotations

import socket

from flexnpu_wire import framing as protocol

_REQUEST_ID = 0x464E  # arbitrary, echoed back


def ping(unix_socket: str, *, timeout: float = 1.0) -> int | None:
    """The pid in the aclserver's PONG, or None if it does not answer within ``timeout``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(unix_socket)
            s.sendall(protocol.encode(protocol.Op.PING, _REQUEST_ID))
            msg = protocol.FrameReader(s, 4096).read()
    except (OSError, protocol.ProtocolError):
        return None
    if msg is None or msg.op != protocol.Op.PING or msg.request_id != _REQUEST_ID or len(msg.ints) < 2:
        return None
    return int(msg.ints[1]) if msg.ints[0] == 0 else None
