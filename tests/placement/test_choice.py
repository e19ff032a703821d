"""Where the placement service puts a session (services/placement/choice.py): the fleet policy's placement
function over the service's view: every reason on a refusal, draining and excluded hosts never chosen,
one device's hosts split it, and a session pinned to a torch thread count prefers hosts running at it."""

from __future__ import annotations

import msgspec
import pytest

from libs.contracts import Guard
from libs.schemas.placement import HostRecord, Reserved
from services.placement import capacity, choice
from services.placement.policy import Params, PathRates
from tests.support.fleet_rows import GIB, c1, host, rows

PARAMS = Params(guard=Guard(max_sessions=8))
PATHS = PathRates(default_bps=1e9)
SETTLE = 5.0


def pick(hosts, records=None, *, contract=None, threads=0, **kw):
    want = choice.wanted("new", contract or c1(), "world", threads=threads)
    return choice.choose(want, hosts=hosts, records=records or {}, params=PARAMS, settle_s=SETTLE, paths=PATHS, **kw)


def on(h, machine, threads=0):
    return msgspec.structs.replace(h, machine=machine, device="cpu", threads=threads)


def test_a_refusal_names_every_host_reason_in_host_order():
    hosts = [host("h2", profile=rows(backend="avatar")), host("h0", busy=0.85), host("h1", free=3 * GIB),
             host("h3")]
    got = pick(hosts, {"h3": HostRecord(host_id="h3", state="draining")})
    assert got.estimate is None and got.reason == "no_fit"
    assert [(e.host_id, e.reason) for e in got.estimates] == [
        ("h0", "busy"), ("h1", "memory"), ("h2", "no_profile"), ("h3", "draining")]


def test_draining_and_excluded_hosts_are_never_chosen():
    hosts = [host("h0"), host("h1", busy=0.5), host("h2", busy=0.2)]
    records = {"h0": HostRecord(host_id="h0", state="draining")}
    for spread in (False, True):
        got = pick(hosts, records, spread=spread)
        assert got.estimate is not None and got.estimate.host_id in {"h1", "h2"}
        assert pick(hosts, records, exclude=["h1", "h2"], spread=spread).estimate is None


def test_a_reservation_counts_on_the_next_choice_and_nothing_is_placed_past_the_guard():
    hosts, records, placed = [host("h0", busy=0.5, at=1000.0), host("h1", busy=0.7, at=1000.0)], {}, []
    while (est := pick(hosts, records).estimate) is not None:
        records[est.host_id] = capacity.reserve(records.get(est.host_id) or HostRecord(host_id=est.host_id),
                                                f"s{len(placed)}", est, "inc", 1000.0)
        placed.append(est.host_id)
    assert placed.count("h0") == 4 and placed.count("h1") == 2  # each filled to 0.9, and no further


def test_hosts_on_one_device_split_it():
    """h0 and h1 share machine m's CPU (0.4 + 0.3 busy, and a 0.1 reservation on h1 its heartbeat does not
    show yet): a 0.2 session fits neither; h2 on another machine takes it."""
    hosts = [on(host("h0", busy=0.4), "m"), on(host("h1", busy=0.3), "m"), on(host("h2", busy=0.5), "n")]
    records = {"h1": HostRecord(host_id="h1", sessions={"x": Reserved(busy_fraction=0.1, state_bytes=0, at=1000.0)})}
    for spread in (False, True):
        got = pick(hosts, records, contract=c1(floor=8), spread=spread)
        assert got.estimate is not None and got.estimate.host_id == "h2"
        assert got.estimate.host_busy_fraction == pytest.approx(0.5)


def test_one_device_packs_one_process_and_spread_takes_the_emptiest():
    """Two processes on one CPU read one pooled load, to the last bit, whatever order it was summed in
    (0.03 + 0.07 and 0.07 + 0.03 plus reservations):
    placement (best fit) sends every session to one of them, the one that then sees every deadline;
    failover and drain (`spread`) alternate, the one holding fewer sessions first."""
    for spread, want in ((False, [3]), (True, [1, 2])):
        hosts = [on(host("h0", busy=0.03, at=1000.0), "m"), on(host("h1", busy=0.07, at=1000.0), "m")]
        records: dict[str, HostRecord] = {}
        for i in range(3):  # each within the latency target (a device up to 0.4 busy, for this contract)
            est = pick(hosts, records, spread=spread).estimate
            assert est is not None
            records[est.host_id] = capacity.reserve(records.get(est.host_id) or HostRecord(host_id=est.host_id),
                                                    f"s{i}", est, "inc", 1000.0)
        assert sorted(len(r.sessions) for r in records.values()) == want


def test_a_pinned_session_prefers_hosts_at_its_thread_count():
    """Bit-exact replay needs the count the session ran at: a host announcing it wins over one the policy
    would otherwise take (best fit picks the busier h0), and with no such host taking it, any host does."""
    hosts = [on(host("h0", busy=0.3), "m", threads=2), on(host("h1", busy=0.1), "n", threads=1)]
    assert pick(hosts).estimate.host_id == "h0"  # unpinned: the policy's own choice
    for spread in (False, True):
        assert pick(hosts, threads=1, spread=spread).estimate.host_id == "h1"
        assert pick(hosts, threads=2, spread=spread).estimate.host_id == "h0"
    full = [hosts[0], on(host("h1", busy=0.85), "n", threads=1)]
    assert pick(full, threads=1).estimate.host_id == "h0"  # falls back: served beats refused
    assert pick(hosts, threads=4).estimate.host_id == "h0"  # nobody at 4: as if unpinned


def test_a_host_not_announcing_its_count_is_not_at_any_count():
    hosts = [on(host("h0", busy=0.3), "m"), on(host("h1", busy=0.1), "n", threads=1)]
    assert pick(hosts, threads=1).estimate.host_id == "h1"
    assert pick(hosts).estimate.host_id == "h0"


def test_residents_are_the_serving_sessions_placement_knows_on_live_hosts():
    from libs.schemas.common import SessionSummary

    summaries = {sid: SessionSummary(session_id=sid, owner_server_id=h, state=st) for sid, h, st in (
        ("a", "h0", "serving"), ("b", "h0", "assigned"), ("c", "h0", "suspended"), ("d", "h0", "closed"),
        ("e", "gone", "serving"), ("f", "h0", "serving"))}
    specs = {sid: (c1(), "world") for sid in "abcde"}  # f: a contract placement never learned
    got = choice.residents_of(summaries, specs, [host("h0")])
    assert [(s.session_id, s.host_id, s.state) for s in got] == [("a", "h0", "serving"), ("b", "h0", "serving")]
