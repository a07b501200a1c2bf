from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetVmRequest(_message.Message):
    __slots__ = ("vm_id",)
    VM_ID_FIELD_NUMBER: _ClassVar[int]
    vm_id: str
    def __init__(self, vm_id: _Optional[str] = ...) -> None: ...

class Vm(_message.Message):
    __slots__ = ("id", "tenant", "reservation_id", "host", "cores", "memory_gb", "frequency_ghz", "state")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Vm.State]
        STATE_ACTIVE: _ClassVar[Vm.State]
        STATE_RELEASED: _ClassVar[Vm.State]
    STATE_UNSPECIFIED: Vm.State
    STATE_ACTIVE: Vm.State
    STATE_RELEASED: Vm.State
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_GHZ_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    reservation_id: str
    host: str
    cores: float
    memory_gb: float
    frequency_ghz: float
    state: Vm.State
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., reservation_id: _Optional[str] = ..., host: _Optional[str] = ..., cores: _Optional[float] = ..., memory_gb: _Optional[float] = ..., frequency_ghz: _Optional[float] = ..., state: _Optional[_Union[Vm.State, str]] = ...) -> None: ...
