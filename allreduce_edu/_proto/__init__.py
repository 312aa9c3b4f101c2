"""The wire contract: rank.proto (its source is protos/; the wheel carries a copy) and its generated stubs."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def proto_file() -> Path:
    """rank.proto: a clone's protos/ source, else the copy the installed wheel carries beside the stubs."""
    for path in (_HERE.parents[1] / "protos" / "allreduce_edu" / "_proto" / "rank.proto", _HERE / "rank.proto"):
        if path.exists():
            return path
    raise FileNotFoundError(f"rank.proto is neither in a clone's protos/ nor beside {_HERE}: reinstall")
