"""The Lighthouse: one gRPC server that forms every step's quorum, hands out each quorum's rank
addresses, and counts the commit votes. torchft's design (src/lighthouse.rs), on the package's
gRPC: every call carries the token (comm/auth.py's interceptor refuses any other).

Its four calls (JSON bodies; control-plane facts only, never arrays):
    Heartbeat {replica_id, leaving}          -> {}
    Quorum    {replica_id, step, errored}    -> {quorum_id, members: [[replica_id, step], ...]}
    Connect   {quorum_id, replica_id, address} -> {addresses}   one per rank, once all are in
    Commit    {quorum_id, replica_id, step, ok}  -> {commit}    true iff every member voted ok
Each waits with a deadline; a member whose heartbeat stops ends every wait that needs it.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from concurrent import futures

import grpc

from ...comm.auth import TOKEN_KEY, TokenInterceptor, channel
from ...comm.errors import CollectiveTimeout, RankFailure
from ...comm.transports.grpc.communicator import SERVER_OPTIONS, target
from .quorum import Quorum, alive, quorum

SERVICE = "allreduce_edu.Lighthouse"
METHODS = ("Heartbeat", "Quorum", "Connect", "Commit")


#: every call's fields and their types, checked before a call touches any state (issue 37: one
#: numeric replica_id once broke every quorum); a field marked optional may be left out
FIELDS = {
    "Heartbeat": {"replica_id": str, "leaving": (bool, "optional")},
    "Quorum": {"replica_id": str, "step": int, "errored": (bool, "optional")},
    "Connect": {"quorum_id": int, "replica_id": str, "address": str},
    "Commit": {"quorum_id": int, "replica_id": str, "step": int, "ok": bool},
}
MAX_ID = 256  # characters in a replica id or an address


def encode(body: dict) -> bytes:
    return json.dumps(body).encode()


def decode(data: bytes):
    """A request's JSON body; the reason it is not one, as a string, if it is not."""
    try:
        return json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as e:
        return f"not a JSON body ({e})"


def invalid(name: str, request) -> str:
    """Why `request` breaks call `name`'s contract (FIELDS), or "" if it keeps it."""
    if isinstance(request, str):
        return request
    if not isinstance(request, dict):
        return f"the body is a {type(request).__name__}, not an object"
    fields = FIELDS[name]
    unknown = sorted(set(request) - set(fields))
    if unknown:
        return f"unknown field(s) {', '.join(unknown)}"
    for field, rule in fields.items():
        kind, optional = rule if isinstance(rule, tuple) else (rule, False)
        if field not in request:
            if not optional:
                return f"{field} is missing"
            continue
        value = request[field]
        if type(value) is not kind:  # bool is an int in Python: exact types only
            return f"{field} must be {kind.__name__}, got {type(value).__name__} {value!r:.40}"
        if kind is str and not 0 < len(value) <= MAX_ID:
            return f"{field} must be 1 to {MAX_ID} characters"
        if kind is int and value < 0:
            return f"{field} must be >= 0, got {value}"
    return ""


