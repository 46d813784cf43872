from omru.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProfileState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROFILE_STATE_UNSPECIFIED: _ClassVar[ProfileState]
    PROFILE_STATE_QUEUED: _ClassVar[ProfileState]
    PROFILE_STATE_MEASURING: _ClassVar[ProfileState]
    PROFILE_STATE_MEASURED: _ClassVar[ProfileState]
    PROFILE_STATE_DONE: _ClassVar[ProfileState]
    PROFILE_STATE_FAILED: _ClassVar[ProfileState]
PROFILE_STATE_UNSPECIFIED: ProfileState
PROFILE_STATE_QUEUED: ProfileState
PROFILE_STATE_MEASURING: ProfileState
PROFILE_STATE_MEASURED: ProfileState
PROFILE_STATE_DONE: ProfileState
PROFILE_STATE_FAILED: ProfileState

class ProfileKey(_message.Message):
    __slots__ = ("model", "input_shape", "batch_size", "gpu_kind", "nodes", "dataset", "train_samples", "full_epoch")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    GPU_KIND_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    FULL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    model: str
    input_shape: str
    batch_size: int
    gpu_kind: str
    nodes: int
    dataset: str
    train_samples: int
    full_epoch: bool
    def __init__(self, model: _Optional[str] = ..., input_shape: _Optional[str] = ..., batch_size: _Optional[int] = ..., gpu_kind: _Optional[str] = ..., nodes: _Optional[int] = ..., dataset: _Optional[str] = ..., train_samples: _Optional[int] = ..., full_epoch: _Optional[bool] = ...) -> None: ...

class ProfilePoint(_message.Message):
    __slots__ = ("gpus", "nodes", "epoch_seconds", "measured", "iter_seconds", "steps")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    ITER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    nodes: int
    epoch_seconds: float
    measured: bool
    iter_seconds: float
    steps: int
    def __init__(self, gpus: _Optional[int] = ..., nodes: _Optional[int] = ..., epoch_seconds: _Optional[float] = ..., measured: _Optional[bool] = ..., iter_seconds: _Optional[float] = ..., steps: _Optional[int] = ...) -> None: ...

class ScalingFit(_message.Message):
    __slots__ = ("a", "b", "c")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    C_FIELD_NUMBER: _ClassVar[int]
    a: float
    b: float
    c: float
    def __init__(self, a: _Optional[float] = ..., b: _Optional[float] = ..., c: _Optional[float] = ...) -> None: ...

class Profile(_message.Message):
    __slots__ = ("key", "points", "fit_error", "created_unix_s", "fit")
    KEY_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    FIT_ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    FIT_FIELD_NUMBER: _ClassVar[int]
    key: ProfileKey
    points: _containers.RepeatedCompositeFieldContainer[ProfilePoint]
    fit_error: float
    created_unix_s: float
    fit: ScalingFit
    def __init__(self, key: _Optional[_Union[ProfileKey, _Mapping]] = ..., points: _Optional[_Iterable[_Union[ProfilePoint, _Mapping]]] = ..., fit_error: _Optional[float] = ..., created_unix_s: _Optional[float] = ..., fit: _Optional[_Union[ScalingFit, _Mapping]] = ...) -> None: ...

class ProfileRequest(_message.Message):
    __slots__ = ("job", "gpu_counts", "max_gpus", "full_epoch", "refresh")
    JOB_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNTS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    FULL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REFRESH_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.JobSpec
    gpu_counts: _containers.RepeatedScalarFieldContainer[int]
    max_gpus: int
    full_epoch: bool
    refresh: bool
    def __init__(self, job: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., gpu_counts: _Optional[_Iterable[int]] = ..., max_gpus: _Optional[int] = ..., full_epoch: _Optional[bool] = ..., refresh: _Optional[bool] = ...) -> None: ...

class ProfileProgress(_message.Message):
    __slots__ = ("job_id", "gpus", "state", "epoch_seconds", "measured", "message", "profile", "cached")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    gpus: int
    state: ProfileState
    epoch_seconds: float
    measured: bool
    message: str
    profile: Profile
    cached: bool
    def __init__(self, job_id: _Optional[str] = ..., gpus: _Optional[int] = ..., state: _Optional[_Union[ProfileState, str]] = ..., epoch_seconds: _Optional[float] = ..., measured: _Optional[bool] = ..., message: _Optional[str] = ..., profile: _Optional[_Union[Profile, _Mapping]] = ..., cached: _Optional[bool] = ...) -> None: ...

class ProfileResponse(_message.Message):
    __slots__ = ("progress",)
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    progress: ProfileProgress
    def __init__(self, progress: _Optional[_Union[ProfileProgress, _Mapping]] = ...) -> None: ...

class GetProfileRequest(_message.Message):
    __slots__ = ("job", "gpu_kind", "full_epoch")
    JOB_FIELD_NUMBER: _ClassVar[int]
    GPU_KIND_FIELD_NUMBER: _ClassVar[int]
    FULL_EPOCH_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.JobSpec
    gpu_kind: str
    full_epoch: bool
    def __init__(self, job: _Optional[_Union[_common_pb2.JobSpec, _Mapping]] = ..., gpu_kind: _Optional[str] = ..., full_epoch: _Optional[bool] = ...) -> None: ...

class GetProfileResponse(_message.Message):
    __slots__ = ("profile",)
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    profile: Profile
    def __init__(self, profile: _Optional[_Union[Profile, _Mapping]] = ...) -> None: ...
