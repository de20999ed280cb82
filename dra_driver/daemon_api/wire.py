"""Conversion between the daemon's protobuf messages and :mod:`dra_driver.daemon_api.values`.

The only module (with ``service`` and ``client``) that sees generated types; both sides of
the API convert here so the rest of the code works with plain dataclasses. The wire's one error
table is here too (:data:`ERRORS`): the daemon maps a driver error to its gRPC status by class,
the client a status back to the class (the stable code itself travels in trailing metadata).
"""

from __future__ import annotations

import grpc

from api_protos.gen import flexnpu_daemon_pb2 as pb
from dra_driver.daemon_api.values import (
    Endpoints,
    EntityInfo,
    EntityState,
    HealthInfo,
    RegisterRequest,
    RegisterResult,
    ShareUsage,
)
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from flexnpu_wire.shares import Share

#: Trailing metadata keys of a failed call: the driver error's code, claim UID, field and bare message.
MD_CODE = "flexnpu-error-code"
MD_CLAIM = "flexnpu-claim-uid"
MD_FIELD = "flexnpu-field"
MD_MESSAGE = "flexnpu-message-bin"

ERRORS: tuple[tuple[type[FlexNPUError], grpc.StatusCode, ErrorCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_ARGUMENT),
    (StateError, grpc.StatusCode.FAILED_PRECONDITION, ErrorCode.INTERNAL),
    (Unavailable, grpc.StatusCode.UNAVAILABLE, ErrorCode.DAEMON_UNAVAILABLE),
    (FlexNPUError, grpc.StatusCode.INTERNAL, ErrorCode.INTERNAL),
)
"""The daemon wire's error table: driver error class, its gRPC status, and the code a client uses when
the answer carries none. The daemon takes the first row whose class matches (most specific first)."""
RETRYABLE_STATUSES = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
"""Statuses gRPC itself answers (no daemon error behind them): read back as ``Unavailable``."""

STATUS_BY_ERROR = tuple((cls, status) for cls, status, _ in ERRORS)
ERROR_BY_STATUS: dict[grpc.StatusCode, tuple[type[FlexNPUError], ErrorCode]] = {
    **{status: (cls, code) for cls, status, code in ERRORS},
    **dict.fromkeys(RETRYABLE_STATUSES, (Unavailable, ErrorCode.DAEMON_UNAVAILABLE)),
}


def share_to_pb(share: Share) -> pb.Share:
    return pb.Share(
        virtual_id=share.virtual_id,
        die_phy_id=share.die_phy_id,
        memory_bytes=share.memory_bytes,
        compute_percent=share.compute_percent,
        policy=share.policy,
        memory_only=share.memory_only,
        host_memory_bytes=share.host_memory_bytes,
        priority=share.priority,
    )


def share_from_pb(msg: pb.Share) -> Share:
    return Share(
        virtual_id=int(msg.virtual_id),
        die_phy_id=int(msg.die_phy_id),
        memory_bytes=int(msg.memory_bytes),
        compute_percent=int(msg.compute_percent),
        policy=str(msg.policy),
        memory_only=bool(msg.memory_only),
        host_memory_bytes=int(msg.host_memory_bytes),
        priority=str(msg.priority) or "normal",
    )


def register_request_to_pb(req: RegisterRequest) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        claim_uid=req.claim_uid,
        namespace=req.namespace,
        name=req.name,
        token=req.token,
        shares=[share_to_pb(s) for s in req.shares],
        transport=pb.Transport(tcp_host=req.tcp_host, tcp_port=req.tcp_port, unix_only=req.unix_only),
    )


def register_request_from_pb(msg: pb.RegisterRequest) -> RegisterRequest:
    return RegisterRequest(
        claim_uid=str(msg.claim_uid),
        namespace=str(msg.namespace),
        name=str(msg.name),
        token=str(msg.token),
        shares=tuple(share_from_pb(s) for s in msg.shares),
        tcp_host=str(msg.transport.tcp_host),
        tcp_port=int(msg.transport.tcp_port),
        unix_only=bool(msg.transport.unix_only),
    )


def register_result_to_pb(res: RegisterResult) -> pb.RegisterResponse:
    ep = res.endpoints
    return pb.RegisterResponse(
        entity_id=res.entity_id,
        pid=res.pid,
        tcp_host=ep.tcp_host,
        tcp_port=ep.tcp_port,
        unix_socket=ep.unix_socket,
        shm_dir=ep.shm_dir,
        existing=res.existing,
    )


