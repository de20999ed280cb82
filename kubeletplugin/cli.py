"""``flexnpu-dra``: ``plugin`` runs the node process; ``probe`` asks it whether its loops are alive;
``webhook`` serves the admission webhook that checks VnpuConfig at ``kubectl apply``; ``extender`` serves
the kube-scheduler extender that ranks nodes by NPU fill (docs/placement.md); ``demo`` says how
to run the demo from a clone (the demo drives test doubles, which no wheel or image ships)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dra_driver import config
from dra_driver.errors import FlexNPUError

DEMO_HINT = (
    "flexnpu-dra demo: the demo drives the test doubles (the top-level package flexnpu_testing), which no"
    " wheel or image ships. From a clone of the repository run: scripts/demo.sh"
    " (or, with the project installed: python -m flexnpu_testing.demo [--keep] from the clone's root)"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flexnpu-dra", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plugin = sub.add_parser("plugin", help="run the node process (kubelet plugin + controllers)")
    config.add_flags(plugin)
    probe = sub.add_parser(
        "probe", help="exit 0 if the node process's loops are alive (for a Kubernetes exec probe)"
    )
    probe.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("FLEXNPU_METRICS_PORT", "-1")),
        help="the node's metrics port, which serves /healthz (default: $FLEXNPU_METRICS_PORT)",
    )
    probe.add_argument("--host", default="127.0.0.1", help="the node's address (default 127.0.0.1)")
    probe.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    webhook = sub.add_parser(
        "webhook", help="serve the validating admission webhook for VnpuConfig in claims and claim templates"
    )
    config.add_flags(webhook, config.WEBHOOK_FLAGS)
    extender = sub.add_parser(
        "extender", help="serve the kube-scheduler extender that ranks nodes by NPU fill (binpack or spread)"
    )
    config.add_flags(extender, config.EXTENDER_FLAGS)
    demo = sub.add_parser(
        "demo", help="print how to run the demo (a local node with emulated NPUs) from a clone"
    )
    demo.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
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
    if args.command == "webhook":
        return _webhook(args)
    if args.command == "extender":
        return _extender(args)
    if args.command == "probe":
        return _probe(args.host, args.port, args.timeout)
    print(DEMO_HINT, file=sys.stderr)
    return 2


def _webhook(args: argparse.Namespace) -> int:
    from controller import webhook
    from dra_driver import admission, logs

    try:
        cfg = config.build_webhook(config.resolve(args, os.environ, config.WEBHOOK_FLAGS))
        admission.parse_share_classes(cfg.share_classes)  # a bad policy name fails here, not per review
    except FlexNPUError as err:
        print(f"flexnpu-dra webhook: {err}", file=sys.stderr)
        return 2
    logs.setup(cfg.log_level, json_format=cfg.log_json)
    return webhook.run(cfg)


def _extender(args: argparse.Namespace) -> int:
    from controller import extender
    from dra_driver import logs

    try:
        cfg = config.build_extender(config.resolve(args, os.environ, config.EXTENDER_FLAGS))
    except FlexNPUError as err:
        print(f"flexnpu-dra extender: {err}", file=sys.stderr)
        return 2
    logs.setup(cfg.log_level, json_format=cfg.log_json)
    return extender.run(cfg)


def _probe(host: str, port: int, timeout: float) -> int:
    """GET /healthz: 0 healthy, 1 a loop is stale, 2 no port, 3 no answer. Prints the body."""
    import http.client

    if port <= 0:
        print("flexnpu-dra probe: no metrics port (--port or FLEXNPU_METRICS_PORT)", file=sys.stderr)
        return 2
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
    except OSError as exc:
        print(f"flexnpu-dra probe: no answer from {host}:{port}: {exc}", file=sys.stderr)
        return 3
    finally:
        conn.close()
    sys.stdout.write(body)
    return 0 if resp.status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
