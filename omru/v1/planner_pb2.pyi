from omru.v1 import common_pb2 as _common_pb2
from omru.v1 import executor_pb2 as _executor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Plan(_message.Message):
    __slots__ = ("version", "policy", "segments", "makespan_s", "created_unix_s")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MAKESPAN_S_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    version: int
    policy: str
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.Segment]
    makespan_s: float
    created_unix_s: float
    def __init__(self, version: _Optional[int] = ..., policy: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.Segment, _Mapping]]] = ..., makespan_s: _Optional[float] = ..., created_unix_s: _Optional[float] = ...) -> None: ...

class JobUpdate(_message.Message):
    __slots__ = ("job_id", "state", "epochs_done", "world_size", "accuracy", "plan_version", "revision", "message", "time_unix_s", "epochs", "owner", "submitted_unix_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_DONE_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: _common_pb2.JobState
    epochs_done: int
    world_size: int
    accuracy: float
    plan_version: int
    revision: int
    message: str
    time_unix_s: float
    epochs: int
    owner: str
    submitted_unix_s: float
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., epochs_done: _Optional[int] = ..., world_size: _Optional[int] = ..., accuracy: _Optional[float] = ..., plan_version: _Optional[int] = ..., revision: _Optional[int] = ..., message: _Optional[str] = ..., time_unix_s: _Optional[float] = ..., epochs: _Optional[int] = ..., owner: _Optional[str] = ..., submitted_unix_s: _Optional[float] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("job_id", "state", "epochs_done", "accuracy", "planned_finish_s", "actual_finish_s", "gpu_seconds", "world_sizes", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_DONE_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FINISH_S_FIELD_NUMBER: _ClassVar[int]
    ACTUAL_FINISH_S_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: _common_pb2.JobState
    epochs_done: int
    accuracy: float
    planned_finish_s: float
    actual_finish_s: float
    gpu_seconds: float
    world_sizes: _containers.RepeatedScalarFieldContainer[int]
    message: str
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[_common_pb2.JobState, str]] = ..., epochs_done: _Optional[int] = ..., accuracy: _Optional[float] = ..., planned_finish_s: _Optional[float] = ..., actual_finish_s: _Optional[float] = ..., gpu_seconds: _Optional[float] = ..., world_sizes: _Optional[_Iterable[int]] = ..., message: _Optional[str] = ...) -> None: ...

class GpuHold(_message.Message):
    __slots__ = ("job_id", "attempt_id", "gpu", "start_s", "end_s", "world_size")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt_id: str
    gpu: _common_pb2.GpuRef
    start_s: float
    end_s: float
    world_size: int
    def __init__(self, job_id: _Optional[str] = ..., attempt_id: _Optional[str] = ..., gpu: _Optional[_Union[_common_pb2.GpuRef, _Mapping]] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., world_size: _Optional[int] = ...) -> None: ...

class Resize(_message.Message):
    __slots__ = ("job_id", "time_s", "from_size", "to_size")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_S_FIELD_NUMBER: _ClassVar[int]
    FROM_SIZE_FIELD_NUMBER: _ClassVar[int]
    TO_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    time_s: float
    from_size: int
    to_size: int
    def __init__(self, job_id: _Optional[str] = ..., time_s: _Optional[float] = ..., from_size: _Optional[int] = ..., to_size: _Optional[int] = ...) -> None: ...

class JobProfile(_message.Message):
    __slots__ = ("job_id", "epoch_seconds", "placements")
    class EpochSecondsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    epoch_seconds: _containers.ScalarMap[int, float]
    placements: _containers.RepeatedCompositeFieldContainer[PlacementTime]
    def __init__(self, job_id: _Optional[str] = ..., epoch_seconds: _Optional[_Mapping[int, float]] = ..., placements: _Optional[_Iterable[_Union[PlacementTime, _Mapping]]] = ...) -> None: ...

