from google.protobuf import any_pb2 as _any_pb2
from harness.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeAllocationSpecRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class AttributeSpec(_message.Message):
    __slots__ = ("name", "kind", "unit", "domain", "allowed_values", "consumable", "default", "description", "required", "integer")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[AttributeSpec.Kind]
        KIND_NUMBER: _ClassVar[AttributeSpec.Kind]
        KIND_TEXT: _ClassVar[AttributeSpec.Kind]
    KIND_UNSPECIFIED: AttributeSpec.Kind
    KIND_NUMBER: AttributeSpec.Kind
    KIND_TEXT: AttributeSpec.Kind
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_VALUES_FIELD_NUMBER: _ClassVar[int]
    CONSUMABLE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    INTEGER_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: AttributeSpec.Kind
    unit: str
    domain: _common_pb2.Range
    allowed_values: _containers.RepeatedScalarFieldContainer[str]
    consumable: bool
    default: _common_pb2.AttributeRequest
    description: str
    required: bool
    integer: bool
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[_Union[AttributeSpec.Kind, str]] = ..., unit: _Optional[str] = ..., domain: _Optional[_Union[_common_pb2.Range, _Mapping]] = ..., allowed_values: _Optional[_Iterable[str]] = ..., consumable: _Optional[bool] = ..., default: _Optional[_Union[_common_pb2.AttributeRequest, _Mapping]] = ..., description: _Optional[str] = ..., required: _Optional[bool] = ..., integer: _Optional[bool] = ...) -> None: ...

class ResourceTypeSpec(_message.Message):
    __slots__ = ("name", "description", "attributes", "metrics", "manager")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    MANAGER_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    attributes: _containers.RepeatedCompositeFieldContainer[AttributeSpec]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    manager: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., attributes: _Optional[_Iterable[_Union[AttributeSpec, _Mapping]]] = ..., metrics: _Optional[_Iterable[str]] = ..., manager: _Optional[str] = ...) -> None: ...

class DescribeAllocationSpecResponse(_message.Message):
    __slots__ = ("resource_types",)
    RESOURCE_TYPES_FIELD_NUMBER: _ClassVar[int]
    resource_types: _containers.RepeatedCompositeFieldContainer[ResourceTypeSpec]
    def __init__(self, resource_types: _Optional[_Iterable[_Union[ResourceTypeSpec, _Mapping]]] = ...) -> None: ...

class DiscoverResourcesRequest(_message.Message):
    __slots__ = ("tenant", "resource_type")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    resource_type: str
    def __init__(self, tenant: _Optional[str] = ..., resource_type: _Optional[str] = ...) -> None: ...

class DiscoverResourcesResponse(_message.Message):
    __slots__ = ("resources", "links")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[_common_pb2.PhysicalResource]
    links: _containers.RepeatedCompositeFieldContainer[_common_pb2.Link]
    def __init__(self, resources: _Optional[_Iterable[_Union[_common_pb2.PhysicalResource, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[_common_pb2.Link, _Mapping]]] = ...) -> None: ...

class ResourceGroup(_message.Message):
    __slots__ = ("name", "resource_type", "count", "attributes", "required_traits", "forbidden_traits", "placement")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _common_pb2.AttributeRequest
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_common_pb2.AttributeRequest, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_TRAITS_FIELD_NUMBER: _ClassVar[int]
    FORBIDDEN_TRAITS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    resource_type: str
    count: int
    attributes: _containers.MessageMap[str, _common_pb2.AttributeRequest]
    required_traits: _containers.RepeatedScalarFieldContainer[str]
    forbidden_traits: _containers.RepeatedScalarFieldContainer[str]
    placement: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., resource_type: _Optional[str] = ..., count: _Optional[int] = ..., attributes: _Optional[_Mapping[str, _common_pb2.AttributeRequest]] = ..., required_traits: _Optional[_Iterable[str]] = ..., forbidden_traits: _Optional[_Iterable[str]] = ..., placement: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupConstraint(_message.Message):
    __slots__ = ("kind", "group_a", "group_b", "value", "expression")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[GroupConstraint.Kind]
        KIND_SAME_HOST: _ClassVar[GroupConstraint.Kind]
        KIND_DIFFERENT_HOST: _ClassVar[GroupConstraint.Kind]
        KIND_MAX_HOPS: _ClassVar[GroupConstraint.Kind]
        KIND_MAX_LATENCY_MS: _ClassVar[GroupConstraint.Kind]
        KIND_MIN_BANDWIDTH_GBPS: _ClassVar[GroupConstraint.Kind]
    KIND_UNSPECIFIED: GroupConstraint.Kind
    KIND_SAME_HOST: GroupConstraint.Kind
    KIND_DIFFERENT_HOST: GroupConstraint.Kind
    KIND_MAX_HOPS: GroupConstraint.Kind
    KIND_MAX_LATENCY_MS: GroupConstraint.Kind
    KIND_MIN_BANDWIDTH_GBPS: GroupConstraint.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    GROUP_A_FIELD_NUMBER: _ClassVar[int]
    GROUP_B_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    kind: GroupConstraint.Kind
    group_a: str
    group_b: str
    value: float
    expression: str
    def __init__(self, kind: _Optional[_Union[GroupConstraint.Kind, str]] = ..., group_a: _Optional[str] = ..., group_b: _Optional[str] = ..., value: _Optional[float] = ..., expression: _Optional[str] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("tenant", "request_id", "groups", "constraints", "priority", "max_price_per_minute")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PRICE_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    request_id: str
    groups: _containers.RepeatedCompositeFieldContainer[ResourceGroup]
    constraints: _containers.RepeatedCompositeFieldContainer[GroupConstraint]
    priority: int
    max_price_per_minute: float
    def __init__(self, tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ResourceGroup, _Mapping]]] = ..., constraints: _Optional[_Iterable[_Union[GroupConstraint, _Mapping]]] = ..., priority: _Optional[int] = ..., max_price_per_minute: _Optional[float] = ...) -> None: ...

class ReserveBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ReserveRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ReserveRequest, _Mapping]]] = ...) -> None: ...

class ReserveBatchResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[ReserveOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[ReserveOutcome, _Mapping]]] = ...) -> None: ...

class ReserveOutcome(_message.Message):
    __slots__ = ("reservation", "error")
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reservation: Reservation
    error: ReserveError
    def __init__(self, reservation: _Optional[_Union[Reservation, _Mapping]] = ..., error: _Optional[_Union[ReserveError, _Mapping]] = ...) -> None: ...

class ReserveError(_message.Message):
    __slots__ = ("code", "message", "field_violations", "details")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_VIOLATIONS_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    field_violations: _containers.RepeatedCompositeFieldContainer[ReserveFieldViolation]
    details: _containers.RepeatedCompositeFieldContainer[_any_pb2.Any]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., field_violations: _Optional[_Iterable[_Union[ReserveFieldViolation, _Mapping]]] = ..., details: _Optional[_Iterable[_Union[_any_pb2.Any, _Mapping]]] = ...) -> None: ...

class ReserveFieldViolation(_message.Message):
    __slots__ = ("field", "description")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    field: str
    description: str
    def __init__(self, field: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class AllocatedResource(_message.Message):
    __slots__ = ("id", "physical_id", "address", "attributes", "location", "notes", "physical_generation")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    PHYSICAL_GENERATION_FIELD_NUMBER: _ClassVar[int]
    id: str
    physical_id: str
    address: str
    attributes: _containers.ScalarMap[str, float]
    location: _common_pb2.Location
    notes: _containers.RepeatedScalarFieldContainer[str]
    physical_generation: int
    def __init__(self, id: _Optional[str] = ..., physical_id: _Optional[str] = ..., address: _Optional[str] = ..., attributes: _Optional[_Mapping[str, float]] = ..., location: _Optional[_Union[_common_pb2.Location, _Mapping]] = ..., notes: _Optional[_Iterable[str]] = ..., physical_generation: _Optional[int] = ...) -> None: ...

class AllocatedGroup(_message.Message):
    __slots__ = ("name", "resource_type", "manager", "manager_reservation_id", "resources", "price_per_minute")
    NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MANAGER_FIELD_NUMBER: _ClassVar[int]
    MANAGER_RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    name: str
    resource_type: str
    manager: str
    manager_reservation_id: str
    resources: _containers.RepeatedCompositeFieldContainer[AllocatedResource]
    price_per_minute: float
    def __init__(self, name: _Optional[str] = ..., resource_type: _Optional[str] = ..., manager: _Optional[str] = ..., manager_reservation_id: _Optional[str] = ..., resources: _Optional[_Iterable[_Union[AllocatedResource, _Mapping]]] = ..., price_per_minute: _Optional[float] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("id", "tenant", "request_id", "state", "groups", "price_per_minute", "created_at", "released_at", "priority", "notes")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Reservation.State]
        STATE_ACTIVE: _ClassVar[Reservation.State]
        STATE_RELEASED: _ClassVar[Reservation.State]
        STATE_FAILED: _ClassVar[Reservation.State]
    STATE_UNSPECIFIED: Reservation.State
    STATE_ACTIVE: Reservation.State
    STATE_RELEASED: Reservation.State
    STATE_FAILED: Reservation.State
    ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    tenant: str
    request_id: str
    state: Reservation.State
    groups: _containers.RepeatedCompositeFieldContainer[AllocatedGroup]
    price_per_minute: float
    created_at: float
    released_at: float
    priority: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., tenant: _Optional[str] = ..., request_id: _Optional[str] = ..., state: _Optional[_Union[Reservation.State, str]] = ..., groups: _Optional[_Iterable[_Union[AllocatedGroup, _Mapping]]] = ..., price_per_minute: _Optional[float] = ..., created_at: _Optional[float] = ..., released_at: _Optional[float] = ..., priority: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class GetReservationRequest(_message.Message):
    __slots__ = ("tenant", "reservation_id", "request_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    reservation_id: str
    request_id: str
    def __init__(self, tenant: _Optional[str] = ..., reservation_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ListReservationsRequest(_message.Message):
    __slots__ = ("tenant", "include_released", "page_size", "page_token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_RELEASED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    include_released: bool
    page_size: int
    page_token: str
    def __init__(self, tenant: _Optional[str] = ..., include_released: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListReservationsResponse(_message.Message):
    __slots__ = ("reservations", "next_page_token")
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    reservations: _containers.RepeatedCompositeFieldContainer[Reservation]
    next_page_token: str
    def __init__(self, reservations: _Optional[_Iterable[_Union[Reservation, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReleaseReservationRequest(_message.Message):
    __slots__ = ("tenant", "reservation_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    reservation_id: str
    def __init__(self, tenant: _Optional[str] = ..., reservation_id: _Optional[str] = ...) -> None: ...

class QuotePriceRequest(_message.Message):
    __slots__ = ("tenant", "groups", "constraints")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    groups: _containers.RepeatedCompositeFieldContainer[ResourceGroup]
    constraints: _containers.RepeatedCompositeFieldContainer[GroupConstraint]
    def __init__(self, tenant: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ResourceGroup, _Mapping]]] = ..., constraints: _Optional[_Iterable[_Union[GroupConstraint, _Mapping]]] = ...) -> None: ...

class GroupQuote(_message.Message):
    __slots__ = ("name", "price_per_minute", "manager")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    MANAGER_FIELD_NUMBER: _ClassVar[int]
    name: str
    price_per_minute: float
    manager: str
    def __init__(self, name: _Optional[str] = ..., price_per_minute: _Optional[float] = ..., manager: _Optional[str] = ...) -> None: ...

class QuotePriceResponse(_message.Message):
    __slots__ = ("price_per_minute", "groups")
    PRICE_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    price_per_minute: float
    groups: _containers.RepeatedCompositeFieldContainer[GroupQuote]
    def __init__(self, price_per_minute: _Optional[float] = ..., groups: _Optional[_Iterable[_Union[GroupQuote, _Mapping]]] = ...) -> None: ...

class GetMetricsRequest(_message.Message):
    __slots__ = ("tenant", "reservation_id", "since")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    reservation_id: str
    since: float
    def __init__(self, tenant: _Optional[str] = ..., reservation_id: _Optional[str] = ..., since: _Optional[float] = ...) -> None: ...

class GetMetricsResponse(_message.Message):
    __slots__ = ("series",)
    SERIES_FIELD_NUMBER: _ClassVar[int]
    series: _containers.RepeatedCompositeFieldContainer[_common_pb2.Series]
    def __init__(self, series: _Optional[_Iterable[_Union[_common_pb2.Series, _Mapping]]] = ...) -> None: ...

class WatchCapacityRequest(_message.Message):
    __slots__ = ("tenant", "resource_type")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    resource_type: str
    def __init__(self, tenant: _Optional[str] = ..., resource_type: _Optional[str] = ...) -> None: ...

class CapacityEvent(_message.Message):
    __slots__ = ("kind", "resource", "more")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[CapacityEvent.Kind]
        KIND_SNAPSHOT: _ClassVar[CapacityEvent.Kind]
        KIND_SNAPSHOT_END: _ClassVar[CapacityEvent.Kind]
        KIND_UPDATED: _ClassVar[CapacityEvent.Kind]
        KIND_REMOVED: _ClassVar[CapacityEvent.Kind]
    KIND_UNSPECIFIED: CapacityEvent.Kind
    KIND_SNAPSHOT: CapacityEvent.Kind
    KIND_SNAPSHOT_END: CapacityEvent.Kind
    KIND_UPDATED: CapacityEvent.Kind
    KIND_REMOVED: CapacityEvent.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    kind: CapacityEvent.Kind
    resource: _common_pb2.PhysicalResource
    more: _containers.RepeatedCompositeFieldContainer[_common_pb2.PhysicalResource]
    def __init__(self, kind: _Optional[_Union[CapacityEvent.Kind, str]] = ..., resource: _Optional[_Union[_common_pb2.PhysicalResource, _Mapping]] = ..., more: _Optional[_Iterable[_Union[_common_pb2.PhysicalResource, _Mapping]]] = ...) -> None: ...
