from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_PROFILING: _ClassVar[JobState]
    JOB_STATE_WAITING: _ClassVar[JobState]
    JOB_STATE_STARTING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_RESIZING: _ClassVar[JobState]
    JOB_STATE_FINISHED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_PROFILING: JobState
JOB_STATE_WAITING: JobState
JOB_STATE_STARTING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_RESIZING: JobState
JOB_STATE_FINISHED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState

class JobSpec(_message.Message):
    __slots__ = ("job_id", "model", "dataset", "epochs", "batch_size", "base_lr", "base_batch", "warmup_epochs", "momentum", "weight_decay", "num_classes", "image_size", "frames", "min_gpus", "max_gpus", "seed", "train_samples", "command", "workdir", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BASE_LR_FIELD_NUMBER: _ClassVar[int]
    BASE_BATCH_FIELD_NUMBER: _ClassVar[int]
    WARMUP_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    MIN_GPUS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    dataset: str
    epochs: int
    batch_size: int
    base_lr: float
    base_batch: int
    warmup_epochs: int
    momentum: float
    weight_decay: float
    num_classes: int
    image_size: int
    frames: int
    min_gpus: int
    max_gpus: int
    seed: int
    train_samples: int
    command: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., dataset: _Optional[str] = ..., epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., base_lr: _Optional[float] = ..., base_batch: _Optional[int] = ..., warmup_epochs: _Optional[int] = ..., momentum: _Optional[float] = ..., weight_decay: _Optional[float] = ..., num_classes: _Optional[int] = ..., image_size: _Optional[int] = ..., frames: _Optional[int] = ..., min_gpus: _Optional[int] = ..., max_gpus: _Optional[int] = ..., seed: _Optional[int] = ..., train_samples: _Optional[int] = ..., command: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GpuRef(_message.Message):
    __slots__ = ("node_id", "index")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    index: int
    def __init__(self, node_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class GpuInfo(_message.Message):
    __slots__ = ("index", "kind", "memory_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: str
    memory_bytes: int
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[str] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("job_id", "start_s", "end_s", "gpus", "epochs")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    start_s: float
    end_s: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuRef]
    epochs: float
    def __init__(self, job_id: _Optional[str] = ..., start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuRef, _Mapping]]] = ..., epochs: _Optional[float] = ...) -> None: ...
