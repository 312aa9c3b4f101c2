"""The protocol-aware tuner: every (algorithm, protocol) predicted by its formula, the fastest chosen, and the
choice moving with the size exactly where the formulas cross."""

from __future__ import annotations

import types

import pytest

from allreduce_edu.model import costmodel
from allreduce_edu.model.links import Link, Links
from allreduce_edu.model.tuner import PROTOCOLS, print_table, table_lines, tune

SIMPLE = [p for p in PROTOCOLS if p.name == "Simple"]
TESTBED = (200e-6, 1 / 50e6)  # α and β of the course's emulated links


def test_each_protocol_says_why_and_trades_latency_for_bandwidth():
    by_name = {p.name: p for p in PROTOCOLS}
    assert list(by_name) == ["LL", "LL128", "Simple"]
    assert by_name["LL"].efficiency == 0.5 and by_name["Simple"].efficiency == 1.0
    assert 0.9 < by_name["LL128"].efficiency < 1.0
    assert by_name["LL"].alpha < by_name["LL128"].alpha < by_name["Simple"].alpha
    assert "flag" in by_name["LL"].why and "fence" in by_name["Simple"].why and all(len(p.why) > 40 for p in PROTOCOLS)


def test_every_pair_is_predicted_by_its_formula_and_the_fastest_wins():
    alpha, beta = 5e-6, 1 / 10e9
    (row,) = tune(8, [1 << 16], (alpha, beta))
    over_messages = set(costmodel.COSTS) - set(costmodel.NEEDS)  # one_shot, two_shot: when named
    assert {a for a, _ in row["times"]} == over_messages and len(over_messages) >= 9
    assert len(row["times"]) == len(over_messages) * len(PROTOCOLS)
    for (algorithm, name), seconds in row["times"].items():
        protocol = next(p for p in PROTOCOLS if p.name == name)
        assert seconds == pytest.approx(costmodel.predict(algorithm, 8, 1 << 16, alpha + protocol.alpha,
                                                          beta / protocol.efficiency))
    assert row["time"] == min(row["times"].values()) == row["times"][row["algorithm"], row["protocol"]]
    assert row["runner_up_time"] >= row["time"]


def test_the_windowed_algorithms_get_rows_when_named_and_one_shot_wins_small_messages():
    rows = tune(4, [8, 64 << 20], (5e-6, 1 / 10e9), ["ring", "one_shot", "two_shot"], SIMPLE)
    assert {a for a, _ in rows[0]["times"]} == {"ring", "one_shot", "two_shot"}
    assert rows[0]["algorithm"] == "one_shot" and rows[1]["algorithm"] in ("ring", "two_shot")


def test_tree_below_the_crossover_ring_above_it():
    algorithms = ["ring", "tree"]
    size = costmodel.crossover("tree", "ring", 8, *TESTBED)
    rows = tune(8, [size / 4, size / 1.5, size * 1.5, size * 4], TESTBED, algorithms, SIMPLE)
    assert [r["algorithm"] for r in rows] == ["tree", "tree", "ring", "ring"]


def test_the_double_binary_tree_takes_over_from_the_tree_as_the_size_grows():
    rows = tune(8, [1 << k for k in range(3, 27, 2)], TESTBED, ["tree", "double_binary_tree"], SIMPLE)
    choices = [r["algorithm"] for r in rows]
    assert choices[0] == "tree" and choices[-1] == "double_binary_tree"
    switch = choices.index("double_binary_tree")
    assert set(choices[switch:]) == {"double_binary_tree"}  # once past the crossover, it stays


def test_low_latency_protocols_for_small_messages_simple_for_big_ones():
    nvlink_like = (1e-6, 1 / 100e9)
    rows = tune(8, [64, 1 << 30], nvlink_like, ["ring"])
    assert [r["protocol"] for r in rows] == ["LL", "Simple"]


def test_the_table_reads_like_ncclss(capsys):
    rows = tune(4, [8, 1 << 20], TESTBED, ["ring", "tree", "bruck"])
    lines = table_lines(rows)
    assert lines[0] == "# all-reduce on 4 ranks: the tuner's choice per size"
    assert "8 B" in lines[2] and "1.0 MiB" in lines[3]
    assert f"{rows[0]['algorithm']}/{rows[0]['protocol']}" in lines[2] and "(+" in lines[2]
    print_table(rows)
    assert capsys.readouterr().out.splitlines() == lines


def test_links_are_read_for_their_alpha_and_beta():
    link = Link(TESTBED[0], TESTBED[1])
    flat = Links.flat(TESTBED[0], 1 / TESTBED[1])
    expected = tune(8, [1 << 20], TESTBED)[0]["time"]
    assert tune(8, [1 << 20], link)[0]["time"] == tune(8, [1 << 20], flat)[0]["time"] == expected
    with pytest.raises(ValueError, match="one α and β"):  # two levels: no one α and β
        tune(8, [1 << 20], Links.two_level(4, intra=(1e-5, 1e-10), inter=TESTBED))
    with pytest.raises(ValueError, match="one α and β"):
        tune(8, [1 << 20], types.SimpleNamespace(alpha=TESTBED[0], beta=TESTBED[1]))
    with pytest.raises(ValueError, match="cost formula"):
        tune(8, [1 << 20], TESTBED, ["butterfly"])


def test_in_flight_the_tuner_takes_nccls_tree_until_the_ring_s_bandwidth_wins():
    import allreduce_edu as ae
    sizes = [8, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    rows = tune(8, sizes, ae.TESTBED_IN_FLIGHT, ["ring", "double_binary_tree"])
    assert [r["algorithm"] for r in rows] == ["double_binary_tree"] * 4 + ["ring"]
    # the same links with α on the ports: every chunk pays α at every port, and the ring wins sooner
    stored = tune(8, sizes, ae.TESTBED, ["ring", "double_binary_tree"])
    assert stored[3]["algorithm"] == "ring" and stored[0]["algorithm"] == "double_binary_tree"
    assert rows[-1]["times"]["double_binary_tree", "Simple"] < stored[-1]["times"]["double_binary_tree", "Simple"]
