"""Every value a learner passes, checked before any work starts: one table of rules that the API
(Cluster, launch/init) and the command line share. Each rule returns the value, converted, or raises
ValueError naming the argument and the rule in one line; `allreduce-edu` turns that into a usage
error (exit status 2) before a rank starts.

    rules.check("timeout", float("inf"))      # ValueError: timeout must be finite, ...
    RULES                                     # argument -> (rule, what it says)
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from pathlib import Path

from ..comm.wire import MAX_MESSAGE_BYTES
from ..model.links import Link, Links
from .osfacts import available_bytes

MOST_SECONDS = 24 * 3600.0  # a wait longer than a day is a typo (and `inf` overflows the clocks)
MOST_LINK_ALPHA = 10.0  # an emulated message slower than this never finishes within a lesson
LEAST_LINK_RATE = 1e3  # bytes/s: below this, one KiB takes a second
_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"  # one part of a host name (RFC 1123; _ as Docker's)
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?")


def seconds(name: str, value, most: float = MOST_SECONDS) -> float:
    """A time in seconds: a number, finite, > 0 and at most `most`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(number) and 0 < number <= most):
        raise ValueError(f"{name} must be finite, > 0 and at most {most:g} seconds, got {value!r}")
    return number


def port(name: str, value) -> int:
    """A TCP port: an integer from 0 (any free one) to 65535."""
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise ValueError(f"{name} must be a port number from 0 to 65535, got {value!r}")
    number = int(str(value).strip())
    if number > 65535:
        raise ValueError(f"{name} must be a port number from 0 to 65535, got {number}")
    return number


def host(name: str, value) -> str:
    """An address to listen on or dial: an IPv4/IPv6 address or a host name, returned as given
    (an IPv6 address with or without brackets: grpc.communicator.target adds them to HOST:PORT)."""
    text = str(value).strip().strip("[]") if isinstance(value, str) else ""
    looks_numeric = bool(re.fullmatch(r"[\d.]+", text)) or ":" in text
    try:
        if looks_numeric:
            ipaddress.ip_address(text)
        elif not _HOSTNAME.fullmatch(text):
            raise ValueError
    except ValueError:
        raise ValueError(f"{name} must be an IP address or a host name, got {value!r}") from None
    return value.strip()


def in_the_clear(host: str, tls) -> str:
    """Why listening on `host` without TLS exposes the cluster ("" on loopback, or with TLS): its
    token and every message would cross the network unencrypted."""
    bare = str(host).strip().strip("[]")
    try:
        inside = bare == "localhost" or ipaddress.ip_address(bare).is_loopback
    except ValueError:
        inside = False
    if inside or tls:
        return ""
    return (f"ranks listen on {host} without TLS: the cluster's token and every message cross "
            f"the network unencrypted; beyond a network you trust, give them TLS (Cluster(tls=) "
            f"or allreduce-edu launch --tls-cert/--tls-key)")


def address(name: str, value) -> tuple[str, int]:
    """HOST:PORT, as a rendezvous is given (":PORT": the host is left to the caller, "")."""
    text = str(value)
    where, colon, number = text.rpartition(":")
    if not colon:
        raise ValueError(f"{name} must be HOST:PORT, e.g. 127.0.0.1:29500, got {value!r}")
    if ":" in where and not (where.startswith("[") and where.endswith("]")):  # fe80::1:2?
        raise ValueError(f"{name}: write an IPv6 address in brackets, [ADDRESS]:PORT, e.g. "
                         f"[::1]:29500, got {value!r}")
    return (host(name, where).strip("[]") if where else ""), port(name, number)


def link(name: str, value: Link) -> Link:
    """An emulated link a lesson can wait for: α at most MOST_LINK_ALPHA s, bandwidth at least
    LEAST_LINK_RATE bytes/s, both finite."""
    if not (math.isfinite(value.alpha) and value.alpha <= MOST_LINK_ALPHA):
        raise ValueError(f"{name}: a link's latency must be finite and at most "
                         f"{MOST_LINK_ALPHA:g} s, got {value.alpha:g} s")
    if not (math.isfinite(value.beta) and value.beta <= 1 / LEAST_LINK_RATE):
        raise ValueError(f"{name}: a link's bandwidth must be at least {LEAST_LINK_RATE:g} B/s, "
                         f"got {1 / value.beta if value.beta else math.inf:g} B/s")
    return value


def links(name: str, value) -> Links | None:
    """None, a Links, or "ALPHA,BANDWIDTH" text (one link between every pair of ranks)."""
    if value is None:
        return None
    if isinstance(value, str):
        alpha, comma, rate = value.partition(",")
        if not comma:
            raise ValueError(f"{name} must be ALPHA,BANDWIDTH, e.g. 10ms,100MB/s, got {value!r}")
        try:
            value = Links.flat(alpha, rate)
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{name}: {e}") from None
    if not isinstance(value, Links):
        raise ValueError(f"{name} must be a Links (allreduce_edu.model.links) or text like "
                         f"'10ms,100MB/s', got {type(value).__name__} {value!r}")
    link(name, value.intra)
    link(name, value.inter)
    return value


def message_bytes(name: str, nbytes: int, world_size: int) -> int:
    """A message every rank holds about three copies of (input, result, what is in flight):
    within what one rank accepts and what this machine's free memory holds for `world_size`
    ranks."""
    if nbytes > MAX_MESSAGE_BYTES:
        raise ValueError(f"{name} {nbytes} bytes is more than one rank accepts "
                         f"({MAX_MESSAGE_BYTES} bytes)")
    free = available_bytes()
    need = 3 * nbytes * world_size
    if free is not None and need > 0.8 * free:
        raise ValueError(f"{name} {nbytes} bytes on {world_size} ranks needs about "
                         f"{need / 2**30:.1f} GiB, more than this machine's "
                         f"{free / 2**30:.1f} GiB of memory available holds")
    return nbytes


def new_file(name: str, value) -> Path:
    """A file to write at the end: its folder exists and can be written, and it is no folder."""
    path = Path(value)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise ValueError(f"{name} {str(value)!r} cannot be written: "
                         + ("it is a folder" if path.is_dir() else
                            f"no folder {str(folder)!r}" if not folder.is_dir() else
                            f"the folder {str(folder)!r} is not writable"))
    return path


def folder(name: str, value) -> Path:
    """A folder to write into: it is one (or can be made in a writable folder), and writable."""
    path = Path(value)
    parent = next((p for p in [path, *path.parents] if p.exists()), Path("."))
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {str(value)!r} is a file, not a folder")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"{name} {str(value)!r} cannot be written: {str(parent)!r} is not a "
                         f"writable folder")
    return path


RULES = {  # argument -> its rule; the API's and the command line's names side by side
    "timeout": seconds, "--timeout": seconds, "--rendezvous-timeout": seconds,
    "host": host, "--host": host,
    "--rendezvous": address,
    "links": links, "--links": links,
    "-b": message_bytes, "-e": message_bytes,
    "--json": new_file,
    "lessons DIR": folder,
}


def check(name: str, value, *args):
    """`value` once RULES[name] has passed it (converted), else ValueError naming `name`."""
    return RULES[name](name, value, *args)
