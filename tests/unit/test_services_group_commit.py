"""Group commit: many callers share commits, and each caller's failure stays its own."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select
from sqlalchemy.exc import IntegrityError

from services.db import Database

meta = MetaData()
items = Table("items", meta, Column("id", Integer, primary_key=True), Column("name", String, unique=True))


@pytest.fixture
def db(tmp_path):
    d = Database(f"sqlite:///{tmp_path}/g.db")
    meta.create_all(d.engine)
    yield d
    d.dispose()


def test_concurrent_writers_all_land_and_a_failure_is_isolated(db):
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def writer(i: int) -> None:
        barrier.wait()
        for k in range(25):
            name = "dup" if (i, k) in ((3, 7), (9, 11)) else f"w{i}-{k}"
            try:
                db.run(lambda c, n=name: c.execute(insert(items).values(name=n)))
            except IntegrityError as e:
                errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = db.query(lambda c: [r[0] for r in c.execute(select(items.c.name))])
    # Exactly one "dup" won; the loser got IntegrityError; nobody else was affected.
    assert len(errors) == 1
    assert sorted(names) == sorted([f"w{i}-{k}" for i in range(16) for k in range(25)
                                    if (i, k) not in ((3, 7), (9, 11))] + ["dup"])


def test_a_failing_piece_rolls_back_only_its_own_writes(db):
    def half_then_fail(c):  # type: ignore[no-untyped-def]
        c.execute(insert(items).values(name="partial"))
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        db.run(half_then_fail)
    db.run(lambda c: c.execute(insert(items).values(name="after")))
    assert db.query(lambda c: [r[0] for r in c.execute(select(items.c.name))]) == ["after"]


def test_results_are_returned_to_each_caller(db):
    ids = [db.run(lambda c, i=i: c.execute(insert(items).values(name=f"n{i}")).inserted_primary_key[0])
           for i in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5


def test_a_subscriber_that_falls_behind_is_cut_off_not_left_stale():
    from services.watch import Broadcaster

    b: Broadcaster[int] = Broadcaster(max_backlog=2)
    stream = b.stream(lambda: [0], lambda: True)
    assert next(stream) == 0  # snapshot; now subscribed
    b.publish([1, 2, 3])  # overflows: the subscriber is dropped
    b.publish([4])
    assert list(stream) == [1, 2]  # what it had, then the stream ENDS (the watcher reconnects)
