"""`harness bench`: its help names the benchmarks (a researcher learned them only from a wrong name), and a wrong
name is refused with the list, exit status 2."""

from __future__ import annotations

import pytest

from services import cli

BENCHMARKS = ["autoscaler", "crs", "fpga-elasticity", "fpga-overhead", "policies", "profilers"]


def test_the_help_names_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"one of: {', '.join(BENCHMARKS)}" in said


@pytest.mark.parametrize("name", ["nope", "_common", "__init__"])
def test_an_unknown_benchmark_is_refused_with_the_list(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", name]) == 2
    assert f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}" in capsys.readouterr().err
