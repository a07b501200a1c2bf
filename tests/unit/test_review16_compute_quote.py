"""The compute IRM's QuotePrice as its Reserve (review 16): a group no host could ever hold is refused alike, and
unpinned VMs are priced on the host Reserve takes, on SQLite and on a PostgreSQL whose collation is a locale's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from harness.v1 import common_pb2, irm_pb2
from irm_compute.service import ComputeConfig, ComputeIrm
from services.errors import FailedPrecondition

# "B1" < "a1" in code point order (Python, SQLite, PostgreSQL's "C"); "a1" < "B1" in English.
INVENTORY = """hosts:
  - {id: B1, site: s, rack: r, cores: 16, memory_gb: 64, frequency_ghz: 2.0, traits: [ssd]}
  - {id: a1, site: s, rack: r, cores: 32, memory_gb: 32, frequency_ghz: 3.6, traits: [ssd]}
"""


def _group(cores: float = 4, memory_gb: float = 8, **kw: object) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=memory_gb)},
        **kw)  # type: ignore[arg-type]


@pytest.fixture
def english_pg_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database of its own whose default collation is English (ICU), dropped afterwards."""
    name = f"harness_t_{os.urandom(6).hex()}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            try:
                conn.execute(text(f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE_PROVIDER icu "
                                  "ICU_LOCALE 'en'"))
            except DBAPIError as e:
                pytest.skip(f"this PostgreSQL cannot make a database of an ICU collation: {e.orig}")
        try:
            yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _irm(tmp_path: Path, database: str = "") -> ComputeIrm:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    return ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml"),
                                    database=database))


@pytest.fixture(params=["sqlite", "postgresql-en"])
def irm(request, tmp_path: Path) -> Iterator[ComputeIrm]:
    c = _irm(tmp_path, request.getfixturevalue("english_pg_url") if request.param == "postgresql-en" else "")
    yield c
    c.watchers.close()
    c.db.dispose()


def test_an_unpinned_vm_is_quoted_on_the_host_reserve_takes_whatever_the_collation(irm: ComputeIrm) -> None:
    quote = irm.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group()]), None)
    r = irm.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[_group()]), None)
    assert [x.physical_id for x in r.groups[0].resources] == ["B1"]     # both empty: the first by id
    assert r.price_per_minute == pytest.approx(quote.price_per_minute)
    assert quote.price_per_minute == pytest.approx(irm.cost.price_per_minute(4, 8, 2.0))


@pytest.mark.parametrize(("kw", "said"), [
    ({"required_traits": ["gpu"]}, "no host has the requested frequency and traits"),
    ({"forbidden_traits": ["ssd"]}, "no host has the requested frequency and traits"),
    ({"attributes": {"frequency_ghz": common_pb2.AttributeRequest(number=3.0)}},     # within [2, 3.6]: none
     "no host has the requested frequency and traits"),
    ({"cores": 32, "memory_gb": 40}, "no host can ever hold 32 cores / 40 GB"),   # each within range, not together
    # One VM fits, nine never do (4 on each host): the whole request judged, as Reserve does (review 25).
    ({"count": 9}, "can never fit, even on empty hosts: group 'g' asks for 9 VMs"),
])
def test_a_group_no_host_could_ever_hold_is_refused_by_quote_price_as_by_reserve(tmp_path: Path, kw: dict,
                                                                                  said: str) -> None:
    irm = _irm(tmp_path)
    count = kw.pop("count", 1)
    g = _group(kw.pop("cores", 4), kw.pop("memory_gb", 8), **{k: v for k, v in kw.items() if k != "attributes"})
    g.count = count
    for key, value in kw.get("attributes", {}).items():
        g.attributes[key].CopyFrom(value)
    try:
        refusals = []
        for call, request in ((irm.QuotePrice, irm_pb2.QuotePriceRequest(tenant="t", groups=[g])),
                              (irm.Reserve, irm_pb2.ReserveRequest(tenant="t", request_id="r", groups=[g]))):
            with pytest.raises(FailedPrecondition) as e:
                call(request, None)
            refusals.append((e.value.reason, e.value.message))
        assert refusals[0] == refusals[1] and refusals[0][0] == "NEVER_FITS" and said in refusals[0][1], refusals
    finally:
        irm.watchers.close()
        irm.db.dispose()
