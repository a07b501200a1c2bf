"""An execution's kept samples and a VM's metrics series merge old samples by the time each stands for: merged
again and again in pairs with a plain mean, the oldest sample's weight halved at each merge (an hour busy for its
first half read 6.6 % over its first 2304 s, truly 78 %; a researcher's review)."""

from __future__ import annotations

import pytest

from irm_compute.sandbox import Sample, decimate, keep_sample, merge_utilisation


def _weighted_mean(samples: list[Sample]) -> float:
    return sum(s.cpu_percent * s.span_s for s in samples) / sum(s.span_s for s in samples)


@pytest.mark.parametrize("n", [7200, 20000])
def test_a_long_runs_kept_samples_keep_the_cpu_of_every_span(n):
    samples: list[Sample] = []
    for i in range(n):      # every 0.5 s: busy for the first half of the run, then idle
        keep_sample(samples, Sample(0.5 * (i + 1), 100.0 if i < n // 2 else 0.0, 1.0, 10.0, 0.5))
    assert len(samples) <= 1024
    assert sum(s.span_s for s in samples) == pytest.approx(0.5 * n)
    assert _weighted_mean(samples) == pytest.approx(50.0)
    # The first kept sample stands for [0, its time]: its CPU is the busy share of that span.
    first = samples[0]
    assert first.span_s == pytest.approx(first.time)
    assert first.cpu_percent == pytest.approx(100.0 * min(1.0, (0.5 * (n // 2)) / first.time))


def test_a_vm_series_decimated_keeps_each_points_weight():
    samples: list[Sample] = []
    for i in range(6000):
        keep_sample(samples, Sample(0.5 * (i + 1), 100.0 if i < 3000 else 0.0, 1.0, 10.0, 0.5))
    merged = merge_utilisation([(samples, None)])
    series = decimate(merged, 100)
    assert len(series) <= 100 and _weighted_mean(series) == pytest.approx(50.0)


@pytest.mark.parametrize(("tail", "memory"), [
    (b"Traceback (most recent call last):\n  File \"a.py\", line 1\nMemoryError\n", True),
    (b"  x = np.ones(10**12)\nnumpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.28 TiB\n", True),
    (b"terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n", True),
    (b'Exception in thread "main" java.lang.OutOfMemoryError: Java heap space\n', True),
    (b"malloc: Cannot allocate memory\n", True),
    (b"bash: fork: Cannot allocate memory\nmore output\n", True),
    # Not a program running out of memory: the words elsewhere (a review's finding).
    (b"FAILED tests/test_cache.py::test_evicts_on_MemoryError - assert 1 == 2\n", False),
    (b"rsync: connect: Cannot allocate memory (remote side)\n", False),
    (b"MemoryError\n" + b"line\n" * 20, False),          # long before the end: something else ended it
])
def test_a_failure_is_put_down_to_memory_only_when_its_last_lines_say_so(tail, memory):
    from irm_compute.sandbox import MEMORY_LIMIT_EXCEEDED, exit_reason
    assert (exit_reason(None, 1, 20, 2048, tail) == MEMORY_LIMIT_EXCEEDED) is memory
    assert exit_reason(None, 0, 20, 2048, tail) == ""          # a run that finished well stands
