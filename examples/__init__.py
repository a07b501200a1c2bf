"""Example applications, each a directory with app.py, manifest.json and slo.json:
`rtm` (stencil, linear in its input), `deltamerge` (memory-hungry merge),
`option_pricing` (a CPU implementation and an FPGA implementation slot) and `wordcount`
(two modules: a corpus store service and the counting application, store.py + app.py)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent
NAMES = ("rtm", "deltamerge", "option_pricing", "wordcount")


def app_dir(name: str) -> str:
    return str(ROOT / name)


def manifest(name: str) -> str:
    return (ROOT / name / "manifest.json").read_text()


def slo(name: str, **overrides: object) -> str:
    """The example's SLO JSON; keyword overrides replace Parameters (e.g. rows=200 -> "%rows": 200)."""
    data = json.loads((ROOT / name / "slo.json").read_text())
    for k, v in overrides.items():
        data["Parameters"][f"%{k}"] = v
    return json.dumps(data)
