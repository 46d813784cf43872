"""Generate the Python gRPC stubs in `omru/v1` from `protos/omru/v1/*.proto`.

Run as `python -m omru.protogen` (what `make protos` does). The protos live
under `protos/` with the import path `omru/v1/...`, so protoc writes modules
that import each other as `omru.v1.xxx_pb2`: the package the stubs live in.
`generate(out_root)` writes into any directory (the test that proves the
committed stubs current regenerates into a temporary one and compares).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
PACKAGE_DIR = Path("omru") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """The .proto files of package omru.v1, relative to proto_root, sorted."""
    return sorted(p.relative_to(proto_root) for p in (proto_root / PACKAGE_DIR).glob("*.proto"))


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Write the stubs under out_root/omru/v1; returns the files written."""
    import grpc_tools
    from grpc_tools import protoc

    out_root = Path(out_root)
    (out_root / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    files = proto_files(proto_root)
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_root / PACKAGE_DIR}")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *[str(f) for f in files],
    ]
    rc = protoc.main(argv)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}")
    return sorted(generated_files(out_root / PACKAGE_DIR))


def generated_files(package_dir: Path) -> list[Path]:
    """The generated modules in a package directory."""
    return [p for p in Path(package_dir).iterdir() if p.name.endswith(GENERATED_SUFFIXES)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omru.protogen", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="root to write omru/v1 under (default: the repo)")
    args = parser.parse_args(argv)
    package_dir = args.out / PACKAGE_DIR
    if package_dir.is_dir():
        for stale in generated_files(package_dir):
            stale.unlink()
    written = generate(args.out)
    init = package_dir / "__init__.py"
    if not init.exists():
        init.write_text('"""Generated gRPC stubs of package omru.v1 (`make protos`)."""\n')
    for path in written:
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
