"""Fixtures of the job-manager tests over the fake Orchestrator (`tests.integration.fake_orchestrator`)."""

from __future__ import annotations

import pytest

from tests.integration.fake_orchestrator import Irm


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    return request.getfixturevalue("fresh_pg_url")


@pytest.fixture
def irm_factory(db_url):
    made: list[Irm] = []

    def make(policy: str, **kw) -> Irm:
        made.append(Irm(db_url, policy, **kw))
        return made[-1]

    yield make
    for i in made:
        i.close()
