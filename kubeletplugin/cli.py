"""``flexnpu-dra``: ``plugin`` runs the node process; ``demo`` walks claims through a local node."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dra_driver import config
from dra_driver.errors import FlexNPUError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flexnpu-dra", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plugin = sub.add_parser("plugin", help="run the node process (kubelet plugin + controllers)")
    config.add_flags(plugin)
    demo = sub.add_parser("demo", help="local node with emulated NPUs; walk claims through their lifecycle")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory for inspection")
    args = parser.parse_args(argv)
    if args.command == "plugin":
        from kubeletplugin import node

        try:
            cfg = config.build(config.resolve(args, os.environ))
            if cfg.build_device_root:
                from dra_driver import devroot

                devroot.build_for_config(cfg)
        except FlexNPUError as err:
            print(f"flexnpu-dra plugin: {err}", file=sys.stderr)
            return 2
        return node.run(cfg)
    from kubeletplugin import demo as demo_mod

    return demo_mod.run(keep=args.keep)


if __name__ == "__main__":
    sys.exit(main())
