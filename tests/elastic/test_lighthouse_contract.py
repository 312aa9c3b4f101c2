"""The Lighthouse's calls have a contract (elastic.lighthouse.FIELDS): a body that breaks it is
refused with INVALID_ARGUMENT and disturbs nothing (issue 37's third case: one numeric replica_id
killed the quorum-forming thread and failed every honest quorum request after it)."""

from __future__ import annotations

import threading

import grpc
import pytest

from allreduce_edu.comm.auth import TOKEN_KEY
from allreduce_edu.training.elastic import Lighthouse, LighthouseClient
from allreduce_edu.training.elastic.lighthouse import METHODS, SERVICE, invalid


@pytest.mark.parametrize("name, body, why", [
    ("Heartbeat", {"replica_id": 7}, "replica_id must be str, got int"),
    ("Heartbeat", {"replica_id": "a", "leaving": 1}, "leaving must be bool"),
    ("Quorum", {"replica_id": "a", "step": "3"}, "step must be int"),
    ("Quorum", {"replica_id": "a", "step": True}, "step must be int, got bool"),
    ("Quorum", {"replica_id": "a"}, "step is missing"),
    ("Quorum", {"replica_id": "a", "step": -1}, "step must be >= 0"),
    ("Connect", {"replica_id": "a", "quorum_id": 1, "address": ["x"]}, "address must be str"),
    ("Commit", {"replica_id": "a", "quorum_id": 1, "step": 2, "ok": True, "x": 1}, "unknown field(s) x"),
    ("Heartbeat", {"replica_id": ""}, "replica_id must be 1 to"),
    ("Heartbeat", [1, 2], "not an object"),
    ("Heartbeat", "not a JSON body (…)", "not a JSON body"),
])
def test_a_body_that_breaks_the_contract_is_named(name, body, why):
    assert why in invalid(name, body)


def test_good_bodies_keep_the_contract():
    assert not invalid("Quorum", {"replica_id": "r0", "step": 0, "errored": False})
    assert not invalid("Commit", {"replica_id": "r0", "quorum_id": 3, "step": 5, "ok": True})


def _quorum(lighthouse, replica_id, out):
    client = LighthouseClient(lighthouse.address, lighthouse.token, replica_id)
    try:
        out[replica_id] = client.call("Quorum", 10, step=0)
    finally:
        client.close()


def test_a_numeric_replica_id_is_refused_and_honest_quorums_still_form():
    with Lighthouse(min_replicas=2, heartbeat_timeout=1.0) as lighthouse:
        forger = LighthouseClient(lighthouse.address, lighthouse.token, 7)  # a number, not a name
        for name in ("Heartbeat", "Quorum"):
            with pytest.raises(Exception, match="INVALID_ARGUMENT"):
                forger.call(name, 5, **({"step": 0} if name == "Quorum" else {}))
        raw = grpc.insecure_channel(lighthouse.address).unary_unary(f"/{SERVICE}/{METHODS[0]}")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff{", metadata=((TOKEN_KEY, lighthouse.token),), timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
        out = {}
        threads = [threading.Thread(target=_quorum, args=(lighthouse, r, out)) for r in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert sorted(out) == ["a", "b"]
        assert sorted(m[0] for m in out["a"]["members"]) == ["a", "b"]
        forger.close()
