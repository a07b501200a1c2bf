"""A CRS under a CRS: what the one above makes of what the one below offers and answers.

A CRS is a manager like any other to a CRS above it (the IRM API is one; `crs_address` registers it there): it
offers its managers' resources, each naming its own manager (`PhysicalResource.manager`), so ids may repeat across
them ("h1" at two compute IRMs). The CRS above tells them apart by that name: a resource a manager offers under
another manager's name is known above as "<that manager>/<id>" -- the key the CRS below has it under, which is
what the CRS above pins (`ResourceGroup.placement`) when it delegates, and what the CRS below places pinned
instances on (placement.py). A stack of three repeats the step: each level's keys are the next one's ids.

A reply of the CRS below names its own managers' parts; to the CRS above the whole is one part, the CRS below's
reservation, released and asked about there (`as_one_part`).
"""

from __future__ import annotations

from harness.v1 import irm_pb2


def offered(manager: str, ev: irm_pb2.CapacityEvent) -> irm_pb2.CapacityEvent:
    """`ev` as `manager` offers it: a resource of another manager's (`manager` is a CRS) known by its key there.
    A manager's own resources (their `manager` empty or its own name) keep their ids."""
    if not any(r.manager and r.manager != manager for r in (ev.resource, *ev.more)):
        return ev
    out = irm_pb2.CapacityEvent()
    out.CopyFrom(ev)
    for r in (out.resource, *out.more):
        if r.manager and r.manager != manager:
            r.id = f"{r.manager}/{r.id}"
    return out


def as_one_part(manager: str, reply: irm_pb2.Reservation) -> list[irm_pb2.AllocatedGroup]:
    """The groups of `manager`'s reservation `reply`, as the CRS above records them: all one part of `manager`'s
    (released, asked about and metered there), their resources named as `offered` names them. Groups of
    `manager`'s own are as they came."""
    groups = []
    for g in reply.groups:
        if g.manager and g.manager != manager:
            g = _copy(g)
            for r in g.resources:
                if r.physical_id:
                    r.physical_id = f"{g.manager}/{r.physical_id}"
            g.manager, g.manager_reservation_id = manager, reply.id
        groups.append(g)
    return groups


def _copy(g: irm_pb2.AllocatedGroup) -> irm_pb2.AllocatedGroup:
    out = irm_pb2.AllocatedGroup()
    out.CopyFrom(g)
    return out
