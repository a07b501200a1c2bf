"""Converters from published datasets to the replay format (application_manager.replay).

    python -m application_manager.convert ibm SRC.csv DST.csv

`ibm`: the IBM multi-cloud configuration dataset (CloudBandit, IEEE CLOUD 2022; columns
provider, A_family ... nodes, workload, target_cost, target_runtime, status). Its unnamed
index column is dropped; target_runtime -> runtime_s, target_cost -> cost; the
configuration columns are kept as they are. The data stays where it is: convert to a
path outside the repository.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

IBM_PARAMS = ["provider", "A_family", "A_vcpu", "B_family", "B_vcpu", "C_family", "C_type", "C_vcpu", "nodes"]


def is_ibm(header: list[str]) -> bool:
    return {"target_cost", "target_runtime", "workload"} <= set(header)


def ibm_records(src: str | Path) -> list[dict[str, str]]:
    out = []
    with Path(src).open(newline="") as f:
        for r in csv.DictReader(f):
            row = {"workload": r["workload"], "runtime_s": r["target_runtime"], "cost": r["target_cost"],
                   "status": r.get("status") or "ok"}
            row.update({p: r.get(p, "") for p in IBM_PARAMS})
            out.append(row)
    return out


def convert_ibm(src: str | Path, dst: str | Path) -> int:
    rows = ibm_records(src)
    with Path(dst).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["workload", "runtime_s", "cost", "status", *IBM_PARAMS])
        w.writeheader()
        w.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 3 or argv[0] != "ibm":
        print("usage: python -m application_manager.convert ibm SRC.csv DST.csv", file=sys.stderr)
        return 2
    n = convert_ibm(argv[1], argv[2])
    print(f"wrote {n} runs to {argv[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
