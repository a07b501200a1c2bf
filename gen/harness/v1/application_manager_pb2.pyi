from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitApplicationRequest(_message.Message):
    __slots__ = ("tenant", "manifest_json", "slo_json", "app_dir", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    SLO_JSON_FIELD_NUMBER: _ClassVar[int]
    APP_DIR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    manifest_json: str
    slo_json: str
    app_dir: str
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., manifest_json: _Optional[str] = ..., slo_json: _Optional[str] = ..., app_dir: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class Configuration(_message.Message):
    __slots__ = ("implementation", "values", "summary")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    IMPLEMENTATION_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    implementation: str
    values: _containers.ScalarMap[str, str]
    summary: str
    def __init__(self, implementation: _Optional[str] = ..., values: _Optional[_Mapping[str, str]] = ..., summary: _Optional[str] = ...) -> None: ...

class Application(_message.Message):
    __slots__ = ("id", "tenant", "name", "manifest_json", "slo_json", "app_dir", "configurations", "dimensions", "notes", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_JSON_FIELD_NUMBER: _ClassVar[int]
    SLO_JSON_FIELD_NUMBER: _ClassVar[int]
    APP_DIR_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATIONS_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    name: str
    manifest_json: str
    slo_json: str
    app_dir: str
    configurations: int
    dimensions: _containers.RepeatedScalarFieldContainer[str]
    notes: _containers.RepeatedScalarFieldContainer[str]
    created_at: float
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., name: _Optional[str] = ..., manifest_json: _Optional[str] = ..., slo_json: _Optional[str] = ..., app_dir: _Optional[str] = ..., configurations: _Optional[int] = ..., dimensions: _Optional[_Iterable[str]] = ..., notes: _Optional[_Iterable[str]] = ..., created_at: _Optional[float] = ...) -> None: ...

class GetApplicationRequest(_message.Message):
    __slots__ = ("tenant", "application_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    application_id: str
    def __init__(self, tenant: _Optional[str] = ..., application_id: _Optional[str] = ...) -> None: ...

class ListApplicationsRequest(_message.Message):
    __slots__ = ("tenant", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApplicationsResponse(_message.Message):
    __slots__ = ("applications", "next_page_token")
    APPLICATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    applications: _containers.RepeatedCompositeFieldContainer[Application]
    next_page_token: str
    def __init__(self, applications: _Optional[_Iterable[_Union[Application, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StartProfilingRequest(_message.Message):
    __slots__ = ("tenant", "application_id", "profiler", "max_runs", "max_cost", "max_duration_s", "seed", "warm_start", "run_timeout_s")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILER_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNS_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_FIELD_NUMBER: _ClassVar[int]
    MAX_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    WARM_START_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    application_id: str
    profiler: str
    max_runs: int
    max_cost: float
    max_duration_s: float
    seed: int
    warm_start: bool
    run_timeout_s: float
    def __init__(self, tenant: _Optional[str] = ..., application_id: _Optional[str] = ..., profiler: _Optional[str] = ..., max_runs: _Optional[int] = ..., max_cost: _Optional[float] = ..., max_duration_s: _Optional[float] = ..., seed: _Optional[int] = ..., warm_start: _Optional[bool] = ..., run_timeout_s: _Optional[float] = ...) -> None: ...

class ProfilingSession(_message.Message):
    __slots__ = ("id", "application_id", "profiler", "state", "runs", "max_runs", "spent", "message", "started_at", "ended_at")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[ProfilingSession.State]
        STATE_RUNNING: _ClassVar[ProfilingSession.State]
        STATE_DONE: _ClassVar[ProfilingSession.State]
        STATE_STOPPED: _ClassVar[ProfilingSession.State]
        STATE_FAILED: _ClassVar[ProfilingSession.State]
    STATE_UNSPECIFIED: ProfilingSession.State
    STATE_RUNNING: ProfilingSession.State
    STATE_DONE: ProfilingSession.State
    STATE_STOPPED: ProfilingSession.State
    STATE_FAILED: ProfilingSession.State
    ID_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNS_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    application_id: str
    profiler: str
    state: ProfilingSession.State
    runs: int
    max_runs: int
    spent: float
    message: str
    started_at: float
    ended_at: float
    def __init__(self, id: _Optional[str] = ..., application_id: _Optional[str] = ..., profiler: _Optional[str] = ..., state: _Optional[_Union[ProfilingSession.State, str]] = ..., runs: _Optional[int] = ..., max_runs: _Optional[int] = ..., spent: _Optional[float] = ..., message: _Optional[str] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ...) -> None: ...

class ProfileRun(_message.Message):
    __slots__ = ("ordinal", "configuration", "input", "ok", "error", "execution_time_s", "cost", "cpu_percent", "memory_percent", "predicted", "session_id", "reason")
    class Input(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        INPUT_UNSPECIFIED: _ClassVar[ProfileRun.Input]
        INPUT_PRODUCTION: _ClassVar[ProfileRun.Input]
        INPUT_BENCHMARK: _ClassVar[ProfileRun.Input]
    INPUT_UNSPECIFIED: ProfileRun.Input
    INPUT_PRODUCTION: ProfileRun.Input
    INPUT_BENCHMARK: ProfileRun.Input
    ORDINAL_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ordinal: int
    configuration: Configuration
    input: ProfileRun.Input
    ok: bool
    error: str
    execution_time_s: float
    cost: float
    cpu_percent: float
    memory_percent: float
    predicted: bool
    session_id: str
    reason: str
    def __init__(self, ordinal: _Optional[int] = ..., configuration: _Optional[_Union[Configuration, _Mapping]] = ..., input: _Optional[_Union[ProfileRun.Input, str]] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., execution_time_s: _Optional[float] = ..., cost: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., memory_percent: _Optional[float] = ..., predicted: _Optional[bool] = ..., session_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ProfilingEvent(_message.Message):
    __slots__ = ("session", "run", "frontier_size")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    FRONTIER_SIZE_FIELD_NUMBER: _ClassVar[int]
    session: ProfilingSession
    run: ProfileRun
    frontier_size: int
    def __init__(self, session: _Optional[_Union[ProfilingSession, _Mapping]] = ..., run: _Optional[_Union[ProfileRun, _Mapping]] = ..., frontier_size: _Optional[int] = ...) -> None: ...

class StopProfilingRequest(_message.Message):
    __slots__ = ("tenant", "session_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("tenant", "application_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    application_id: str
    def __init__(self, tenant: _Optional[str] = ..., application_id: _Optional[str] = ...) -> None: ...

class Extrapolation(_message.Message):
    __slots__ = ("family", "params", "r2", "points", "constraints")
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    R2_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    family: str
    params: _containers.RepeatedScalarFieldContainer[float]
    r2: float
    points: int
    constraints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, family: _Optional[str] = ..., params: _Optional[_Iterable[float]] = ..., r2: _Optional[float] = ..., points: _Optional[int] = ..., constraints: _Optional[_Iterable[str]] = ...) -> None: ...

class PerformanceModel(_message.Message):
    __slots__ = ("application_id", "runs", "frontier", "extrapolation", "sessions", "updated_at", "runs_left_out", "sessions_left_out")
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    FRONTIER_FIELD_NUMBER: _ClassVar[int]
    EXTRAPOLATION_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    RUNS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    application_id: str
    runs: _containers.RepeatedCompositeFieldContainer[ProfileRun]
    frontier: _containers.RepeatedCompositeFieldContainer[ProfileRun]
    extrapolation: Extrapolation
    sessions: _containers.RepeatedCompositeFieldContainer[ProfilingSession]
    updated_at: float
    runs_left_out: int
    sessions_left_out: int
    def __init__(self, application_id: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[ProfileRun, _Mapping]]] = ..., frontier: _Optional[_Iterable[_Union[ProfileRun, _Mapping]]] = ..., extrapolation: _Optional[_Union[Extrapolation, _Mapping]] = ..., sessions: _Optional[_Iterable[_Union[ProfilingSession, _Mapping]]] = ..., updated_at: _Optional[float] = ..., runs_left_out: _Optional[int] = ..., sessions_left_out: _Optional[int] = ...) -> None: ...

class ExecuteApplicationRequest(_message.Message):
    __slots__ = ("tenant", "application_id", "slo_json", "request_id", "timeout_s", "online")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    SLO_JSON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ONLINE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    application_id: str
    slo_json: str
    request_id: str
    timeout_s: float
    online: bool
    def __init__(self, tenant: _Optional[str] = ..., application_id: _Optional[str] = ..., slo_json: _Optional[str] = ..., request_id: _Optional[str] = ..., timeout_s: _Optional[float] = ..., online: _Optional[bool] = ...) -> None: ...

class ApplicationExecution(_message.Message):
    __slots__ = ("id", "application_id", "tenant", "state", "configuration", "predicted_time_s", "predicted_cost", "measured_time_s", "measured_cost", "slo_met", "error", "output_tail", "reservation_id", "started_at", "ended_at", "slo")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[ApplicationExecution.State]
        STATE_RUNNING: _ClassVar[ApplicationExecution.State]
        STATE_SUCCEEDED: _ClassVar[ApplicationExecution.State]
        STATE_FAILED: _ClassVar[ApplicationExecution.State]
    STATE_UNSPECIFIED: ApplicationExecution.State
    STATE_RUNNING: ApplicationExecution.State
    STATE_SUCCEEDED: ApplicationExecution.State
    STATE_FAILED: ApplicationExecution.State
    ID_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TIME_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_COST_FIELD_NUMBER: _ClassVar[int]
    MEASURED_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_COST_FIELD_NUMBER: _ClassVar[int]
    SLO_MET_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TAIL_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    id: str
    application_id: str
    tenant: str
    state: ApplicationExecution.State
    configuration: Configuration
    predicted_time_s: float
    predicted_cost: float
    measured_time_s: float
    measured_cost: float
    slo_met: bool
    error: str
    output_tail: str
    reservation_id: str
    started_at: float
    ended_at: float
    slo: str
    def __init__(self, id: _Optional[str] = ..., application_id: _Optional[str] = ..., tenant: _Optional[str] = ..., state: _Optional[_Union[ApplicationExecution.State, str]] = ..., configuration: _Optional[_Union[Configuration, _Mapping]] = ..., predicted_time_s: _Optional[float] = ..., predicted_cost: _Optional[float] = ..., measured_time_s: _Optional[float] = ..., measured_cost: _Optional[float] = ..., slo_met: _Optional[bool] = ..., error: _Optional[str] = ..., output_tail: _Optional[str] = ..., reservation_id: _Optional[str] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., slo: _Optional[str] = ...) -> None: ...

class ListExecutionsRequest(_message.Message):
    __slots__ = ("tenant", "application_id", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    APPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    application_id: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., application_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListExecutionsResponse(_message.Message):
    __slots__ = ("executions", "next_page_token")
    EXECUTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    executions: _containers.RepeatedCompositeFieldContainer[ApplicationExecution]
    next_page_token: str
    def __init__(self, executions: _Optional[_Iterable[_Union[ApplicationExecution, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
