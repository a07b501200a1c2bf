from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterManagerRequest(_message.Message):
    __slots__ = ("name", "address", "resource_types", "instance_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    instance_id: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., resource_types: _Optional[_Iterable[str]] = ..., instance_id: _Optional[str] = ...) -> None: ...

class RegisterManagerResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s",)
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    def __init__(self, heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("name", "address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class ListManagersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ManagerInfo(_message.Message):
    __slots__ = ("name", "address", "resource_types", "up", "last_heartbeat", "resources", "follow_error", "refused")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_ERROR_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    resource_types: _containers.RepeatedScalarFieldContainer[str]
    up: bool
    last_heartbeat: float
    resources: int
    follow_error: str
    refused: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., resource_types: _Optional[_Iterable[str]] = ..., up: _Optional[bool] = ..., last_heartbeat: _Optional[float] = ..., resources: _Optional[int] = ..., follow_error: _Optional[str] = ..., refused: _Optional[str] = ...) -> None: ...

class RefusedRegistration(_message.Message):
    __slots__ = ("name", "address", "refused", "at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    refused: str
    at: float
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., refused: _Optional[str] = ..., at: _Optional[float] = ...) -> None: ...

class ListManagersResponse(_message.Message):
    __slots__ = ("managers", "refused")
    MANAGERS_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    managers: _containers.RepeatedCompositeFieldContainer[ManagerInfo]
    refused: _containers.RepeatedCompositeFieldContainer[RefusedRegistration]
    def __init__(self, managers: _Optional[_Iterable[_Union[ManagerInfo, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[RefusedRegistration, _Mapping]]] = ...) -> None: ...

class DeregisterManagerRequest(_message.Message):
    __slots__ = ("name", "abandon_parts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ABANDON_PARTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    abandon_parts: bool
    def __init__(self, name: _Optional[str] = ..., abandon_parts: _Optional[bool] = ...) -> None: ...

class DeregisterManagerResponse(_message.Message):
    __slots__ = ("name", "resources_removed", "releases_pending", "abandoned_reservations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_REMOVED_FIELD_NUMBER: _ClassVar[int]
    RELEASES_PENDING_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    resources_removed: int
    releases_pending: int
    abandoned_reservations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., resources_removed: _Optional[int] = ..., releases_pending: _Optional[int] = ..., abandoned_reservations: _Optional[_Iterable[str]] = ...) -> None: ...
