from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("number", "flag", "array", "text", "integer")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    ARRAY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    number: float
    flag: bool
    array: Tensor
    text: str
    integer: int
    def __init__(self, number: _Optional[float] = ..., flag: _Optional[bool] = ..., array: _Optional[_Union[Tensor, _Mapping]] = ..., text: _Optional[str] = ..., integer: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("id", "kind", "params")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Task.Kind]
        KIND_RUN: _ClassVar[Task.Kind]
        KIND_LOCK: _ClassVar[Task.Kind]
        KIND_UNLOCK: _ClassVar[Task.Kind]
    KIND_UNSPECIFIED: Task.Kind
    KIND_RUN: Task.Kind
    KIND_LOCK: Task.Kind
    KIND_UNLOCK: Task.Kind
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: Task.Kind
    params: _containers.MessageMap[str, Value]
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[_Union[Task.Kind, str]] = ..., params: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class TaskBatch(_message.Message):
    __slots__ = ("client_id", "group_id", "token", "tasks", "shared_params")
    class SharedParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SHARED_PARAMS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group_id: str
    token: str
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    shared_params: _containers.MessageMap[str, Value]
    def __init__(self, client_id: _Optional[str] = ..., group_id: _Optional[str] = ..., token: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., shared_params: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("id", "kind", "value", "error", "queue_time_s", "device_time_s", "device", "server")
    class ValueEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    QUEUE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TIME_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: Task.Kind
    value: _containers.MessageMap[str, Value]
    error: str
    queue_time_s: float
    device_time_s: float
    device: int
    server: str
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[_Union[Task.Kind, str]] = ..., value: _Optional[_Mapping[str, Value]] = ..., error: _Optional[str] = ..., queue_time_s: _Optional[float] = ..., device_time_s: _Optional[float] = ..., device: _Optional[int] = ..., server: _Optional[str] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TaskResult]
    def __init__(self, results: _Optional[_Iterable[_Union[TaskResult, _Mapping]]] = ...) -> None: ...

class GetServerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("index", "state", "design", "group_id", "failures")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[DeviceInfo.State]
        STATE_FREE: _ClassVar[DeviceInfo.State]
        STATE_RECONFIGURING: _ClassVar[DeviceInfo.State]
        STATE_IDLE: _ClassVar[DeviceInfo.State]
        STATE_BUSY: _ClassVar[DeviceInfo.State]
        STATE_BLACKLISTED: _ClassVar[DeviceInfo.State]
    STATE_UNSPECIFIED: DeviceInfo.State
    STATE_FREE: DeviceInfo.State
    STATE_RECONFIGURING: DeviceInfo.State
    STATE_IDLE: DeviceInfo.State
    STATE_BUSY: DeviceInfo.State
    STATE_BLACKLISTED: DeviceInfo.State
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    index: int
    state: DeviceInfo.State
    design: str
    group_id: str
    failures: int
    def __init__(self, index: _Optional[int] = ..., state: _Optional[_Union[DeviceInfo.State, str]] = ..., design: _Optional[str] = ..., group_id: _Optional[str] = ..., failures: _Optional[int] = ...) -> None: ...

class GroupPart(_message.Message):
    __slots__ = ("group_id", "design", "target", "active", "min_size", "max_size", "clients", "server")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    design: str
    target: int
    active: int
    min_size: int
    max_size: int
    clients: _containers.RepeatedScalarFieldContainer[str]
    server: str
    def __init__(self, group_id: _Optional[str] = ..., design: _Optional[str] = ..., target: _Optional[int] = ..., active: _Optional[int] = ..., min_size: _Optional[int] = ..., max_size: _Optional[int] = ..., clients: _Optional[_Iterable[str]] = ..., server: _Optional[str] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("name", "devices", "groups", "designs", "reconfiguration_s", "events", "boot_id", "read_seq")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DESIGNS_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURATION_S_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    READ_SEQ_FIELD_NUMBER: _ClassVar[int]
    name: str
    devices: _containers.RepeatedCompositeFieldContainer[DeviceInfo]
    groups: _containers.RepeatedCompositeFieldContainer[GroupPart]
    designs: _containers.RepeatedScalarFieldContainer[str]
    reconfiguration_s: float
    events: _containers.RepeatedScalarFieldContainer[str]
    boot_id: str
    read_seq: int
    def __init__(self, name: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[DeviceInfo, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupPart, _Mapping]]] = ..., designs: _Optional[_Iterable[str]] = ..., reconfiguration_s: _Optional[float] = ..., events: _Optional[_Iterable[str]] = ..., boot_id: _Optional[str] = ..., read_seq: _Optional[int] = ...) -> None: ...

