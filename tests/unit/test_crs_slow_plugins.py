"""A slow placement plug-in is named in the CRS's log: placements run one at a time, so it delays every request."""

from __future__ import annotations

import logging

from cross_resource_scheduler import service as crs_service
from harness.v1 import irm_pb2
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_service_parse import _group

SLOW = "tests.crs_plugin_examples:AvoidHostA"


def test_a_slow_placement_names_the_plug_ins_share_once_a_minute(tmp_path, caplog, monkeypatch) -> None:
    crs = make_crs(tmp_path, filters=["capacity", SLOW],
                   weighers={"pack": 1.0, "tests.crs_plugin_examples:PreferHostC": 1.0})
    monkeypatch.setattr(crs_service, "SLOW_PLACEMENT_S", 0.0)   # every placement counts as slow here
    crs._quote = lambda tenant, groups, placement, consequence="": irm_pb2.QuotePriceResponse()  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger=crs_service.log.name):
            for _ in range(3):
                crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)
        said = [r for r in caplog.records if "a placement took" in r.getMessage()]
        assert len(said) == 1                                # at most once a minute
        assert set(said[0].plugins) == {"avoid_a", "prefer_c"} and all(s >= 0 for s in said[0].plugins.values())
        assert "placements run one at a time" in said[0].getMessage()
        # Counted afresh after each placement: nothing left over from the three.
        assert crs.pipeline.take_spent() == {"avoid_a": 0.0, "prefer_c": 0.0}
    finally:
        crs.db.dispose()


def test_a_quick_placement_or_one_without_plug_ins_says_nothing(tmp_path, caplog) -> None:
    crs = make_crs(tmp_path)
    crs._quote = lambda tenant, groups, placement, consequence="": irm_pb2.QuotePriceResponse()  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger=crs_service.log.name):
            crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None)
        assert not [r for r in caplog.records if "a placement took" in r.getMessage()]
    finally:
        crs.db.dispose()
