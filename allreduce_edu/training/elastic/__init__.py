"""Fault-tolerant training, torchft style: a quorum every step, re-formed worlds, healing.

    Lighthouse(min_replicas=2, heartbeat_timeout=0.5)   # forms quorums, counts the votes
    Manager(replica_id, lighthouse.address, token, state_dict, load_state_dict)
    quorum(heartbeats, previous, min_replicas, joined, now, heartbeat_timeout)   # the rule
    heal_plan(steps)                                    # who sends state to whom
    run_chaos(...), run_restart(...)                    # the measured comparison
"""

from .lighthouse import Lighthouse, LighthouseClient
from .manager import Manager, state_digest
from .quorum import Quorum, alive, heal_plan, quorum

__all__ = ["Lighthouse", "LighthouseClient", "Manager", "Quorum", "alive", "heal_plan", "quorum",
           "state_digest"]
