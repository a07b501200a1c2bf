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


@pytest.mark.parametrize("token", ["not-a-token!!", "W10=", "WzEsIDIsIDNd", "WyJ4IiwgdHJ1ZV0=", "eyJhIjogMX0="])
def test_a_token_that_is_not_ours_is_invalid(session, token):
    # Not base64; [] ; [1, 2, 3] (wrong length); ["x", true] (a bool); {"a": 1} (not a list).
    with pytest.raises(InvalidArgument) as e:
        paging.page(session, select(Row), [Row.at, Row.id], 2, token)
    assert e.value.violations[0].field == "page_token"


def test_page_size_bounds():
    assert paging.page_size(0) == paging.PAGE_SIZE and paging.page_size(5000) == paging.MAX_PAGE_SIZE
    with pytest.raises(InvalidArgument) as e:
        paging.page_size(-1)
    assert e.value.violations[0].field == "page_size"
