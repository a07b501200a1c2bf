from harness.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExecuteRequest(_message.Message):
    __slots__ = ("tenant", "vm_id", "argv", "env", "working_dir", "timeout_s", "replay_cost_limit")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TENANT_FIELD_NUMBER: _ClassVar[int]
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    REPLAY_COST_LIMIT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    vm_id: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    working_dir: str
    timeout_s: float
    replay_cost_limit: float
    def __init__(self, tenant: _Optional[str] = ..., vm_id: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., timeout_s: _Optional[float] = ..., replay_cost_limit: _Optional[float] = ...) -> None: ...

class UtilisationSample(_message.Message):
    __slots__ = ("time", "cpu_percent", "memory_percent", "memory_mb")
    TIME_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    time: float
    cpu_percent: float
    memory_percent: float
    memory_mb: float
    def __init__(self, time: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., memory_percent: _Optional[float] = ..., memory_mb: _Optional[float] = ...) -> None: ...

class ExecutionStarted(_message.Message):
    __slots__ = ("execution_id", "pid", "cpus", "memory_limit_mb", "notes")
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_MB_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    execution_id: str
    pid: int
    cpus: _containers.RepeatedScalarFieldContainer[int]
    memory_limit_mb: float
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, execution_id: _Optional[str] = ..., pid: _Optional[int] = ..., cpus: _Optional[_Iterable[int]] = ..., memory_limit_mb: _Optional[float] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecutionExited(_message.Message):
    __slots__ = ("exit_code", "wall_time_s", "reason", "peak_memory_mb", "mean_cpu_percent", "replayed_cost", "replayed")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    WALL_TIME_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    MEAN_CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_COST_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    wall_time_s: float
    reason: str
    peak_memory_mb: float
    mean_cpu_percent: float
    replayed_cost: float
    replayed: bool
    def __init__(self, exit_code: _Optional[int] = ..., wall_time_s: _Optional[float] = ..., reason: _Optional[str] = ..., peak_memory_mb: _Optional[float] = ..., mean_cpu_percent: _Optional[float] = ..., replayed_cost: _Optional[float] = ..., replayed: _Optional[bool] = ...) -> None: ...

class ExecuteEvent(_message.Message):
    __slots__ = ("started", "stdout", "stderr", "sample", "exited")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    started: ExecutionStarted
    stdout: bytes
    stderr: bytes
    sample: UtilisationSample
    exited: ExecutionExited
    def __init__(self, started: _Optional[_Union[ExecutionStarted, _Mapping]] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., sample: _Optional[_Union[UtilisationSample, _Mapping]] = ..., exited: _Optional[_Union[ExecutionExited, _Mapping]] = ...) -> None: ...

class GetExecutionRequest(_message.Message):
    __slots__ = ("tenant", "execution_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    execution_id: str
    def __init__(self, tenant: _Optional[str] = ..., execution_id: _Optional[str] = ...) -> None: ...

class Execution(_message.Message):
    __slots__ = ("execution_id", "vm_id", "tenant", "state", "argv", "started", "exited", "samples")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Execution.State]
        STATE_RUNNING: _ClassVar[Execution.State]
        STATE_EXITED: _ClassVar[Execution.State]
    STATE_UNSPECIFIED: Execution.State
    STATE_RUNNING: Execution.State
    STATE_EXITED: Execution.State
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    execution_id: str
    vm_id: str
    tenant: str
    state: Execution.State
    argv: _containers.RepeatedScalarFieldContainer[str]
    started: ExecutionStarted
    exited: ExecutionExited
    samples: _containers.RepeatedCompositeFieldContainer[UtilisationSample]
    def __init__(self, execution_id: _Optional[str] = ..., vm_id: _Optional[str] = ..., tenant: _Optional[str] = ..., state: _Optional[_Union[Execution.State, str]] = ..., argv: _Optional[_Iterable[str]] = ..., started: _Optional[_Union[ExecutionStarted, _Mapping]] = ..., exited: _Optional[_Union[ExecutionExited, _Mapping]] = ..., samples: _Optional[_Iterable[_Union[UtilisationSample, _Mapping]]] = ...) -> None: ...

class StopExecutionRequest(_message.Message):
    __slots__ = ("tenant", "execution_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    execution_id: str
    def __init__(self, tenant: _Optional[str] = ..., execution_id: _Optional[str] = ...) -> None: ...

class ReleaseVmRequest(_message.Message):
    __slots__ = ("vm_id",)
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    vm_id: str
    def __init__(self, vm_id: _Optional[str] = ...) -> None: ...

class ReleaseVmResponse(_message.Message):
    __slots__ = ("killed",)
    KILLED_FIELD_NUMBER: _ClassVar[int]
    killed: int
    def __init__(self, killed: _Optional[int] = ...) -> None: ...

class GetVmMetricsRequest(_message.Message):
    __slots__ = ("vm_id", "tenant", "since")
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    vm_id: str
    tenant: str
    since: float
    def __init__(self, vm_id: _Optional[str] = ..., tenant: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class GetVmMetricsResponse(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[_common_pb2.Series]
    def __init__(self, series: _Optional[_Iterable[_Union[_common_pb2.Series, _Mapping]]] = ...) -> None: ...