class Lighthouse:
    """Forms quorums of replicas that heartbeat (see quorum.quorum); serves on `host`.

    A quorum forms at once when every member of the last one asked again (fast), when every
    replica heartbeating asked, or `join_timeout` seconds after the first asked (stragglers wait
    for the next step). A replica that reports an error gets a fresh world: the next quorum id.
    `rule` is the quorum rule (quorum.quorum's signature): a learner's own, in lesson 15.
    """

    def __init__(self, min_replicas: int = 1, heartbeat_timeout: float = 0.5,
                 join_timeout: float | None = None, token: str | None = None,
                 host: str = "127.0.0.1", rule=quorum):
        self.min_replicas, self.heartbeat_timeout = min_replicas, heartbeat_timeout
        self.rule = rule
        self.join_timeout = 3 * heartbeat_timeout if join_timeout is None else join_timeout
        self.token = token or secrets.token_hex(16)
        self.history: list[tuple[float, Quorum]] = []  # (time.monotonic(), quorum) as formed
        self._cond = threading.Condition()
        self._heartbeats: dict[str, float] = {}
        self._joined: dict[str, tuple[int, bool, float]] = {}  # id -> (step, errored, since)
        self._answers: dict[str, dict] = {}  # id -> the quorum reply waiting for it
        self._previous: Quorum | None = None
        self._members: dict[int, tuple[str, ...]] = {}  # quorum id -> its members
        self._gathers: dict[tuple, dict[str, object]] = {}  # (kind, quorum id, ...) -> values
        self._decided: dict[tuple, dict | None] = {}  # the first outcome of each gather, kept
        # a thread per waiting call: every replica may wait in Quorum and heartbeat at once
        self._serving = futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="lighthouse")
        self._server = grpc.server(self._serving, interceptors=[TokenInterceptor(self.token)],
                                   options=SERVER_OPTIONS)
        serves = {"Heartbeat": self._serve_heartbeat, "Quorum": self._serve_quorum,
                  "Connect": self._serve_connect, "Commit": self._serve_commit}
        handlers = {name: grpc.unary_unary_rpc_method_handler(
            self._checked(name, serves[name]), decode, encode) for name in METHODS}
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE,
                                                                                    handlers)])
        port = self._server.add_insecure_port(target(host, 0))
        if not port:
            raise OSError(f"the Lighthouse could not bind {host}")
        self.address = target(host, port)
        self._closed = threading.Event()
        self._server.start()
        # forms quorums as time passes, too
        self._ticker = threading.Thread(target=self._tick, name="lighthouse-tick", daemon=True)
        self._ticker.start()

    def __enter__(self) -> Lighthouse:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving (waits already running are answered with UNAVAILABLE)."""
        self._closed.set()
        self._server.stop(grace=0.2).wait(2)
        self._serving.shutdown(wait=True, cancel_futures=True)  # grpc's stop leaves them idle
        self._ticker.join(2)

    def _checked(self, name: str, serve):
        """Call `name`'s handler `serve`, once its request keeps the contract (else
        INVALID_ARGUMENT)."""

        def handler(request, context):
            why = invalid(name, request)
            if why:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {why}")
            return serve(request, context)
        return handler

    # --- the rule, applied ----------------------------------------------------------------
    def _tick(self) -> None:
        while not self._closed.wait(self.heartbeat_timeout / 10):
            with self._cond:
                self._try_form()
                self._cond.notify_all()

    def _try_form(self) -> None:
        """Form a quorum of the replicas waiting, if the rule gives one and it is time (locked)."""
        now = time.monotonic()
        q = self.rule(dict(self._heartbeats), self._previous, self.min_replicas,
                      set(self._joined), now, self.heartbeat_timeout)
        if q is None:
            return
        healthy = alive(self._heartbeats, now, self.heartbeat_timeout)
        fast = self._previous is not None and set(self._previous.members) <= set(self._joined)
        first = min(since for _, _, since in self._joined.values())
        if not (fast or healthy <= set(self._joined) or now - first >= self.join_timeout):
            return
        if q == self._previous and any(self._joined[m][1] for m in q.members):
            q = Quorum(q.quorum_id + 1, q.members)  # an error: same members, a fresh world
        members = [[m, self._joined[m][0]] for m in q.members]
        for m in q.members:
            self._answers[m] = {"quorum_id": q.quorum_id, "members": members}
            del self._joined[m]
        self._previous, self._members[q.quorum_id] = q, q.members
        self.history.append((now, q))
        for old in [k for k in self._gathers if k[1] < q.quorum_id - 2]:  # keep recent ones
            self._gathers.pop(old, None)
            self._decided.pop(old, None)
        self._cond.notify_all()

    def _beat(self, replica_id: str) -> None:
        self._heartbeats[replica_id] = time.monotonic()

    # --- the calls ------------------------------------------------------------------------
    def _serve_heartbeat(self, request, context):
        with self._cond:
            if request.get("leaving"):
                self._heartbeats.pop(request["replica_id"], None)
                self._joined.pop(request["replica_id"], None)
            else:
                self._beat(request["replica_id"])
            self._cond.notify_all()
        return {}

    def _serve_quorum(self, request, context):
        rid, deadline = request["replica_id"], time.monotonic() + _remaining(context)
        with self._cond:
            self._beat(rid)
            self._answers.pop(rid, None)  # a reply it never read (it gave up) is stale
            self._joined[rid] = (int(request["step"]), bool(request.get("errored")),
                                 time.monotonic())
            while rid not in self._answers:
                self._try_form()
                if rid in self._answers:
                    break
                if time.monotonic() >= deadline or self._closed.is_set():
                    self._joined.pop(rid, None)
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"no quorum for {rid}: {self._why_not()}")
                self._cond.wait(min(0.05, max(deadline - time.monotonic(), 0.001)))
            return self._answers.pop(rid)

    def _serve_connect(self, request, context):
        values = self._gather(("connect", request["quorum_id"]), request, request["address"],
                              context)
        members = self._members[request["quorum_id"]]
        return {"addresses": [values[m] for m in members]}

    def _serve_commit(self, request, context):
        key = ("commit", request["quorum_id"], int(request["step"]))
        votes = self._gather(key, request, bool(request["ok"]), context, veto=False)
        return {"commit": votes is not None and all(votes.values())}

    def _gather(self, key: tuple, request: dict, value, context, veto=None):
        """Wait until every member of the quorum gave its value for `key`; the outcome is decided
        once, for every caller (a member gone or a `veto` value decides None: no commit)."""
        rid, deadline = request["replica_id"], time.monotonic() + _remaining(context)
        with self._cond:
            self._beat(rid)
            members = self._members.get(key[1], ())
            if rid not in members:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{rid} is not a member of quorum {key[1]} ({', '.join(members)})")
            got = self._gathers.setdefault(key, {})
            got[rid] = value
            while key not in self._decided:
                now = time.monotonic()
                gone = [m for m in members if m not in got
                        and now - self._heartbeats.get(m, -1e9) >= self.heartbeat_timeout]
                if len(got) == len(members):
                    self._decided[key] = dict(got)
                elif gone or (veto is not None and veto in got.values()):
                    self._decided[key] = None
                elif now >= deadline or self._closed.is_set():
                    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"{key[0]} of quorum {key[1]}: no word from "
                                  f"{', '.join(m for m in members if m not in got)}")
                else:
                    self._cond.wait(min(0.05, max(deadline - now, 0.001)))
            self._cond.notify_all()
            decided = self._decided[key]
        if decided is None and key[0] == "connect":
            context.abort(grpc.StatusCode.ABORTED, f"quorum {key[1]} lost a member while "
                                                   f"connecting; ask for a new quorum")
        return decided

    def _why_not(self) -> str:
        now = time.monotonic()
        healthy = alive(self._heartbeats, now, self.heartbeat_timeout)
        return (f"{len(self._joined)} replica(s) asked ({', '.join(sorted(self._joined))}), "
                f"{len(healthy)} heartbeat; a quorum needs {self.min_replicas} and more than "
                f"half of those heartbeating")


def _remaining(context) -> float:
    """Seconds the caller will wait for this answer (its deadline), at most a minute."""
    remaining = context.time_remaining()
    return 60.0 if remaining is None else min(max(remaining - 0.05, 0.0), 60.0)


class LighthouseClient:
    """A replica's calls to the Lighthouse at `address`; a failed call raises RankFailure
    (or CollectiveTimeout past its deadline) naming what it waited for."""

    def __init__(self, address: str, token: str, replica_id: str):
        self.address, self.replica_id = address, replica_id
        self._metadata = ((TOKEN_KEY, token),)
        self._channel = channel(address)
        self._calls = {name: self._channel.unary_unary(f"/{SERVICE}/{name}",
                                                       request_serializer=encode,
                                                       response_deserializer=decode)
                       for name in METHODS}

    def call(self, name: str, timeout: float, **body) -> dict:
        try:
            return self._calls[name]({"replica_id": self.replica_id, **body}, timeout=timeout,
                                     metadata=self._metadata)
        except grpc.RpcError as e:
            kind = (CollectiveTimeout if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    else RankFailure)
            raise kind(f"{self.replica_id}: the Lighthouse at {self.address} answered "
                       f"{name} with {e.code().name}: {e.details()}") from None

    def close(self) -> None:
        self._channel.close()
