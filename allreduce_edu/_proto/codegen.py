"""Regenerate the committed gRPC stubs from protos/: `python -m allreduce_edu._proto.codegen`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOS = ROOT / "protos"
PROTO = "allreduce_edu/_proto/rank.proto"


def generate(out: Path = ROOT) -> list[Path]:
    """Run protoc (from grpcio-tools) on rank.proto; return the files written under `out`."""
    from grpc_tools import protoc  # only needed here: grpcio-tools is a test/dev dependency

    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTOS}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", str(PROTOS / PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTOS / PROTO}")
    stem = out / PROTO.removesuffix(".proto")
    return [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi"), Path(f"{stem}_pb2_grpc.py")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT,
                        help="folder to write allreduce_edu/_proto/ under")
    for path in generate(parser.parse_args(argv).out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
