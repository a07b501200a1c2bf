"""An application as the service keeps it parsed (manifest, SLO, search space, the CRS's quotes), and the refusal
of one stored under rules today's checks no longer accept."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from application_manager import models as m
from application_manager.local import LocalBackend
from application_manager.manifest import Manifest
from application_manager.slo import Slo
from application_manager.space import Space
from services.errors import APPLICATION_STALE, FailedPrecondition


@dataclass
class Loaded:
    app: m.Application
    manifest: Manifest
    slo: Slo
    space: Space
    # The CRS's quote per configuration of this `space` (index for index), kept up to `price_ttl_s` from when it
    # was asked (`prices_at`): kept with the space it belongs to, so a space built otherwise (some resource types
    # away) never reads another's prices.
    prices: np.ndarray | None = None
    prices_at: float = 0.0

    def prices_from(self, backend: LocalBackend, now: float, ttl_s: float) -> np.ndarray:
        """The kept quotes if younger than `ttl_s`, else the CRS's now (kept if complete)."""
        if self.prices is not None and now - self.prices_at < ttl_s:
            return self.prices
        prices = backend.prices()
        # A NaN the CRS could not quote now: not kept, a momentary failure would price the space for good. Those
        # a large space leaves unquoted on purpose (LocalBackend.MAX_QUOTES) are kept: asked again, the same.
        if not getattr(backend, "momentary_gaps", bool(np.isnan(prices).any())):
            self.prices, self.prices_at = prices, now
        return prices


class StaleApplication(FailedPrecondition):
    """A stored application today's checks refuse (accepted by an earlier, looser version)."""

    def __init__(self, application_id: str, why: str) -> None:
        super().__init__(f"application {application_id} was accepted by an earlier version of the Application "
                         f"Manager, but its stored manifest or SLO is no longer valid ({why}); submit it again",
                         reason=APPLICATION_STALE)
        self.why = why
