"""portsim runs per-rank programs on one port per rank as the emulated links do: hand-counted
cases, both kinds of link, and a deadlock named instead of a hang."""

from __future__ import annotations

import pytest

from allreduce_edu.model import portsim
from allreduce_edu.model.links import Link

STORED, FLIGHT = Link(1.0, 0.01), Link(1.0, 0.01, in_flight=True)


def _two_sends(link):
    programs = [[("send", 1, "a", 100), ("send", 1, "b", 100)],
                [("recv", 0, "a", 0), ("recv", 0, "b", 0)]]
    return portsim.run(programs, lambda s, d: link)


def test_two_messages_pay_alpha_twice_on_the_ports_and_once_in_flight():
    assert _two_sends(STORED) == pytest.approx(2 * (1.0 + 1.0))  # (α + 100β) each, one after the other
    assert _two_sends(FLIGHT) == pytest.approx(2 * 1.0 + 1.0)  # 2 · 100β on the port, α once


def test_a_reply_waits_for_the_request_and_a_reduction_costs_gamma():
    programs = [[("send", 1, "q", 100), ("recv", 1, "r", 0)],
                [("recv", 0, "q", 100), ("send", 0, "r", 100)]]
    assert portsim.run(programs, lambda s, d: STORED, gamma=0.5) == pytest.approx(2.0 + 50 + 2.0)


def test_two_senders_to_one_receiver_take_turns_at_its_port():
    programs = [[("send", 2, "a", 100)], [("send", 2, "b", 100)],
                [("recv", 0, "a", 0), ("recv", 1, "b", 0)]]
    assert portsim.run(programs, lambda s, d: STORED) == pytest.approx(4.0)
    assert portsim.run(programs, lambda s, d: FLIGHT) == pytest.approx(3.0)  # α overlaps


def test_programs_that_wait_for_each_other_are_named_a_deadlock():
    programs = [[("recv", 1, "b", 0), ("send", 1, "a", 1)], [("recv", 0, "a", 0), ("send", 0, "b", 1)]]
    with pytest.raises(ValueError, match=r"ranks \[0, 1\] wait .* deadlock"):
        portsim.run(programs, lambda s, d: STORED)


def test_greedy_programs_send_what_is_ready_and_replay_to_their_own_time():
    # a chain 0 -> 1 -> 2 and an independent message 0 -> 2
    messages = {"a": (0, 1, 100, False), "b": (1, 2, 100, False), "c": (0, 2, 100, False)}
    programs = portsim.greedy(3, messages, {"b": {"a"}}, lambda s, d: FLIGHT)
    assert [op[:3] for op in programs[1]] == [("recv", 0, "a"), ("send", 2, "b")]
    assert {op[2] for op in programs[2]} == {"b", "c"}
    assert portsim.run(programs, lambda s, d: FLIGHT) == pytest.approx(1 + 1 + 1 + 1)  # a, then b
    with pytest.raises(ValueError, match="never be sent"):
        portsim.greedy(2, {"x": (0, 1, 1, False)}, {"x": {"y"}}, lambda s, d: FLIGHT)
