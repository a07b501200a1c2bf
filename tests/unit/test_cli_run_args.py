"""`harness run`'s own options are checked before anything is sent."""

from __future__ import annotations

import pytest

from services import cli


def test_an_env_option_without_a_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "res-1", "--env", "FOO", "--", "true"])
    assert e.value.code == 2
    assert "--env: 'FOO': expected NAME=VALUE" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["run", "res-1", "--env", "A=1=2", "--env", "B="])
    assert dict(args.env) == {"A": "1=2", "B": ""}
