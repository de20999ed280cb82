"""``start()``: one call that makes a Python DRA driver a kubelet plugin (the Go helper's ``kubeletplugin.Start``).

The driver implements :class:`~dra_kubeletplugin.claims.DRAPlugin`; :func:`start` serves it to the
kubelet and returns a :class:`Helper` that also publishes the driver's ResourceSlices. Wiring only:
each concern is its own module (``sockets``, ``server``, ``registration``, ``dra_v1``/``dra_v1beta1``,
``claimbatch``, ``fetch``, ``serialize``, ``health``, ``statuses``, ``resourceslice/``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from dra_kubeletplugin import grpc_servers, health_stream, registration, sockets, statuses
from dra_kubeletplugin.claimbatch import BatchRunner
from dra_kubeletplugin.claims import DRAPlugin, HealthSource
from dra_kubeletplugin.errors import DroppedFieldsError, InvalidArgument
from dra_kubeletplugin.fetch import DEFAULT_WORKERS, FairFetcher, NegativeCache
from dra_kubeletplugin.kubeapi import KubeClient
from dra_kubeletplugin.resourceslice.controller import LoopObserver, SliceController
from dra_kubeletplugin.resourceslice.pools import DriverResources
from dra_kubeletplugin.serialize import CallSerializer
from dra_kubeletplugin.sockets import KUBELET_PLUGINS_DIR, KUBELET_REGISTRY_DIR, Sockets

__all__ = ["Helper", "PublishOptions", "start"]

_log = logging.getLogger("dra_kubeletplugin")


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """How the ResourceSlice controller behaves (see ``resourceslice/controller.py``)."""

    resync_seconds: float = 600.0
    debounce_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    watch_timeout_seconds: int = 300


def start(
    plugin: DRAPlugin,
    *,
    driver_name: str,
    node_name: str,
    kube: KubeClient | None,
    pod_uid: str | None = None,
    registry_dir: Path = KUBELET_REGISTRY_DIR,
    plugins_dir: Path = KUBELET_PLUGINS_DIR,
    serialize: bool = True,
    health_source: HealthSource | None = None,
    error_status: statuses.ErrorStatus | None = None,
    fetch_workers: int = DEFAULT_WORKERS,
    max_workers: int = grpc_servers.DEFAULT_WORKERS,
    health_resend_seconds: float = health_stream.DEFAULT_RESEND_SECONDS,
    publish: PublishOptions | None = None,
    on_dropped_fields: Callable[[DroppedFieldsError], None] | None = None,
    live: LoopObserver | None = None,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    serve: bool = True,
) -> Helper:
    """Serve ``plugin`` to the kubelet now (DRA socket first, then registration) and return the :class:`Helper`.

    **Parameters:**

    * ``driver_name`` — the DRA driver name (as in ResourceSlices and allocation results).
    * ``node_name`` — this node; slices are published for it, owned by its Node object.
    * ``kube`` — the API client, a ``kubeapi.KubeClient`` that raises the helper's errors (a driver that
      maps them to its own hands over a plain one on the same connection); claims are fetched and
      slices written through it. ``None``: no prepare can succeed and nothing is published.
    * ``pod_uid`` — this instance's pod UID: per-instance sockets and a file-locked serializer, so
      that two instances can run side by side during a rolling update (kubelet ≥ 1.33).
    * ``registry_dir``, ``plugins_dir`` — the kubelet's plugin registry and plugins directories.
    * ``serialize`` — one prepare/unprepare call at a time (the Go default); the wait is bounded by
      the kubelet's deadline.
    * ``health_source`` — device health for the kubelet's health stream (``None``: not advertised).
    * ``error_status`` — the driver's table from an exception that failed a whole call to a gRPC
      status (default ``statuses.status_for``, the helper's own errors).
    * ``fetch_workers`` — claim GETs in flight for all calls together (``fetch.py``).
    * ``max_workers`` — DRA server threads.
    * ``publish`` — the slice controller's timings; ``on_dropped_fields`` — called when the API
      server dropped fields of a slice (re-publish without them); ``live`` — told of the
      controller's loop passes.
    * ``serve`` — ``False`` returns the helper without serving yet (call :meth:`Helper.start`).
    """
    paths = sockets.plugin_sockets(
        driver_name, pod_uid=pod_uid, registry_dir=registry_dir, plugins_dir=plugins_dir
    )
    helper = Helper(
        plugin,
        driver_name=driver_name,
        node_name=node_name,
        kube=kube,
        paths=paths,
        serializer=CallSerializer(paths.serialize_lock if pod_uid else None, enabled=serialize),
        health_source=health_source,
        error_status=error_status or statuses.status_for,
        fetch_workers=fetch_workers,
        max_workers=max_workers,
        health_resend_seconds=health_resend_seconds,
        publish=publish or PublishOptions(),
        on_dropped_fields=on_dropped_fields,
        live=live,
        log=log or _log,
    )
    if serve:
        helper.start()
    return helper


class Helper:
    """A running kubelet plugin: its gRPC servers, its claim fetcher and its slice controller.

    Usually made by :func:`start`. ``publish_resources`` (re)states what this node offers;
    ``notify_health_changed`` resends device health; ``stop`` deregisters and drains. Also a
    context manager (``stop`` on exit).
    """

    def __init__(
        self,
        plugin: DRAPlugin,
        *,
        driver_name: str,
        node_name: str,
        kube: KubeClient | None,
        paths: Sockets,
        serializer: CallSerializer,
        health_source: HealthSource | None,
        error_status: statuses.ErrorStatus,
        fetch_workers: int,
        max_workers: int,
        health_resend_seconds: float,
        publish: PublishOptions,
        on_dropped_fields: Callable[[DroppedFieldsError], None] | None,
        live: LoopObserver | None,
        log: logging.Logger | logging.LoggerAdapter[logging.Logger],
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.kube = kube
        self.paths = paths
        self.log = log
        self.fetcher = (
            FairFetcher(kube.get_claim, driver_name=driver_name, workers=fetch_workers, cache=NegativeCache())
            if kube is not None
            else None
        )
        self.runner = BatchRunner(plugin, fetcher=self.fetcher, serializer=serializer)
        self.server = grpc_servers.PluginServer(
            driver_name=driver_name,
            dra_socket=paths.dra,
            registration_socket=paths.registration,
            runner=self.runner,
            health_source=health_source,
            resend_seconds=health_resend_seconds,
            max_workers=max_workers,
            table=error_status,
        )
        self._publish = publish
        self._on_dropped = on_dropped_fields
        self._live = live
        self._controller: SliceController | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._never = threading.Event()
        self._lock = threading.Lock()

    @property
    def registered(self) -> threading.Event:
        """Set while the kubelet accepts the plugin (its NotifyRegistrationStatus said so)."""
        return self.server.registration.registered

    @property
    def published(self) -> threading.Event:
        """Set once the resources given to :meth:`publish_resources` were completely published."""
        return self._controller.published if self._controller is not None else self._never

    def other_instances(self, *, timeout: float = 2.0) -> list[str]:
        """DRA endpoints of other live instances of this driver on the node (a rolling update's other
        pod), from the kubelet's plugin registry (``registration.other_instances``)."""
        return registration.other_instances(
            self.paths.registration.parent, self.driver_name, str(self.paths.dra), timeout=timeout
        )

    def withdraw_resources(self) -> int:
        """After :meth:`stop`: delete this node's slices of this driver now (a clean uninstall, not a
        rolling update, whose other instance still serves); how many went. The kubelet would after 30 s."""
        if self._controller is None:
            return 0
        return self._controller.withdraw()

    @property
    def controller(self) -> SliceController | None:
        """The slice controller, once :meth:`publish_resources` was called."""
        return self._controller

    def start(self) -> None:
        """Serve DRA (and health) on the DRA socket, then registration on the registration socket."""
        self.server.start()

    def publish_resources(self, resources: DriverResources) -> None:
        """Publish ``resources`` as this node's ResourceSlices and keep them published (Go: ``PublishResources``).

        The first call starts the controller's thread; later calls replace what is published
        (the difference is written by the next sync). Raises ``PoolInvalid`` for a pool the API
        server would refuse (nothing changes then).
        """
        if self.kube is None:
            raise InvalidArgument("the plugin was started without an API client: it cannot publish slices")
        with self._lock:
            if self._controller is None:
                self._controller = SliceController(
                    self.kube,
                    driver_name=self.driver_name,
                    node_name=self.node_name,
                    log=self.log,
                    resync_seconds=self._publish.resync_seconds,
                    debounce_seconds=self._publish.debounce_seconds,
                    max_backoff_seconds=self._publish.max_backoff_seconds,
                    watch_timeout_seconds=self._publish.watch_timeout_seconds,
                    on_dropped_fields=self._on_dropped,
                    live=self._live,
                )
                self._controller.update(resources)
                self._thread = threading.Thread(
                    target=self._controller.run, args=(self._stop,), name="resourceslices", daemon=True
                )
                self._thread.start()
                return
        self._controller.update(resources)

    def notify_health_changed(self) -> None:
        """Tell open health streams to resend now (no-op without a health source)."""
        self.server.notify_health_changed()

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop publishing (slices stay), deregister, end health streams, drain calls, remove both sockets."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.server.stop(grace)
        if self.fetcher is not None:
            self.fetcher.close()

    def __enter__(self) -> Helper:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
