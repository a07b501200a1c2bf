"""Generate the Python stubs in gen/ from protos/ (the one documented command).

`harness gen-protos` writes them; `harness gen-protos --check` regenerates into
a scratch directory and fails if gen/ differs, which is how CI keeps generated
code from drifting from the protos.
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
GEN = ROOT / "gen"
PACKAGE_INITS = ("harness/__init__.py", "harness/v1/__init__.py")
# Every proto with its comments (source info) and imports: what server reflection serves, so a client with
# reflection alone (grpcurl describe) reads the API's documentation too.
DESCRIPTOR_SET = "harness/v1/api_descriptor_set.binpb"


def proto_files() -> list[Path]:
    return sorted(PROTOS.rglob("*.proto"))


def generate(out: Path) -> None:
    from grpc_tools import protoc  # build-time dependency only

    (out / DESCRIPTOR_SET).parent.mkdir(parents=True, exist_ok=True)
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--pyi_out={out}",
        f"--descriptor_set_out={out / DESCRIPTOR_SET}",
        "--include_source_info",
        "--include_imports",
        *[str(p.relative_to(PROTOS)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; see its messages above")
    for init in PACKAGE_INITS:
        (out / init).write_text('"""Generated from protos/ by `harness gen-protos`; do not edit."""\n')


def generated_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def drift() -> list[str]:
    """Files that differ between gen/ and a fresh generation (empty: in sync)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        want, have = generated_files(fresh), generated_files(GEN)
        problems = [f"missing in gen/: {f}" for f in sorted(want - have)]
        problems += [f"stale file in gen/: {f}" for f in sorted(have - want)]
        problems += [
            f"differs from protos/: gen/{f}"
            for f in sorted(want & have)
            if not filecmp.cmp(fresh / f, GEN / f, shallow=False)
        ]
        return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--check" in argv:
        problems = drift()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run `harness gen-protos` and commit gen/", file=sys.stderr)
        return 1 if problems else 0
    generate(GEN)
    print(f"generated stubs for {len(proto_files())} protos into {GEN}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
