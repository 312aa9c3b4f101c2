"""The wire contract: rank.proto (its source is protos/; the wheel carries a copy) and its stubs."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SOURCE = _HERE.parents[1] / "protos" / "allreduce_edu" / "_proto" / "rank.proto"  # in a clone


def proto_file() -> Path:
    """rank.proto: a clone's protos/ source, else the copy a wheel carries beside the stubs."""
    for path in (_SOURCE, _HERE / "rank.proto"):
        if path.exists():
            return path
    raise FileNotFoundError(f"rank.proto is in neither {_SOURCE.parent} nor {_HERE}: reinstall")
