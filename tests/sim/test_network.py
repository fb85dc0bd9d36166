"""KV network: processor sharing per port, latency, queueing, degradation and failure."""

from __future__ import annotations

import pytest

from fleetwise.sim.events import EventLoop
from fleetwise.sim.network import KvNetwork, TransferRecord

GB = 1e9


def make_net(ports: int = 4, bw: float = 10 * GB, latency_s: float = 0.0):
    loop = EventLoop()
    done: list[tuple[float, int, TransferRecord]] = []
    net = KvNetwork(loop, latency_s, lambda t, tag, rec: done.append((t, tag, rec)))
    for k in range(ports):
        net.add_port(f"r{k}", bw)
    return loop, net, done


def test_one_transfer_takes_bytes_over_bandwidth_plus_latency():
    loop, net, done = make_net(latency_s=0.002)
    net.start(0.0, 7, 0, 1, 1 * GB)
    loop.run()
    assert done == [(pytest.approx(0.102), 7, done[0][2])]
    assert done[0][2].queue_s == pytest.approx(0.0)


def test_two_equal_transfers_on_one_link_take_twice_as_long():
    loop, net, done = make_net()
    net.start(0.0, 1, 0, 1, 1 * GB)
    net.start(0.0, 2, 0, 1, 1 * GB)
    loop.run()
    assert [t for t, _, _ in done] == [pytest.approx(0.2), pytest.approx(0.2)]
    assert [r.queue_s for _, _, r in done] == [pytest.approx(0.1), pytest.approx(0.1)]


def test_one_prefill_sending_to_many_decodes_slows_them_all():
    loop, net, done = make_net(ports=4)
    for dst in (1, 2, 3):
        net.start(0.0, dst, 0, dst, 1 * GB)
    loop.run()
    assert [t for t, _, _ in done] == [pytest.approx(0.3)] * 3


def test_rates_are_recomputed_when_a_transfer_ends():
    # A (1 GB) and B (0.5 GB) share the egress: both at 5 GB/s until B ends at 0.1 s; A then
    # runs alone at 10 GB/s for its last 0.5 GB: ends at 0.15 s.
    loop, net, done = make_net()
    net.start(0.0, 1, 0, 1, 1 * GB)
    net.start(0.0, 2, 0, 2, 0.5 * GB)
    loop.run()
    assert {tag: t for t, tag, _ in done} == {2: pytest.approx(0.1), 1: pytest.approx(0.15)}


def test_rate_is_the_minimum_over_both_ports():
    loop, net, done = make_net()
    net.ports[1].bandwidth_bytes_per_s = 2 * GB
    net.start(0.0, 1, 0, 1, 1 * GB)
    loop.run()
    assert done[0][0] == pytest.approx(0.5)


def test_degraded_link_halves_the_rate_and_a_down_link_fails_transfers():
    loop, net, done = make_net()
    net.start(0.0, 1, 0, 1, 1 * GB)
    loop.run(until_s=0.05)
    net.set_factor(0.05, [0], 0.5)  # 0.5 GB left at 5 GB/s
    loop.run()
    assert done[0][0] == pytest.approx(0.15)
    net.set_factor(0.15, [0], 0.0)
    net.start(0.2, 2, 0, 1, 1 * GB)
    assert done[-1][1] == 2 and not done[-1][2].ok


def test_failing_a_port_fails_its_transfers_and_speeds_up_the_rest():
    loop, net, done = make_net()
    net.start(0.0, 1, 0, 1, 1 * GB)
    net.start(0.0, 2, 0, 2, 1 * GB)
    loop.run(until_s=0.1)  # each has moved 0.5 GB
    net.fail_port(0.1, 2)
    loop.run()
    assert [(tag, ok) for _, tag, r in done for ok in [r.ok]] == [(2, False), (1, True)]
    assert done[-1][0] == pytest.approx(0.15)
