from omru.v1 import common_pb2 as _common_pb2
from omru.v1 import executor_pb2 as _executor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClusterEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLUSTER_EVENT_KIND_UNSPECIFIED: _ClassVar[ClusterEventKind]
    CLUSTER_EVENT_KIND_NODE_ADDED: _ClassVar[ClusterEventKind]
    CLUSTER_EVENT_KIND_NODE_UPDATED: _ClassVar[ClusterEventKind]
    CLUSTER_EVENT_KIND_NODE_REMOVED: _ClassVar[ClusterEventKind]
    CLUSTER_EVENT_KIND_GPU_CLAIMED: _ClassVar[ClusterEventKind]
    CLUSTER_EVENT_KIND_GPU_RELEASED: _ClassVar[ClusterEventKind]
    CLUSTER_EVENT_KIND_RESYNC: _ClassVar[ClusterEventKind]
CLUSTER_EVENT_KIND_UNSPECIFIED: ClusterEventKind
CLUSTER_EVENT_KIND_NODE_ADDED: ClusterEventKind
CLUSTER_EVENT_KIND_NODE_UPDATED: ClusterEventKind
CLUSTER_EVENT_KIND_NODE_REMOVED: ClusterEventKind
CLUSTER_EVENT_KIND_GPU_CLAIMED: ClusterEventKind
CLUSTER_EVENT_KIND_GPU_RELEASED: ClusterEventKind
CLUSTER_EVENT_KIND_RESYNC: ClusterEventKind

class Node(_message.Message):
    __slots__ = ("node_id", "address", "gpus", "lease_id", "ttl_seconds", "registered_unix_s", "revision")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuInfo]
    lease_id: int
    ttl_seconds: int
    registered_unix_s: float
    revision: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuInfo, _Mapping]]] = ..., lease_id: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., registered_unix_s: _Optional[float] = ..., revision: _Optional[int] = ...) -> None: ...

class GpuClaim(_message.Message):
    __slots__ = ("gpu", "job_id", "claimed_unix_s", "revision")
    GPU_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    gpu: _common_pb2.GpuRef
    job_id: str
    claimed_unix_s: float
    revision: int
    def __init__(self, gpu: _Optional[_Union[_common_pb2.GpuRef, _Mapping]] = ..., job_id: _Optional[str] = ..., claimed_unix_s: _Optional[float] = ..., revision: _Optional[int] = ...) -> None: ...

class RegisterNodeRequest(_message.Message):
    __slots__ = ("node_id", "address", "gpus", "ttl_seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuInfo]
    ttl_seconds: int
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuInfo, _Mapping]]] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("lease_id", "node")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    lease_id: int
    node: Node
    def __init__(self, lease_id: _Optional[int] = ..., node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class KeepAliveNodeRequest(_message.Message):
    __slots__ = ("node_id", "lease_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    lease_id: int
    def __init__(self, node_id: _Optional[str] = ..., lease_id: _Optional[int] = ...) -> None: ...

class KeepAliveNodeResponse(_message.Message):
    __slots__ = ("ttl_seconds",)
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: int
    def __init__(self, ttl_seconds: _Optional[int] = ...) -> None: ...

class DeregisterNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class DeregisterNodeResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class GetNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class GetNodeResponse(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: Node
    def __init__(self, node: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes", "revision")
    NODES_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    revision: int
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class ListClaimsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListClaimsResponse(_message.Message):
    __slots__ = ("claims", "revision")
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    claims: _containers.RepeatedCompositeFieldContainer[GpuClaim]
    revision: int
    def __init__(self, claims: _Optional[_Iterable[_Union[GpuClaim, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class WatchClusterRequest(_message.Message):
    __slots__ = ("after_revision",)
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    after_revision: int
    def __init__(self, after_revision: _Optional[int] = ...) -> None: ...

class ClusterEvent(_message.Message):
    __slots__ = ("revision", "kind", "node", "claim")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    revision: int
    kind: ClusterEventKind
    node: Node
    claim: GpuClaim
    def __init__(self, revision: _Optional[int] = ..., kind: _Optional[_Union[ClusterEventKind, str]] = ..., node: _Optional[_Union[Node, _Mapping]] = ..., claim: _Optional[_Union[GpuClaim, _Mapping]] = ...) -> None: ...

class WatchClusterResponse(_message.Message):
    __slots__ = ("revision", "events")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    events: _containers.RepeatedCompositeFieldContainer[ClusterEvent]
    def __init__(self, revision: _Optional[int] = ..., events: _Optional[_Iterable[_Union[ClusterEvent, _Mapping]]] = ...) -> None: ...

class WatchAllocationsRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class WatchAllocationsResponse(_message.Message):
    __slots__ = ("revision", "snapshot", "allocations", "removed_job_ids")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    snapshot: bool
    allocations: _containers.RepeatedCompositeFieldContainer[_executor_pb2.Directive]
    removed_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revision: _Optional[int] = ..., snapshot: _Optional[bool] = ..., allocations: _Optional[_Iterable[_Union[_executor_pb2.Directive, _Mapping]]] = ..., removed_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...