class CreateGroupPartRequest(_message.Message):
    __slots__ = ("group_id", "design", "size", "min_size", "max_size")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    design: str
    size: int
    min_size: int
    max_size: int
    def __init__(self, group_id: _Optional[str] = ..., design: _Optional[str] = ..., size: _Optional[int] = ..., min_size: _Optional[int] = ..., max_size: _Optional[int] = ...) -> None: ...

class ResizeGroupPartRequest(_message.Message):
    __slots__ = ("group_id", "size", "hand_back")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    HAND_BACK_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    size: int
    hand_back: bool
    def __init__(self, group_id: _Optional[str] = ..., size: _Optional[int] = ..., hand_back: _Optional[bool] = ...) -> None: ...

class DeleteGroupPartRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class DeleteGroupPartResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerAttachRequest(_message.Message):
    __slots__ = ("group_id", "client_id", "token")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    client_id: str
    token: str
    def __init__(self, group_id: _Optional[str] = ..., client_id: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class ServerAttachResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerClientRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    def __init__(self, client_id: _Optional[str] = ...) -> None: ...

class ServerClientResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class GetMeasurementsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClientCounters(_message.Message):
    __slots__ = ("client_id", "submitted", "completed", "queued", "waiting", "running")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    submitted: int
    completed: int
    queued: int
    waiting: int
    running: int
    def __init__(self, client_id: _Optional[str] = ..., submitted: _Optional[int] = ..., completed: _Optional[int] = ..., queued: _Optional[int] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ...) -> None: ...

class GroupCounters(_message.Message):
    __slots__ = ("group_id", "active", "submitted", "completed", "queued", "busy_device_s", "clients", "design", "target", "joining", "draining", "waiting", "running", "failed", "incarnation")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    BUSY_DEVICE_S_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    JOINING_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    active: int
    submitted: int
    completed: int
    queued: int
    busy_device_s: float
    clients: _containers.RepeatedCompositeFieldContainer[ClientCounters]
    design: str
    target: int
    joining: int
    draining: int
    waiting: int
    running: int
    failed: int
    incarnation: str
    def __init__(self, group_id: _Optional[str] = ..., active: _Optional[int] = ..., submitted: _Optional[int] = ..., completed: _Optional[int] = ..., queued: _Optional[int] = ..., busy_device_s: _Optional[float] = ..., clients: _Optional[_Iterable[_Union[ClientCounters, _Mapping]]] = ..., design: _Optional[str] = ..., target: _Optional[int] = ..., joining: _Optional[int] = ..., draining: _Optional[int] = ..., waiting: _Optional[int] = ..., running: _Optional[int] = ..., failed: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...

class ServerMeasurements(_message.Message):
    __slots__ = ("time", "groups", "usable_devices", "reconfigurations", "devices", "reconfiguration_failures")
    TIME_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    USABLE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURATIONS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    RECONFIGURATION_FAILURES_FIELD_NUMBER: _ClassVar[int]
    time: float
    groups: _containers.RepeatedCompositeFieldContainer[GroupCounters]
    usable_devices: int
    reconfigurations: int
    devices: int
    reconfiguration_failures: int
    def __init__(self, time: _Optional[float] = ..., groups: _Optional[_Iterable[_Union[GroupCounters, _Mapping]]] = ..., usable_devices: _Optional[int] = ..., reconfigurations: _Optional[int] = ..., devices: _Optional[int] = ..., reconfiguration_failures: _Optional[int] = ...) -> None: ...

class RunDirectRequest(_message.Message):
    __slots__ = ("device", "design", "task")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    device: int
    design: str
    task: Task
    def __init__(self, device: _Optional[int] = ..., design: _Optional[str] = ..., task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class InjectFaultRequest(_message.Message):
    __slots__ = ("device", "count")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    device: int
    count: int
    def __init__(self, device: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class InjectFaultResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FpgaGroup(_message.Message):
    __slots__ = ("id", "tenant", "design", "size", "min_size", "max_size", "sharing", "scaling", "parts", "active", "clients", "created_at", "deleted")
    class Sharing(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SHARING_UNSPECIFIED: _ClassVar[FpgaGroup.Sharing]
        SHARING_PRIVATE: _ClassVar[FpgaGroup.Sharing]
        SHARING_SHARED: _ClassVar[FpgaGroup.Sharing]
    SHARING_UNSPECIFIED: FpgaGroup.Sharing
    SHARING_PRIVATE: FpgaGroup.Sharing
    SHARING_SHARED: FpgaGroup.Sharing
    class Scaling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SCALING_UNSPECIFIED: _ClassVar[FpgaGroup.Scaling]
        SCALING_STATIC: _ClassVar[FpgaGroup.Scaling]
        SCALING_ELASTIC: _ClassVar[FpgaGroup.Scaling]
    SCALING_UNSPECIFIED: FpgaGroup.Scaling
    SCALING_STATIC: FpgaGroup.Scaling
    SCALING_ELASTIC: FpgaGroup.Scaling
    class PartsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    design: str
    size: int
    min_size: int
    max_size: int
    sharing: FpgaGroup.Sharing
    scaling: FpgaGroup.Scaling
    parts: _containers.ScalarMap[str, int]
    active: int
    clients: _containers.RepeatedScalarFieldContainer[str]
    created_at: float
    deleted: bool
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., design: _Optional[str] = ..., size: _Optional[int] = ..., min_size: _Optional[int] = ..., max_size: _Optional[int] = ..., sharing: _Optional[_Union[FpgaGroup.Sharing, str]] = ..., scaling: _Optional[_Union[FpgaGroup.Scaling, str]] = ..., parts: _Optional[_Mapping[str, int]] = ..., active: _Optional[int] = ..., clients: _Optional[_Iterable[str]] = ..., created_at: _Optional[float] = ..., deleted: _Optional[bool] = ...) -> None: ...

class CreateGroupRequest(_message.Message):
    __slots__ = ("tenant", "request_id", "design", "size", "min_size", "max_size", "sharing", "scaling")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHARING_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    request_id: str
    design: str
    size: int
    min_size: int
    max_size: int
    sharing: FpgaGroup.Sharing
    scaling: FpgaGroup.Scaling
    def __init__(self, tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., design: _Optional[str] = ..., size: _Optional[int] = ..., min_size: _Optional[int] = ..., max_size: _Optional[int] = ..., sharing: _Optional[_Union[FpgaGroup.Sharing, str]] = ..., scaling: _Optional[_Union[FpgaGroup.Scaling, str]] = ...) -> None: ...

class GetGroupRequest(_message.Message):
    __slots__ = ("tenant", "group_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    group_id: str
    def __init__(self, tenant: _Optional[str] = ..., group_id: _Optional[str] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("tenant", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups", "next_page_token")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[FpgaGroup]
    next_page_token: str
    def __init__(self, groups: _Optional[_Iterable[_Union[FpgaGroup, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResizeGroupRequest(_message.Message):
    __slots__ = ("tenant", "group_id", "size")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    group_id: str
    size: int
    def __init__(self, tenant: _Optional[str] = ..., group_id: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("tenant", "group_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    group_id: str
    def __init__(self, tenant: _Optional[str] = ..., group_id: _Optional[str] = ...) -> None: ...

class AttachClientRequest(_message.Message):
    __slots__ = ("tenant", "group_id", "client_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    group_id: str
    client_id: str
    def __init__(self, tenant: _Optional[str] = ..., group_id: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class Attachment(_message.Message):
    __slots__ = ("client_id", "group_id", "token", "parts", "design")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    DESIGN_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    group_id: str
    token: str
    parts: _containers.RepeatedCompositeFieldContainer[AttachedPart]
    design: str
    def __init__(self, client_id: _Optional[str] = ..., group_id: _Optional[str] = ..., token: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[AttachedPart, _Mapping]]] = ..., design: _Optional[str] = ...) -> None: ...

class AttachedPart(_message.Message):
    __slots__ = ("server", "address", "devices")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    server: str
    address: str
    devices: int
    def __init__(self, server: _Optional[str] = ..., address: _Optional[str] = ..., devices: _Optional[int] = ...) -> None: ...

class ClientRequest(_message.Message):
    __slots__ = ("tenant", "group_id", "client_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    group_id: str
    client_id: str
    def __init__(self, tenant: _Optional[str] = ..., group_id: _Optional[str] = ..., client_id: _Optional[str] = ...) -> None: ...

class ClientResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: int
    def __init__(self, cancelled: _Optional[int] = ...) -> None: ...

class ListDevicesRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListDevicesResponse(_message.Message):
    __slots__ = ("servers",)
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[ServerInfo]
    def __init__(self, servers: _Optional[_Iterable[_Union[ServerInfo, _Mapping]]] = ...) -> None: ...
