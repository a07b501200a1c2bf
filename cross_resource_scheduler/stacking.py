"""A CRS under a CRS: what the one above makes of what the one below offers and answers.

A CRS is a manager like any other to a CRS above it (the IRM API is one; `crs_address` registers it there): it
offers its managers' resources, each naming its own manager (`PhysicalResource.manager`), so ids may repeat across
them ("h1" at two compute IRMs). The CRS above tells them apart by that name: a resource a manager offers under
another manager's name is known above as "<that manager>/<id>" -- the key the CRS below has it under, which is
what the CRS above pins (`ResourceGroup.placement`) when it delegates, and what the CRS below places pinned
instances on (placement.py). A stack of three repeats the step: each level's keys are the next one's ids.

A reply of the CRS below names its own managers' parts; to the CRS above the whole is one part, the CRS below's
reservation, released and asked about there (`as_one_part`).

A CRS below may refuse a resource the one above pinned (a filter of its own, a site policy the CRS above does not
run): it answers FAILED_PRECONDITION PIN_REFUSED naming the resources of that type it refuses the group on
(`refused_metadata`), and the CRS above places the group again clear of them (`refused_keys`,
GroupDemand.avoid), or, its own group pinned from further up, passes the refusal up in its own keys.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from cross_resource_scheduler.view import Node
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


# A refusal's list of the resources a CRS below refuses a group on rides in an ErrorInfo, whose values are cut to
# 256 bytes (services.errors): the list is cut at whole lines within this many, the pin first. A line is a key
# ("<manager>/<id>") or "<prefix>/*": every resource of the group's type under that prefix ("<manager>/*", through a
# CRS below "<crs>/<manager>/*": a site's policy refusing the group outright, in a few bytes whatever its size).
REFUSED_BYTES = 240
ALL_OF = "/*"


def refused_metadata(group: str, pin: str, refused: Collection[str], of_type: Collection[str]) -> dict[str, str]:
    """The ErrorInfo metadata of a PIN_REFUSED refusal: the group, the resource it was pinned to, and the others
    of its type (keys here; `of_type`: all of them) that would refuse it too, judged alone on an empty cloud, so
    that the CRS above places it again clear of them at once rather than one a try. A refused key is said by the
    shortest prefix all of whose resources refuse ("<manager>/*", and, a CRS below a CRS, "<crs>/<manager>/*"):
    a policy refusing a site's IRM is one line through any number of levels. Cut to fit, the single keys listed are
    those after the pin (in order, round): refusals of different pins name different ones."""
    refused = set(refused)
    under: dict[str, list[str]] = {}
    for key in of_type:
        parts = key.split("/")
        for i in range(1, len(parts)):
            under.setdefault("/".join(parts[:i]), []).append(key)
    whole: set[str] = set()
    single: list[str] = []
    all_refused: dict[str, bool] = {}       # per prefix, judged once (a site of thousands: not once a key)
    for key in sorted(refused):
        parts = key.split("/")
        prefix = None
        for p in ("/".join(parts[:i]) for i in range(1, len(parts))):
            if p not in all_refused:
                all_refused[p] = p in under and refused.issuperset(under[p])
            if all_refused[p]:
                prefix = p
                break
        if prefix is not None:
            whole.add(prefix)
        elif key != pin:
            single.append(key)
    single = [k for k in single if k > pin] + [k for k in single if k < pin]
    lines, size = [], -1
    for line in [pin, *(p + ALL_OF for p in sorted(whole)), *single]:
        if size + 1 + len(line.encode()) > REFUSED_BYTES:
            continue        # a line too long to name leaves the room to the others
        lines.append(line)
        size += 1 + len(line.encode())
    return {"group": group, "pin": pin, "refused": "\n".join(lines)}


def refused_keys(manager: str, metadata: Mapping[str, str], of_type: Iterable[Node]) -> frozenset[str]:
    """The keys, here, of the resources `manager` (a CRS below) refused a group on (`refused_metadata`);
    `of_type`: this CRS's nodes of the group's type. Names this CRS does not know (cut, or gone) are left out."""
    theirs = {n.physical_id: n.key for n in of_type if n.manager == manager}
    keys: set[str] = set()
    for line in metadata.get("refused", "").split("\n"):
        if line.endswith(ALL_OF):
            prefix = line[:-len(ALL_OF)] + "/"
            keys.update(key for pid, key in theirs.items() if pid.startswith(prefix))
        elif line in theirs:
            keys.add(theirs[line])
    return frozenset(keys)
