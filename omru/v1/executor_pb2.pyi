from omru.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DirectiveKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIRECTIVE_KIND_UNSPECIFIED: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_START: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_RESIZE: _ClassVar[DirectiveKind]
    DIRECTIVE_KIND_STOP: _ClassVar[DirectiveKind]

class ExecutorEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXECUTOR_EVENT_KIND_UNSPECIFIED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_STARTED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_EPOCH_DONE: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_FINISHED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_GPUS_RELEASED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_FAILED: _ClassVar[ExecutorEventKind]
    EXECUTOR_EVENT_KIND_PROFILED: _ClassVar[ExecutorEventKind]
DIRECTIVE_KIND_UNSPECIFIED: DirectiveKind
DIRECTIVE_KIND_START: DirectiveKind
DIRECTIVE_KIND_RESIZE: DirectiveKind
DIRECTIVE_KIND_STOP: DirectiveKind
EXECUTOR_EVENT_KIND_UNSPECIFIED: ExecutorEventKind
EXECUTOR_EVENT_KIND_STARTED: ExecutorEventKind
EXECUTOR_EVENT_KIND_EPOCH_DONE: ExecutorEventKind
EXECUTOR_EVENT_KIND_FINISHED: ExecutorEventKind
EXECUTOR_EVENT_KIND_GPUS_RELEASED: ExecutorEventKind
EXECUTOR_EVENT_KIND_FAILED: ExecutorEventKind
EXECUTOR_EVENT_KIND_PROFILED: ExecutorEventKind

class ProfileOptions(_message.Message):
    __slots__ = ("warmup_iters", "measure_iters", "full_epoch")
    WARMUP_ITERS_FIELD_NUMBER: _ClassVar[int]
    MEASURE_ITERS_FIELD_NUMBER: _ClassVar[int]
    FULL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    warmup_iters: int
    measure_iters: int
    full_epoch: bool
    def __init__(self, warmup_iters: _Optional[int] = ..., measure_iters: _Optional[int] = ..., full_epoch: _Optional[bool] = ...) -> None: ...

class Directive(_message.Message):
    __slots__ = ("directive_id", "kind", "job", "gpus", "rendezvous_endpoint", "attempt_id", "checkpoint_dir", "profile")
    DIRECTIVE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RENDEZVOUS_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    directive_id: str
    kind: DirectiveKind
    job: _common_pb2.JobSpec
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuRef]
    rendezvous_endpoint: str
    attempt_id: str
    checkpoint_dir: str
    profile: ProfileOptions
    def __init__(self, directive_id: _Optional[str] = ..., kind: _Optional[_Union[DirectiveKind, str]] = ..., job: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuRef, _Mapping]]] = ..., rendezvous_endpoint: _Optional[str] = ..., attempt_id: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., profile: _Optional[_Union[ProfileOptions, _Mapping]] = ...) -> None: ...

class ExecutorEvent(_message.Message):
    __slots__ = ("seq", "node_id", "job_id", "kind", "time_unix_s", "epoch", "epoch_seconds", "loss", "accuracy", "lr", "world_size", "gpus", "attempt_id", "message", "iter_seconds", "steps", "global_batch", "restarts")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ITER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    node_id: str
    job_id: str
    kind: ExecutorEventKind
    time_unix_s: float
    epoch: int
    epoch_seconds: float
    loss: float
    accuracy: float
    lr: float
    world_size: int
    gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuRef]
    attempt_id: str
    message: str
    iter_seconds: float
    steps: int
    global_batch: int
    restarts: int
    def __init__(self, seq: _Optional[int] = ..., node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., kind: _Optional[_Union[ExecutorEventKind, str]] = ..., time_unix_s: _Optional[float] = ..., epoch: _Optional[int] = ..., epoch_seconds: _Optional[float] = ..., loss: _Optional[float] = ..., accuracy: _Optional[float] = ..., lr: _Optional[float] = ..., world_size: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[_common_pb2.GpuRef, _Mapping]]] = ..., attempt_id: _Optional[str] = ..., message: _Optional[str] = ..., iter_seconds: _Optional[float] = ..., steps: _Optional[int] = ..., global_batch: _Optional[int] = ..., restarts: _Optional[int] = ...) -> None: ...

class ExecutorJob(_message.Message):
    __slots__ = ("job_id", "attempt_id", "local_gpus", "world_size", "epochs_done", "state", "phase", "restarts", "profile", "worker_pids", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    LOCAL_GPUS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_DONE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    WORKER_PIDS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_id: str
    local_gpus: _containers.RepeatedCompositeFieldContainer[_common_pb2.GpuRef]
    world_size: int
    epochs_done: int
    state: _common_pb2.JobState
    phase: str
    restarts: int
    profile: bool
    worker_pids: _containers.RepeatedScalarFieldContainer[int]
    message: str
    def __init__(self, job_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., local_gpus: _Optional[_Iterable[_Union[_common_pb2.GpuRef, _Mapping]]] = ..., world_size: _Optional[int] = ..., epochs_done: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., phase: _Optional[str] = ..., restarts: _Optional[int] = ..., profile: _Optional[bool] = ..., worker_pids: _Optional[_Iterable[int]] = ..., message: _Optional[str] = ...) -> None: ...

class GetJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetJobsResponse(_message.Message):
    __slots__ = ("node_id", "jobs", "last_seq")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    jobs: _containers.RepeatedCompositeFieldContainer[ExecutorJob]
    last_seq: int
    def __init__(self, node_id: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[ExecutorJob, _Mapping]]] = ..., last_seq: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("after_seq",)
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    def __init__(self, after_seq: _Optional[int] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: ExecutorEvent
    def __init__(self, event: _Optional[_Union[ExecutorEvent, _Mapping]] = ...) -> None: ...

class GetLogsRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "follow", "offset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    follow: bool
    offset: int
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., follow: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class GetLogsResponse(_message.Message):
    __slots__ = ("node_id", "attempt", "attempt_id", "rank", "data", "offset")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    attempt: int
    attempt_id: str
    rank: int
    data: bytes
    offset: int
    def __init__(self, node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., attempt_id: _Optional[str] = ..., rank: _Optional[int] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ...) -> None: ...