class PlacementTime(_message.Message):
    __slots__ = ("gpus", "nodes", "epoch_seconds")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    nodes: int
    epoch_seconds: float
    def __init__(self, gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., epoch_seconds: _Optional[float] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("makespan_s", "planned_makespan_s", "utilisation", "jobs", "policy", "gpus", "lower_bound_s", "compute_utilisation", "holds", "first_plan", "resizes", "origin_unix_s")
    MAKESPAN_S_FIELD_NUMBER: _ClassVar[int]
    PLANNED_MAKESPAN_S_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    LOWER_BOUND_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_UTILISATION_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_PLAN_FIELD_NUMBER: _ClassVar[int]
    RESIZES_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    makespan_s: float
    planned_makespan_s: float
    utilisation: float
    jobs: _containers.RepeatedCompositeFieldContainer[JobResult]
    policy: str
    gpus: int
    lower_bound_s: float
    compute_utilisation: float
    holds: _containers.RepeatedCompositeFieldContainer[GpuHold]
    first_plan: Plan
    resizes: _containers.RepeatedCompositeFieldContainer[Resize]
    origin_unix_s: float
    def __init__(self, makespan_s: _Optional[float] = ..., planned_makespan_s: _Optional[float] = ..., utilisation: _Optional[float] = ..., jobs: _Optional[_Iterable[_Union[JobResult, _Mapping]]] = ..., policy: _Optional[str] = ..., gpus: _Optional[int] = ..., lower_bound_s: _Optional[float] = ..., compute_utilisation: _Optional[float] = ..., holds: _Optional[_Iterable[_Union[GpuHold, _Mapping]]] = ..., first_plan: _Optional[_Union[Plan, _Mapping]] = ..., resizes: _Optional[_Iterable[_Union[Resize, _Mapping]]] = ..., origin_unix_s: _Optional[float] = ...) -> None: ...

class SubmitJobsRequest(_message.Message):
    __slots__ = ("jobs", "policy", "profiles")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.JobSpec]
    policy: str
    profiles: _containers.RepeatedCompositeFieldContainer[JobProfile]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_common_pb2.JobSpec, _Mapping]]] = ..., policy: _Optional[str] = ..., profiles: _Optional[_Iterable[_Union[JobProfile, _Mapping]]] = ...) -> None: ...

class SubmitJobsResponse(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _common_pb2.JobState
    def __init__(self, state: _Optional[_Union[_common_pb2.JobState, str]] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetPlanResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ...) -> None: ...

class WatchJobsRequest(_message.Message):
    __slots__ = ("after_revision", "job_ids")
    AFTER_REVISION_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    after_revision: int
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, after_revision: _Optional[int] = ..., job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchJobsResponse(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: JobUpdate
    def __init__(self, update: _Optional[_Union[JobUpdate, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "job_ids")
    STATES_FIELD_NUMBER: _ClassVar[int]
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_common_pb2.JobState]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, states: _Optional[_Iterable[_Union[_common_pb2.JobState, str]]] = ..., job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "revision")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobUpdate]
    revision: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobUpdate, _Mapping]]] = ..., revision: _Optional[int] = ...) -> None: ...

class GetReportRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetReportResponse(_message.Message):
    __slots__ = ("report",)
    REPORT_FIELD_NUMBER: _ClassVar[int]
    report: Report
    def __init__(self, report: _Optional[_Union[Report, _Mapping]] = ...) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "attempt", "rank", "follow")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    attempt: int
    rank: int
    follow: bool
    def __init__(self, job_id: _Optional[str] = ..., attempt: _Optional[int] = ..., rank: _Optional[int] = ..., follow: _Optional[bool] = ...) -> None: ...

class GetJobLogsResponse(_message.Message):
    __slots__ = ("node_id", "attempt", "attempt_id", "rank", "data")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    attempt: int
    attempt_id: str
    rank: int
    data: bytes
    def __init__(self, node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., attempt_id: _Optional[str] = ..., rank: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class RunTrialRequest(_message.Message):
    __slots__ = ("job", "gpus", "gpu_kind", "profile")
    JOB_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_KIND_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.JobSpec
    gpus: int
    gpu_kind: str
    profile: _executor_pb2.ProfileOptions
    def __init__(self, job: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., gpus: _Optional[int] = ..., gpu_kind: _Optional[str] = ..., profile: _Optional[_Union[_executor_pb2.ProfileOptions, _Mapping]] = ...) -> None: ...

class RunTrialResponse(_message.Message):
    __slots__ = ("gpus", "nodes", "iter_seconds", "steps", "epoch_seconds", "trial_id")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    ITER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    nodes: int
    iter_seconds: float
    steps: int
    epoch_seconds: float
    trial_id: str
    def __init__(self, gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., iter_seconds: _Optional[float] = ..., steps: _Optional[int] = ..., epoch_seconds: _Optional[float] = ..., trial_id: _Optional[str] = ...) -> None: ...
