"""services.stream_reader: a response stream read on a thread of its own, as the commands a Ctrl-C may interrupt
read theirs (`harness run`, `harness app profile`)."""

from __future__ import annotations

import threading

import grpc
import pytest

from services.stream_reader import MAX_BUFFERED, StreamReader


class _Failed(grpc.RpcError):
    pass


class _Call:
    """A stream of `n` numbers, then a failure if `fails`; it counts what was read from it."""

    def __init__(self, n: int, fails: bool = False, hold: threading.Event | None = None) -> None:
        self.n, self.fails, self.read, self.cancelled = n, fails, 0, False
        self.hold = hold
        self.at_end = threading.Event()

    def __iter__(self):  # noqa: ANN204
        for i in range(self.n):
            if self.cancelled:
                raise _Failed()
            self.read += 1
            yield i
        self.at_end.set()
        if self.hold is not None:
            self.hold.wait(10)
        if self.fails:
            raise _Failed()

    def cancel(self) -> None:
        self.cancelled = True


def test_it_yields_every_message_in_order_then_ends_or_raises_the_streams_error() -> None:
    assert list(StreamReader(_Call(500)).start()) == list(range(500))
    got = []
    with pytest.raises(_Failed):
        for x in StreamReader(_Call(3, fails=True)).start():
            got.append(x)
    assert got == [0, 1, 2]


def test_a_slow_reader_holds_the_stream_back_rather_than_buffering_it_all() -> None:
    call = _Call(1000)
    messages = iter(StreamReader(call).start())
    assert next(messages) == 0
    # The reader thread stops once MAX_BUFFERED wait (+1: the one it holds while it waits for room).
    from tests.conftest import eventually
    eventually(lambda: call.read == MAX_BUFFERED + 1, what="the reader to stop at the buffer's bound")
    assert not call.at_end.is_set() and call.read == MAX_BUFFERED + 1
    assert list(messages) == list(range(1, 1000))


def test_after_an_interruption_first_finds_the_message_being_handled_and_passes_others_over() -> None:
    hold = threading.Event()
    reader = StreamReader(_Call(5, hold=hold)).start()
    for x in reader:
        if x == 2:
            break           # as a KeyboardInterrupt in the loop's body would leave it: 2 not done with
    assert reader.first(lambda x: x == 2, 5) == 2
    assert reader.first(lambda x: x == 4, 5) == 4       # 3 passed over
    # Nothing more within the wait: None, without waiting for the stream's end.
    assert reader.first(lambda x: True, 0.2) is None
    hold.set()


def test_start_twice_reads_once_and_cancel_ends_a_reader_waiting_for_room() -> None:
    call = _Call(10 * MAX_BUFFERED)
    reader = StreamReader(call).start().start()
    messages = iter(reader)
    assert next(messages) == 0
    reader.cancel()
    assert call.cancelled
    rest = list(messages)   # what was buffered, then the end: no hang
    assert rest == list(range(1, len(rest) + 1)) and len(rest) <= MAX_BUFFERED


def test_a_start_cut_short_by_a_signal_and_made_again_reads_the_call_once(monkeypatch) -> None:
    # A Ctrl-C right after the reader thread started, before start() returned: `harness run` starts it again on its
    # way out. Two readers of one gRPC call fail ("call error 8"); the second must leave the call alone.
    call = _Call(300)
    reader = StreamReader(call)
    real_start = threading.Thread.start
    interrupted: list[bool] = []

    def start_then_interrupted(self):  # noqa: ANN001, ANN202
        real_start(self)
        if not interrupted:
            interrupted.append(True)
            raise KeyboardInterrupt
    monkeypatch.setattr(threading.Thread, "start", start_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        reader.start()
    reader.start()
    assert list(reader) == list(range(300))
    for t in threading.enumerate():
        if t.name == "stream-reader":
            t.join(10)
    assert call.read == 300
