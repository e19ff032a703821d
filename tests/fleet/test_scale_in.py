"""Scale-in through the placement service: the autoscaler drains a host by live moves and gives it back
only once it owns nothing; no session is dropped, and a host that still owns one is never released."""

from __future__ import annotations

import signal
import time

from libs.contracts import Guard
from services.placement.policy import StopHost
from services.placement.provisioning.sim import SimProvisioner
from tests.support.fleet import configure
from tests.support.invariants import check_log, read_log
from tests.support.waiting import eventually

ONE_EACH = Guard(max_sessions=1)


async def test_scale_in_never_drops_a_session_nor_releases_a_host_that_owns_one(stack):
    # Low load, no warm pool: one host is enough, so the autoscaler gives one of the two back.
    await stack.start(fleet_control=False, control_s=0.2, keep_warm_s=0.0, rebalance=False, min_hosts=1,
                      max_hosts=2, warm_pool_hosts=0, warm_pool_frac=0.0, target_util=0.9, scale_in_below=0.9,
                      scale_out_above=0.95, scale_in_cooldown_s=0.0)
    stopped_with: dict[str, tuple[int, list[str]]] = {}

    def on_stop(host_id: str) -> None:
        # What the service saw the moment it gave the host back: its heartbeat's sessions, and which
        # sessions the sessions hint says it owns. Then the process goes, as a provider would stop it.
        p = stack.placements[0]
        entry = p.liveness.entry(host_id)
        stopped_with[host_id] = (entry.sessions if entry else 0, [s.session_id for s in p.owned(host_id)])
        stack.engines[host_id].signal(signal.SIGTERM)

    prov = SimProvisioner(clock=time.monotonic, on_stop=on_stop)
    for p in stack.placements:
        p.fleet.provisioner = prov
    hosts = prov.start(2)
    await stack.engines_up(*hosts)
    placed = {sid: (await stack.create(sid, ONE_EACH)).host_id for sid in ("a", "b")}
    assert sorted(placed.values()) == hosts
    for sid in placed:
        await stack.send(sid, 1, 2)
        await eventually(lambda sid=sid: stack.consumed(sid, 2))

    # The release guard on its own: a draining host that owns a session is not given back.
    lead = stack.placements[0]
    await lead.reservations.set_state(placed["b"], "draining")
    why = await lead.fleet.stoppable(placed["b"])
    assert why in ("it holds 1 reservations", "its heartbeat shows 1 sessions", "it owns session b")
    await lead.fleet._stop_host(StopHost(host_id=placed["b"]))
    assert prov.managed() == set(hosts) and not stopped_with
    await lead.reservations.set_state(placed["b"], "up")

    configure(stack, fleet_control=True)

    async def released():
        return prov.stopped or None

    (gone,) = await eventually(released, 90)
    kept = next(h for h in hosts if h != gone)
    assert stopped_with[gone] == (0, [])  # it owned nothing when it was given back
    for sid in placed:
        view = await eventually(lambda sid=sid: stack.claimed_by(sid, kept), 20)
        assert view.owner.version == (1 if placed[sid] == kept else 2)  # the moved one: one live hand-off
        await stack.send(sid, 3, 4)
        await eventually(lambda sid=sid: stack.consumed(sid, 4), 30)
        check_log(await read_log(stack.js, sid))
    assert prov.managed() == {kept}  # and the last host is never given back (min_hosts = 1)

