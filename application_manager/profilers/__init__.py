"""Profilers by name: each a pure, seeded strategy behind application_manager.profilers.base.Profiler."""

from __future__ import annotations

from application_manager.profilers.base import (
    BENCHMARK,
    PRODUCTION,
    History,
    Observation,
    Profiler,
    Proposal,
    whitebox_hints,
)
from application_manager.profilers.blackbox import SimulatedAnnealing, Uniform
from application_manager.profilers.extrapolated import Extrapolated
from application_manager.profilers.model_based import ModelBased
from application_manager.profilers.whitebox import DirectedAnnealing, UtilisationDriven

PROFILERS: dict[str, type[Profiler]] = {
    p.name: p for p in (Uniform, SimulatedAnnealing, UtilisationDriven, DirectedAnnealing, Extrapolated, ModelBased)
}

__all__ = ["BENCHMARK", "PRODUCTION", "PROFILERS", "History", "Observation", "Profiler", "Proposal", "whitebox_hints"]
