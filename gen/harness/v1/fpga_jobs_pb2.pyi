from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchJobsRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class DeadlineGoal(_message.Message):
    __slots__ = ("deadline_s", "size_actions")
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    SIZE_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    deadline_s: float
    size_actions: int
    def __init__(self, deadline_s: _Optional[float] = ..., size_actions: _Optional[int] = ...) -> None: ...

class ThroughputGoal(_message.Message):
    __slots__ = ("actions_per_s",)
    ACTIONS_PER_S_FIELD_NUMBER: _ClassVar[int]
    actions_per_s: float
    def __init__(self, actions_per_s: _Optional[float] = ...) -> None: ...

class RegisterJobRequest(_message.Message):
    __slots__ = ("tenant", "request_id", "design", "deadline", "throughput", "min_devices", "max_devices", "priority", "action_seconds")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    MIN_DEVICES_FIELD_NUMBER: _ClassVar[int]
    MAX_DEVICES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    request_id: str
    design: str
    deadline: DeadlineGoal
    throughput: ThroughputGoal
    min_devices: int
    max_devices: int
    priority: float
    action_seconds: float
    def __init__(self, tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., design: _Optional[str] = ..., deadline: _Optional[_Union[DeadlineGoal, _Mapping]] = ..., throughput: _Optional[_Union[ThroughputGoal, _Mapping]] = ..., min_devices: _Optional[int] = ..., max_devices: _Optional[int] = ..., priority: _Optional[float] = ..., action_seconds: _Optional[float] = ...) -> None: ...

class RetireJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class ReportProgressRequest(_message.Message):
    __slots__ = ("tenant", "job_id", "completed_actions")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    completed_actions: int
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ..., completed_actions: _Optional[int] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("tenant", "job_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    job_id: str
    def __init__(self, tenant: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("tenant", "active_only", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ONLY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    active_only: bool
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., active_only: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "pool_devices", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    POOL_DEVICES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    pool_devices: int
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., pool_devices: _Optional[int] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AllocationChange(_message.Message):
    __slots__ = ("time", "devices")
    TIME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    time: float
    devices: int
    def __init__(self, time: _Optional[float] = ..., devices: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "tenant", "request_id", "design", "group_id", "state", "deadline", "throughput", "min_devices", "max_devices", "priority", "policy", "devices", "completed_actions", "achieved_throughput", "mean_throughput", "allocations", "registered_at", "deadline_at", "retired_at", "dispatched_at", "action_seconds", "waiting_reason")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Job.State]
        STATE_ACTIVE: _ClassVar[Job.State]
        STATE_RETIRED: _ClassVar[Job.State]
        STATE_QUEUED: _ClassVar[Job.State]
    STATE_UNSPECIFIED: Job.State
    STATE_ACTIVE: Job.State
    STATE_RETIRED: Job.State
    STATE_QUEUED: Job.State
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    MIN_DEVICES_FIELD_NUMBER: _ClassVar[int]
    MAX_DEVICES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_ACTIONS_FIELD_NUMBER: _ClassVar[int]
    ACHIEVED_THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    MEAN_THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    RETIRED_AT_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    request_id: str
    design: str
    group_id: str
    state: Job.State
    deadline: DeadlineGoal
    throughput: ThroughputGoal
    min_devices: int
    max_devices: int
    priority: float
    policy: str
    devices: int
    completed_actions: int
    achieved_throughput: float
    mean_throughput: float
    allocations: _containers.RepeatedCompositeFieldContainer[AllocationChange]
    registered_at: float
    deadline_at: float
    retired_at: float
    dispatched_at: float
    action_seconds: float
    waiting_reason: str
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., design: _Optional[str] = ..., group_id: _Optional[str] = ..., state: _Optional[_Union[Job.State, str]] = ..., deadline: _Optional[_Union[DeadlineGoal, _Mapping]] = ..., throughput: _Optional[_Union[ThroughputGoal, _Mapping]] = ..., min_devices: _Optional[int] = ..., max_devices: _Optional[int] = ..., priority: _Optional[float] = ..., policy: _Optional[str] = ..., devices: _Optional[int] = ..., completed_actions: _Optional[int] = ..., achieved_throughput: _Optional[float] = ..., mean_throughput: _Optional[float] = ..., allocations: _Optional[_Iterable[_Union[AllocationChange, _Mapping]]] = ..., registered_at: _Optional[float] = ..., deadline_at: _Optional[float] = ..., retired_at: _Optional[float] = ..., dispatched_at: _Optional[float] = ..., action_seconds: _Optional[float] = ..., waiting_reason: _Optional[str] = ...) -> None: ...
