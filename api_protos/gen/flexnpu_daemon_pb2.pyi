from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Share(_message.Message):
    __slots__ = ("virtual_id", "die_phy_id", "memory_bytes", "compute_percent", "policy", "memory_only", "host_memory_bytes", "priority")
    VIRTUAL_ID_FIELD_NUMBER: _ClassVar[int]
    DIE_PHY_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ONLY_FIELD_NUMBER: _ClassVar[int]
    HOST_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    virtual_id: int
    die_phy_id: int
    memory_bytes: int
    compute_percent: int
    policy: str
    memory_only: bool
    host_memory_bytes: int
    priority: str
    def __init__(self, virtual_id: _Optional[int] = ..., die_phy_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., compute_percent: _Optional[int] = ..., policy: _Optional[str] = ..., memory_only: _Optional[bool] = ..., host_memory_bytes: _Optional[int] = ..., priority: _Optional[str] = ...) -> None: ...

class Transport(_message.Message):
    __slots__ = ("tcp_host", "tcp_port", "unix_only")
    TCP_HOST_FIELD_NUMBER: _ClassVar[int]
    TCP_PORT_FIELD_NUMBER: _ClassVar[int]
    UNIX_ONLY_FIELD_NUMBER: _ClassVar[int]
    tcp_host: str
    tcp_port: int
    unix_only: bool
    def __init__(self, tcp_host: _Optional[str] = ..., tcp_port: _Optional[int] = ..., unix_only: _Optional[bool] = ...) -> None: ...

class Endpoints(_message.Message):
    __slots__ = ("tcp_host", "tcp_port", "unix_socket", "shm_dir")
    TCP_HOST_FIELD_NUMBER: _ClassVar[int]
    TCP_PORT_FIELD_NUMBER: _ClassVar[int]
    UNIX_SOCKET_FIELD_NUMBER: _ClassVar[int]
    SHM_DIR_FIELD_NUMBER: _ClassVar[int]
    tcp_host: str
    tcp_port: int
    unix_socket: str
    shm_dir: str
    def __init__(self, tcp_host: _Optional[str] = ..., tcp_port: _Optional[int] = ..., unix_socket: _Optional[str] = ..., shm_dir: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("claim_uid", "namespace", "name", "token", "shares", "transport")
    CLAIM_UID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    claim_uid: str
    namespace: str
    name: str
    token: str
    shares: _containers.RepeatedCompositeFieldContainer[Share]
    transport: Transport
    def __init__(self, claim_uid: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., token: _Optional[str] = ..., shares: _Optional[_Iterable[_Union[Share, _Mapping]]] = ..., transport: _Optional[_Union[Transport, _Mapping]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("entity_id", "pid", "tcp_host", "tcp_port", "unix_socket", "shm_dir", "existing")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TCP_HOST_FIELD_NUMBER: _ClassVar[int]
    TCP_PORT_FIELD_NUMBER: _ClassVar[int]
    UNIX_SOCKET_FIELD_NUMBER: _ClassVar[int]
    SHM_DIR_FIELD_NUMBER: _ClassVar[int]
    EXISTING_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    pid: int
    tcp_host: str
    tcp_port: int
    unix_socket: str
    shm_dir: str
    existing: bool
    def __init__(self, entity_id: _Optional[str] = ..., pid: _Optional[int] = ..., tcp_host: _Optional[str] = ..., tcp_port: _Optional[int] = ..., unix_socket: _Optional[str] = ..., shm_dir: _Optional[str] = ..., existing: _Optional[bool] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("claim_uid",)
    CLAIM_UID_FIELD_NUMBER: _ClassVar[int]
    claim_uid: str
    def __init__(self, claim_uid: _Optional[str] = ...) -> None: ...

class UnregisterResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("probe",)
    PROBE_FIELD_NUMBER: _ClassVar[int]
    probe: bool
    def __init__(self, probe: _Optional[bool] = ...) -> None: ...

class ShareUsage(_message.Message):
    __slots__ = ("share", "memory_used_bytes", "compute_used_percent", "compute_used_us", "sessions")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_USED_PERCENT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_USED_US_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    share: Share
    memory_used_bytes: int
    compute_used_percent: int
    compute_used_us: int
    sessions: int
    def __init__(self, share: _Optional[_Union[Share, _Mapping]] = ..., memory_used_bytes: _Optional[int] = ..., compute_used_percent: _Optional[int] = ..., compute_used_us: _Optional[int] = ..., sessions: _Optional[int] = ...) -> None: ...

class Entity(_message.Message):
    __slots__ = ("entity_id", "namespace", "name", "shares", "pid", "state", "endpoints", "restarts", "rss_bytes", "started_at", "message", "cgroup", "memory_current_bytes", "memory_max_bytes", "memory_peak_bytes", "tasks_current", "tasks_max", "cpu_weight", "oom_kills")
    ENTITY_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CURRENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TASKS_CURRENT_FIELD_NUMBER: _ClassVar[int]
    TASKS_MAX_FIELD_NUMBER: _ClassVar[int]
    CPU_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    OOM_KILLS_FIELD_NUMBER: _ClassVar[int]
    entity_id: str
    namespace: str
    name: str
    shares: _containers.RepeatedCompositeFieldContainer[ShareUsage]
    pid: int
    state: str
    endpoints: Endpoints
    restarts: int
    rss_bytes: int
    started_at: float
    message: str
    cgroup: str
    memory_current_bytes: int
    memory_max_bytes: int
    memory_peak_bytes: int
    tasks_current: int
    tasks_max: int
    cpu_weight: int
    oom_kills: int
    def __init__(self, entity_id: _Optional[str] = ..., namespace: _Optional[str] = ..., name: _Optional[str] = ..., shares: _Optional[_Iterable[_Union[ShareUsage, _Mapping]]] = ..., pid: _Optional[int] = ..., state: _Optional[str] = ..., endpoints: _Optional[_Union[Endpoints, _Mapping]] = ..., restarts: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., started_at: _Optional[float] = ..., message: _Optional[str] = ..., cgroup: _Optional[str] = ..., memory_current_bytes: _Optional[int] = ..., memory_max_bytes: _Optional[int] = ..., memory_peak_bytes: _Optional[int] = ..., tasks_current: _Optional[int] = ..., tasks_max: _Optional[int] = ..., cpu_weight: _Optional[int] = ..., oom_kills: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("entities",)
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    entities: _containers.RepeatedCompositeFieldContainer[Entity]
    def __init__(self, entities: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("ok", "pid", "version", "entities", "dies", "started_at", "shm_problem", "adopted", "cgroups", "cgroup_problem", "instance", "die_ids")
    OK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    DIES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    SHM_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    CGROUPS_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DIE_IDS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    pid: int
    version: str
    entities: int
    dies: int
    started_at: float
    shm_problem: str
    adopted: bool
    cgroups: str
    cgroup_problem: str
    instance: str
    die_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ok: _Optional[bool] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., entities: _Optional[int] = ..., dies: _Optional[int] = ..., started_at: _Optional[float] = ..., shm_problem: _Optional[str] = ..., adopted: _Optional[bool] = ..., cgroups: _Optional[str] = ..., cgroup_problem: _Optional[str] = ..., instance: _Optional[str] = ..., die_ids: _Optional[_Iterable[int]] = ...) -> None: ...
