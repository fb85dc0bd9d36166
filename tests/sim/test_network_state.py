"""KV network state kept between changes: `next_end_s` and the router's link views against
from-scratch references (rescans over every transfer and port), through a seeded mix of starts,
cancellations, degraded and failed ports and direct bandwidth writes."""

from __future__ import annotations

import math
import random

from fleetwise.core.views import KvLinkView
from fleetwise.sim.events import EventLoop
from fleetwise.sim.network import KvNetwork

GB = 1e9
PORTS = 5
LATENCY_S = 0.003


def rescan_next_end_s(net: KvNetwork) -> float:
    """The reference: every transfer's last byte at its rate now, plus the latency, and every landing."""
    t = math.inf
    for tr in net.transfers.values():
        t = min(t, tr.last_s + tr.remaining / tr.rate)
    if net._landing or t < math.inf:
        t += net.latency_s
    return min([t, *net._landing_s.values()])


def rescan_views(net: KvNetwork, pairs: list[tuple[str, int, str, int, float]]) -> tuple[KvLinkView, ...]:
    """The reference: each path's view computed from its two ports as they are now."""
    out = []
    for sn, sp, dn, dp, extra in pairs:
        ps, pd = net.ports[sp], net.ports[dp]
        bw = min(ps.effective_bw, pd.effective_bw)
        if extra > 0 and bw > 0:
            bw = 1.0 / (1.0 / bw + extra)
        out.append(KvLinkView(sn, dn, bw, net.latency_s, len(ps.active | pd.active), bw > 0))
    return tuple(out)


def scripted_run(seed: int):
    """A seeded network and the actions to apply to it at increasing times."""
    rng = random.Random(seed)
    loop = EventLoop()
    landed: list[tuple[float, int]] = []
    net = KvNetwork(loop, LATENCY_S, lambda t, tag, rec: landed.append((t, tag)))
    for k in range(PORTS):
        net.add_port(f"r{k}", (5 + 5 * k) * GB)
    pairs = [(f"r{s}", s, f"r{d}", d, 1e-12 if (s + d) % 3 == 0 else 0.0)
             for s in range(2) for d in range(2, PORTS)]
    t, actions = 0.0, []
    for _ in range(300):
        t += rng.expovariate(40.0)
        u = rng.random()
        if u < 0.80:
            actions.append((t, "start", rng.randrange(2), rng.randrange(2, PORTS), rng.uniform(0.05, 2.0) * GB))
        elif u < 0.88:
            actions.append((t, "cancel", rng.randrange(1, 300)))
        elif u < 0.94:
            actions.append((t, "factor", rng.randrange(PORTS), rng.choice([0.0, 0.5, 1.0])))
        elif u < 0.97:
            actions.append((t, "bandwidth", rng.randrange(PORTS), rng.uniform(5, 25) * GB))
        else:
            actions.append((t, "fail", rng.randrange(PORTS)))
    return loop, net, pairs, actions, landed


def apply(net: KvNetwork, action: tuple) -> None:
    t, kind, *args = action
    if kind == "start":
        src, dst, nbytes = args
        net.start(t, len(net.records) + 1000, src, dst, nbytes)
    elif kind == "cancel":
        net.cancel(t, args[0])
    elif kind == "factor":
        net.set_factor(t, [args[0]], args[1])
    elif kind == "bandwidth":  # as the emulator's port does for a peer
        net.ports[args[0]].bandwidth_bytes_per_s = args[1]
    else:
        net.fail_port(t, args[0])


def test_next_end_s_equals_a_rescan_and_bounds_every_landing() -> None:
    for seed in range(4):
        loop, net, _, actions, landed = scripted_run(seed)
        checked = 0
        for action in actions:
            loop.run(until_s=action[0])
            bound = net.next_end_s()
            assert bound == rescan_next_end_s(net)
            assert net.next_end_s() == bound  # asked again with nothing changed: the same
            apply(net, action)
            assert net.next_end_s() == rescan_next_end_s(net)
            checked += 1
        loop.run()
        assert net.next_end_s() == math.inf and not net.transfers
        assert checked == len(actions) and len(landed) > 100


def test_link_views_match_a_rescan_and_keep_their_tuple_while_nothing_changed() -> None:
    for seed in range(4):
        loop, net, pairs, actions, _ = scripted_run(100 + seed)
        views = net.link_views(pairs)
        kept = moved = 0
        for action in actions:
            loop.run(until_s=action[0])
            apply(net, action)
            want = rescan_views(net, pairs)
            got = net.link_views(pairs)
            assert got == want
            if got is views:
                kept += 1
            else:
                assert got != views  # a new tuple only when a view changed
                moved += 1
            assert net.link_views(pairs) is got  # asked again with nothing changed: the same tuple
            views = got
        assert kept > 0 and moved > 0
