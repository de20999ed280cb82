"""``python -m flexnpu_client.probe`` (also ``flexnpu-probe``): print device count and memory, try one allocation.

Exit code 0 when every step succeeded, 1 otherwise (the message says which step failed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flexnpu_client.errors import ClientError
from flexnpu_client.session import Session


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flexnpu-probe", description="Probe the FlexNPU vNPUs of this container"
    )
    parser.add_argument(
        "--conf", help="client.conf path (default $FLEXNPU_CONF, then /etc/flexnpu/client.conf)"
    )
    parser.add_argument(
        "--alloc", type=int, default=1 << 20, help="bytes to allocate on each device (default 1 MiB)"
    )
    args = parser.parse_args(argv)
    try:
        with Session.open(args.conf) as session:
            session.init()
            count = session.get_device_count()
            print(f"claim {session.conf.claim_uid}: {count} vNPU(s) via {session.transport_kind}")
            for device in range(count):
                session.set_device(device)
                free, total = session.get_mem_info()
                ptr = session.malloc(args.alloc)
                payload = bytes(range(256)) * (min(args.alloc, 4096) // 256)
                session.copy_to_device(ptr, payload)
                ok = session.copy_from_device(ptr, len(payload)) == payload
                session.free(ptr)
                print(
                    f"device {device}: memory free={free} total={total}; malloc {args.alloc} ok;"
                    f" round trip {'ok' if ok else 'MISMATCH'}"
                )
                if not ok:
                    return 1
            session.finalize()
    except ClientError as exc:
        print(f"flexnpu-probe: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
