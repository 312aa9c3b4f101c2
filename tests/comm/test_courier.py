"""The courier of in-flight links posts each message at its arrival, earliest first: a message to an
idle rank is not held back behind an earlier-sent one to a busy rank (arrivals at different
destinations can come in either order); equal arrivals keep the order they were sent in."""

from __future__ import annotations

import time

from allreduce_edu.comm.courier import Courier


def test_an_earlier_arrival_is_posted_first_and_not_held_back():
    courier, posted = Courier("courier-test"), []
    t0 = time.monotonic()
    courier.at(t0 + 0.08, lambda: posted.append(("to a busy rank", time.monotonic() - t0)))
    courier.at(t0 + 0.01, lambda: posted.append(("to an idle rank", time.monotonic() - t0)))
    courier.close()
    assert [name for name, _ in posted] == ["to an idle rank", "to a busy rank"]
    assert 0.01 <= posted[0][1] < 0.07 and posted[1][1] >= 0.08  # never early; not held back


def test_equal_arrivals_keep_the_order_they_were_sent_in():
    courier, posted = Courier("courier-test"), []
    deadline = time.monotonic() + 0.01
    for k in range(20):
        courier.at(deadline, lambda k=k: posted.append(k))
    courier.close()
    assert posted == list(range(20))
