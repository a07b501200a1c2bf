"""Review 13, WatchJobs memory: `services.watch.Broadcaster`'s per-stream options (a filter asked at publish, one
pending event per key, a backlog of the stream's own), and its defaults left as they were for its other users."""

from __future__ import annotations

from services.watch import Broadcaster


def iter_subs(b: Broadcaster) -> list:
    """The subscribers now (each one's `qsize()`: the events it has pending)."""
    return list(b._subs)


def test_a_stream_is_handed_only_the_events_its_filter_accepts() -> None:
    b: Broadcaster[int] = Broadcaster()
    evens = b.stream_batches(lambda: [0], lambda: True, accept=lambda e: e % 2 == 0)
    everything = b.stream_batches(lambda: [0], lambda: True)
    assert next(evens) == [0] and next(everything) == [0]      # both subscribed; neither reads for a while
    b.publish(range(1, 10_001, 2))                              # 5000 odd events: none is the filtered one's
    assert sorted(s.qsize() for s in iter_subs(b)) == [0, 5000]    # held for the unfiltered stream only
    b.publish([4, 5])
    assert next(evens) == [4]
    assert next(everything)[:2] == [1, 3]
    b.close()


def test_a_keyed_stream_holds_the_latest_event_of_each_key_in_the_place_of_the_first() -> None:
    b: Broadcaster[tuple[str, int]] = Broadcaster()
    stream = b.stream_batches(lambda: [("snap", 0)], lambda: True, key=lambda e: e[0])
    assert next(stream) == [("snap", 0)]
    for i in range(10_000):                     # a stalled watcher: one job changing every period, another twice
        b.publish([("a", i)] + ([("b", i)] if i in (5, 6) else []))
    assert [s.qsize() for s in iter_subs(b)] == [2]
    assert next(stream) == [("a", 9999), ("b", 6)]
    b.publish([("b", 7)])
    assert next(stream) == [("b", 7)]
    b.close()
    assert list(stream) == []


def test_a_stream_past_its_own_backlog_is_cut_off_after_what_it_holds_and_others_go_on() -> None:
    b: Broadcaster[tuple[str, int]] = Broadcaster()              # the default backlog: 100,000
    small = b.stream_batches(lambda: [("snap", 0)], lambda: True, key=lambda e: e[0], max_backlog=2)
    other = b.stream_batches(lambda: [("snap", 0)], lambda: True)
    assert next(small) == [("snap", 0)] and next(other) == [("snap", 0)]
    b.publish([("a", 1), ("a", 2), ("b", 1)])                   # two keys: within its backlog
    b.publish([("c", 1)])                                       # a third key: cut off
    assert list(small) == [[("a", 2), ("b", 1)]]                # what it held, then the end
    assert not b.closed                                         # a caller tells falling behind from shutdown
    b.publish([("d", 1)])
    assert next(other) == [("a", 1), ("a", 2), ("b", 1), ("c", 1), ("d", 1)]     # the others go on
    b.close()


def test_a_filter_that_fails_ends_its_own_stream_only() -> None:
    b: Broadcaster[int] = Broadcaster()

    def bad(e: int) -> bool:
        raise RuntimeError("a bug in a filter")

    broken = b.stream(lambda: [0], lambda: True)
    assert next(broken) == 0
    failing = b.stream_batches(lambda: [0], lambda: True, accept=bad)
    assert next(failing) == [0]
    b.publish([1])                                  # no exception out of publish: the publisher's change stands
    assert list(failing) == []                      # ended
    assert next(broken) == 1
    b.close()


def test_the_defaults_are_unchanged_for_the_other_users() -> None:
    """Without the options every stream gets every event, up to the Broadcaster's backlog (100,000 by default)."""
    b: Broadcaster[int] = Broadcaster(max_backlog=3)
    stream = b.stream(lambda: [0], lambda: True)
    assert next(stream) == 0
    b.publish([1, 1, 2])                            # no key: repeats are kept
    b.publish([3])                                  # one past the backlog: cut off after what it holds
    assert list(stream) == [1, 1, 2]
    assert Broadcaster()._max == 100_000
