"""Group commit: many callers share commits, and each caller's failure stays its own; prepared statements."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, InvalidRequestError

from services.db import Database, Prepared

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


def test_run_all_commits_pieces_together_and_isolates_failures(db):
    _run_all_isolates_failures(db)


def test_run_all_on_postgresql_is_one_transaction_and_isolates_failures(fresh_pg_url):
    from sqlalchemy import event

    d = Database(fresh_pg_url)
    try:
        meta.create_all(d.engine)
        commits: list[int] = []
        event.listen(d.engine, "commit", lambda conn: commits.append(1))
        run_all = d.run_all

        def counted(fns):  # type: ignore[no-untyped-def]
            before = len(commits)
            out = run_all(fns)
            assert len(commits) - before == 1  # one commit (one WAL flush) for the pieces, not one each
            return out

        d.run_all = counted  # type: ignore[method-assign]
        _run_all_isolates_failures(d)
    finally:
        d.dispose()


def test_run_all_on_postgresql_when_the_commit_fails_nothing_stands(fresh_pg_url):
    from sqlalchemy import event

    d = Database(fresh_pg_url)
    try:
        meta.create_all(d.engine)
        d.run(lambda c: c.execute(insert(items).values(name="taken")))

        def refuse(conn):  # type: ignore[no-untyped-def]
            raise RuntimeError("the server went away while committing")

        event.listen(d.engine, "commit", refuse)
        out = d.run_all([lambda c: c.execute(insert(items).values(name="a")),
                         lambda c: c.execute(insert(items).values(name="taken"))])
        event.remove(d.engine, "commit", refuse)
        assert [ok for ok, _ in out] == [False, False]
        assert isinstance(out[0][1], RuntimeError)  # its work was lost with the commit
        assert isinstance(out[1][1], IntegrityError)  # it failed by itself: its own error
        assert d.query(lambda c: [r[0] for r in c.execute(select(items.c.name))]) == ["taken"]
    finally:
        d.dispose()


def _run_all_isolates_failures(db: Database) -> None:
    def fail(c):  # type: ignore[no-untyped-def]
        c.execute(insert(items).values(name="half"))
        raise ValueError("boom")

    out = db.run_all([lambda c: c.execute(insert(items).values(name="a")).inserted_primary_key[0],
                      fail,
                      lambda c: c.execute(insert(items).values(name="a")),  # duplicate of the first
                      lambda c: c.execute(insert(items).values(name="b")).inserted_primary_key[0]])
    assert [ok for ok, _ in out] == [True, False, False, True]
    assert isinstance(out[1][1], ValueError) and isinstance(out[2][1], IntegrityError)
    assert sorted(db.query(lambda c: [r[0] for r in c.execute(select(items.c.name))])) == ["a", "b"]


def test_run_all_from_many_threads_each_gets_its_own_outcomes(db):
    results: dict[int, list] = {}
    barrier = threading.Barrier(8)

    def caller(i: int) -> None:
        barrier.wait()
        results[i] = db.run_all([lambda c, k=k: c.execute(insert(items).values(name=f"{i}-{k}")).rowcount
                                 for k in range(10)] + [lambda c: c.execute(insert(items).values(name="same"))])

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(out[:10] == [(True, 1)] * 10 for out in results.values())
    assert sum(out[10][0] for out in results.values()) == 1  # exactly one "same" landed
    assert db.query(lambda c: c.execute(select(func.count()).select_from(items)).scalar()) == 81


# -- Prepared: statements compiled once, run on the driver's cursor ---------------

things = Table("things", meta, Column("id", String, primary_key=True), Column("n", Integer),
               Column("tags", JSON), Column("blob", LargeBinary), Column("on", Boolean), Column("x", Float))
P_ADD = Prepared(insert(things), columns=["id", "n", "tags", "blob", "on", "x"])
P_GET = Prepared(select(things).where(things.c.id == bindparam("id")))
P_BUMP = Prepared(update(things).where(things.c.id == bindparam("id"), things.c.n < bindparam("limit"))
                  .values(n=things.c.n + 1, on=True).returning(things.c.n, things.c.on))


def _prepared_behaves_as_core(d: Database) -> None:
    meta.create_all(d.engine)
    row = {"id": "a", "n": 1, "tags": ["x", {"k": 2}], "blob": b"\x00\x01", "on": False, "x": 1.5}
    d.run(lambda c: P_ADD.execute(c, row))
    assert d.fetch(P_GET, {"id": "a"}) == [row]
    assert d.query(lambda c: dict(c.execute(P_GET.stmt, {"id": "a"}).mappings().one())) == row  # Core reads it alike
    assert d.run(lambda c: P_BUMP.all(c, {"id": "a", "limit": 2})) == [(2, True)]
    assert d.run(lambda c: P_BUMP.first(c, {"id": "a", "limit": 2})) is None  # the condition now fails
    d.run(lambda c: P_ADD.executemany(c, [{**row, "id": "b"}, {**row, "id": "c", "tags": None}]))
    assert d.fetch(P_GET, {"id": "c"})[0]["tags"] is None
    with pytest.raises(IntegrityError):  # driver errors come back as SQLAlchemy's
        d.run(lambda c: P_ADD.execute(c, row))
    with pytest.raises(InvalidRequestError, match="limit"):
        d.run(lambda c: P_BUMP.all(c, {"id": "a"}))
    assert d.fetch(P_GET, {"id": "nope"}) == []


def test_prepared_statements_on_sqlite(db):
    _prepared_behaves_as_core(db)


def test_prepared_statements_on_postgresql(fresh_pg_url):
    d = Database(fresh_pg_url)
    try:
        _prepared_behaves_as_core(d)
    finally:
        d.dispose()


def test_a_lone_statement_commits_by_itself_and_a_lone_failure_leaves_no_transaction(db, tmp_path):
    import sqlite3

    ins = Prepared(insert(items), columns=["id", "name"])
    assert db.execute(ins, {"id": 1, "name": "a"}) == 1
    # Committed when execute returns: another connection sees it at once.
    other = sqlite3.connect(f"{tmp_path}/g.db")
    assert other.execute("SELECT name FROM items").fetchall() == [("a",)]
    with pytest.raises(IntegrityError):
        db.execute(ins, {"id": 2, "name": "a"})  # duplicate name
    raw = db._committer._conn.connection.driver_connection
    assert not raw.in_transaction and not db._committer._conn.in_transaction()
    assert db.execute(ins, {"id": 3, "name": "c"}) == 1
    assert sorted(r[0] for r in other.execute("SELECT name FROM items")) == ["a", "c"]
    other.close()


def test_a_lone_statement_through_sqlalchemy_is_committed_too(db, tmp_path):
    import sqlite3

    db._committer.submit(lambda c: c.execute(insert(items).values(name="z")), single_statement=True)
    assert not db._committer._conn.in_transaction()
    other = sqlite3.connect(f"{tmp_path}/g.db")
    assert other.execute("SELECT name FROM items").fetchall() == [("z",)]
    other.close()