def register_result_from_pb(msg: pb.RegisterResponse) -> RegisterResult:
    return RegisterResult(
        entity_id=str(msg.entity_id),
        pid=int(msg.pid),
        endpoints=Endpoints(
            tcp_host=str(msg.tcp_host),
            tcp_port=int(msg.tcp_port),
            unix_socket=str(msg.unix_socket),
            shm_dir=str(msg.shm_dir),
        ),
        existing=bool(msg.existing),
    )


def entity_to_pb(info: EntityInfo) -> pb.Entity:
    ep = info.endpoints
    return pb.Entity(
        entity_id=info.entity_id,
        namespace=info.namespace,
        name=info.name,
        shares=[
            pb.ShareUsage(
                share=share_to_pb(u.share),
                memory_used_bytes=u.memory_used_bytes,
                compute_used_percent=u.compute_used_percent,
                compute_used_us=u.compute_used_us,
                sessions=u.sessions,
            )
            for u in info.shares
        ],
        pid=info.pid,
        state=str(info.state),
        endpoints=pb.Endpoints(
            tcp_host=ep.tcp_host, tcp_port=ep.tcp_port, unix_socket=ep.unix_socket, shm_dir=ep.shm_dir
        ),
        restarts=info.restarts,
        rss_bytes=info.rss_bytes,
        started_at=info.started_at,
        message=info.message,
        cgroup=info.cgroup,
        memory_current_bytes=info.memory_current_bytes,
        memory_max_bytes=info.memory_max_bytes,
        memory_peak_bytes=info.memory_peak_bytes,
        tasks_current=info.tasks_current,
        tasks_max=info.tasks_max,
        cpu_weight=info.cpu_weight,
        oom_kills=info.oom_kills,
    )


def entity_from_pb(msg: pb.Entity) -> EntityInfo:
    ep = msg.endpoints
    try:
        state = EntityState(msg.state)
    except ValueError:
        state = EntityState.UNKNOWN
    return EntityInfo(
        entity_id=str(msg.entity_id),
        namespace=str(msg.namespace),
        name=str(msg.name),
        shares=tuple(
            ShareUsage(
                share=share_from_pb(u.share),
                memory_used_bytes=int(u.memory_used_bytes),
                compute_used_percent=int(u.compute_used_percent),
                compute_used_us=int(u.compute_used_us),
                sessions=int(u.sessions),
            )
            for u in msg.shares
        ),
        pid=int(msg.pid),
        state=state,
        endpoints=Endpoints(
            tcp_host=str(ep.tcp_host),
            tcp_port=int(ep.tcp_port),
            unix_socket=str(ep.unix_socket),
            shm_dir=str(ep.shm_dir),
        ),
        restarts=int(msg.restarts),
        rss_bytes=int(msg.rss_bytes),
        started_at=float(msg.started_at),
        message=str(msg.message),
        cgroup=str(msg.cgroup),
        memory_current_bytes=int(msg.memory_current_bytes),
        memory_max_bytes=int(msg.memory_max_bytes),
        memory_peak_bytes=int(msg.memory_peak_bytes),
        tasks_current=int(msg.tasks_current),
        tasks_max=int(msg.tasks_max),
        cpu_weight=int(msg.cpu_weight),
        oom_kills=int(msg.oom_kills),
    )


def health_to_pb(info: HealthInfo) -> pb.HealthResponse:
    return pb.HealthResponse(
        ok=info.ok,
        pid=info.pid,
        version=info.version,
        entities=info.entities,
        dies=info.dies,
        started_at=info.started_at,
        shm_problem=info.shm_problem,
        adopted=info.adopted,
        cgroups=info.cgroups,
        cgroup_problem=info.cgroup_problem,
        instance=info.instance,
        die_ids=list(info.die_ids),
    )


def health_from_pb(msg: pb.HealthResponse) -> HealthInfo:
    return HealthInfo(
        ok=bool(msg.ok),
        pid=int(msg.pid),
        version=str(msg.version),
        entities=int(msg.entities),
        dies=int(msg.dies),
        started_at=float(msg.started_at),
        shm_problem=str(msg.shm_problem),
        adopted=bool(msg.adopted),
        cgroups=str(msg.cgroups),
        cgroup_problem=str(msg.cgroup_problem),
        instance=str(msg.instance),
        die_ids=tuple(int(d) for d in msg.die_ids),
    )
