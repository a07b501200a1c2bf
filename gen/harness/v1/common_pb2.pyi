from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Range(_message.Message):
    __slots__ = ("min", "max")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    min: float
    max: float
    def __init__(self, min: _Optional[float] = ..., max: _Optional[float] = ...) -> None: ...

class AttributeRequest(_message.Message):
    __slots__ = ("number", "range", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: float
    range: Range
    text: str
    def __init__(self, number: _Optional[float] = ..., range: _Optional[_Union[Range, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class Location(_message.Message):
    __slots__ = ("site", "rack", "host")
    SITE_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    site: str
    rack: str
    host: str
    def __init__(self, site: _Optional[str] = ..., rack: _Optional[str] = ..., host: _Optional[str] = ...) -> None: ...

class PhysicalResource(_message.Message):
    __slots__ = ("id", "resource_type", "capacity", "used", "properties", "traits", "location", "generation", "manager", "manager_down")
    class CapacityEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class UsedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    TRAITS_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MANAGER_FIELD_NUMBER: _ClassVar[int]
    MANAGER_DOWN_FIELD_NUMBER: _ClassVar[int]
    id: str
    resource_type: str
    capacity: _containers.ScalarMap[str, float]
    used: _containers.ScalarMap[str, float]
    properties: _containers.ScalarMap[str, float]
    traits: _containers.RepeatedScalarFieldContainer[str]
    location: Location
    generation: int
    manager: str
    manager_down: bool
    def __init__(self, id: _Optional[str] = ..., resource_type: _Optional[str] = ..., capacity: _Optional[_Mapping[str, float]] = ..., used: _Optional[_Mapping[str, float]] = ..., properties: _Optional[_Mapping[str, float]] = ..., traits: _Optional[_Iterable[str]] = ..., location: _Optional[_Union[Location, _Mapping]] = ..., generation: _Optional[int] = ..., manager: _Optional[str] = ..., manager_down: _Optional[bool] = ...) -> None: ...

class Link(_message.Message):
    __slots__ = ("a", "b", "latency_ms", "bandwidth_gbps")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_GBPS_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    latency_ms: float
    bandwidth_gbps: float
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ..., latency_ms: _Optional[float] = ..., bandwidth_gbps: _Optional[float] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("time", "value")
    TIME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    time: float
    value: float
    def __init__(self, time: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class Series(_message.Message):
    __slots__ = ("name", "resource_id", "samples")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    name: str
    resource_id: str
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    def __init__(self, name: _Optional[str] = ..., resource_id: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ...) -> None: ...
