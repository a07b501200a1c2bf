"""Linear VM price per minute (thesis §4.5.1).

price = per_core * cores * (frequency / reference_frequency) + per_gb * GB + base

The thesis derives the coefficients by regression over EC2 prices and scales
core cost by CPU frequency; the reference frequency is its 2.2 GHz testbed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    per_core: float = 0.0396
    per_gb: float = 0.0186
    base: float = 0.0417
    reference_frequency_ghz: float = 2.2

    def price_per_minute(self, cores: float, memory_gb: float, frequency_ghz: float | None = None) -> float:
        scale = (frequency_ghz or self.reference_frequency_ghz) / self.reference_frequency_ghz
        return self.per_core * cores * scale + self.per_gb * memory_gb + self.base
