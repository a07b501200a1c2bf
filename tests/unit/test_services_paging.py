"""Keyset paging (services.paging) over a real table: every row once, in order, across ties and changes."""

from __future__ import annotations

import pytest
from sqlalchemy import Float, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from services import paging
from services.errors import InvalidArgument


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "rows"
    id: Mapped[str] = mapped_column(String(8), primary_key=True)
    at: Mapped[float] = mapped_column(Float)


@pytest.fixture
def session():
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    with Session(engine) as s:
        # Three rows share a time (made in one instant): the id breaks the tie. 0.1 + 0.2 tests float round-trips.
        s.add_all([Row(id=i, at=t) for i, t in [("e", 0.1 + 0.2), ("b", 1.0), ("a", 1.0), ("c", 1.0), ("d", 0.5)]])
        s.commit()
        yield s
    engine.dispose()


def walk(s: Session, size: int) -> list[list[str]]:
    pages, token = [], ""
    while True:
        rows, token = paging.page(s, select(Row), [Row.at, Row.id], size, token)
        pages.append([r.id for r in rows])
        if not token:
            return pages


def test_pages_visit_every_row_once_in_order_across_ties(session):
    assert walk(session, 2) == [["e", "d"], ["a", "b"], ["c"]]
    assert walk(session, 5) == [["e", "d", "a", "b", "c"]]
    assert walk(session, 0) == [["e", "d", "a", "b", "c"]]          # 0: the default size


def test_a_row_made_between_pages_neither_repeats_nor_skips_another(session):
    rows, token = paging.page(session, select(Row), [Row.at, Row.id], 2, "")
    session.add(Row(id="z", at=0.0))        # before the position: not on the later pages
    session.add(Row(id="f", at=1.0))        # after it: on them
    session.commit()
    seen = [r.id for r in rows]
    while token:
        rows, token = paging.page(session, select(Row), [Row.at, Row.id], 2, token)
        seen += [r.id for r in rows]
    assert seen == ["e", "d", "a", "b", "c", "f"]


def _token(key: object) -> str:
    import base64
    import json

    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode()


@pytest.mark.parametrize("token", ["not-a-token!!", _token([]), _token([1, 2, 3]), _token([1.0, True]),
                                   _token({"a": 1}), _token([10 ** 400, "a"]), _token(["x", "y"]),
                                   _token([1.5, 5]), "W1s" * 50000])
def test_a_token_that_is_not_ours_is_invalid(session, token):
    # Not base64; wrong length; a bool; not a list; a number too large for a float; a text where the time goes
    # and a number where the id goes (PostgreSQL cannot compare them: it was INTERNAL); deep nesting.
    with pytest.raises(InvalidArgument) as e:
        paging.page(session, select(Row), [Row.at, Row.id], 2, token)
    assert e.value.violations[0].field == "page_token"


def test_page_size_bounds():
    assert paging.page_size(0) == paging.PAGE_SIZE and paging.page_size(5000) == paging.MAX_PAGE_SIZE
    with pytest.raises(InvalidArgument) as e:
        paging.page_size(-1)
    assert e.value.violations[0].field == "page_size"


def test_a_client_reads_every_page_as_one_reply():
    from harness.v1 import irm_pb2
    from services.client import all_pages

    pages = {"": (["r1", "r2"], "t2"), "t2": (["r3"], "")}
    asked = []

    def call(request, timeout):  # noqa: ANN001, ANN202 - a ListReservations stand-in
        asked.append((request.page_token, timeout))
        ids, nxt = pages[request.page_token]
        return irm_pb2.ListReservationsResponse(reservations=[irm_pb2.Reservation(id=i) for i in ids],
                                                next_page_token=nxt)

    out = all_pages(call, irm_pb2.ListReservationsRequest(tenant="t"), "reservations")
    assert [r.id for r in out.reservations] == ["r1", "r2", "r3"] and out.next_page_token == ""
    assert asked == [("", 30.0), ("t2", 30.0)]
