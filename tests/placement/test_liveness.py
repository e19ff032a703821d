"""Host liveness (pure): silence kills a host only while the bus is heard carrying other hosts' beats."""

from __future__ import annotations

from libs.schemas.common import EngineEntry
from services.placement.liveness import Liveness


def beat(live: Liveness, host: str, now: float) -> list:
    return live.observe(EngineEntry(host_id=host, device="cpu", memory_bytes=1 << 30, free_memory_bytes=1 << 30,
                                    incarnation=f"{host}-1", heartbeat_s=0.5), now)


def test_a_silent_host_dies_while_the_others_are_heard():
    live = Liveness(beats=3)
    beat(live, "a", 0.0)
    beat(live, "b", 0.0)
    for t in (0.5, 1.0):
        beat(live, "a", t)
        assert live.expire(t) == []
    beat(live, "a", 1.5)
    assert [d.host_id for d in live.expire(1.5)] == ["b"]


def test_every_host_silent_at_once_is_the_bus_not_the_fleet():
    live = Liveness(beats=3, fleet_quiet_limit_s=30.0, quiet_grace_s=10.0)
    beat(live, "a", 0.0)
    beat(live, "b", 0.0)
    for t in (1.5, 2.0, 5.0, 20.0):  # heartbeat writes fail everywhere (a leader election): no death
        assert live.expire(t) == []
    beat(live, "a", 21.0)  # the bus is back; b reconnects later, within the grace
    assert live.expire(25.0) == []
    beat(live, "b", 26.0)
    assert live.expire(27.0) == [] and {e.host_id for e in live.hosts()} == {"a", "b"}


def test_beats_resuming_give_every_host_a_grace_and_then_silence_counts():
    live = Liveness(beats=3, quiet_grace_s=10.0)
    beat(live, "a", 0.0)
    beat(live, "b", 0.0)
    assert live.expire(5.0) == []
    t = 6.0
    while t < 16.0:  # a is back and beats; b never returns, and its silence counts once the grace ends
        beat(live, "a", t)
        assert live.expire(t) == []
        t += 0.5
    beat(live, "a", 16.0)
    assert [d.host_id for d in live.expire(16.0)] == ["b"]


def test_a_fleet_quiet_past_its_limit_is_dead():
    live = Liveness(beats=3, fleet_quiet_limit_s=30.0)
    beat(live, "a", 0.0)
    beat(live, "b", 0.0)
    t = 1.5
    while t < 30.0:
        assert live.expire(t) == []
        t += 1.0
    assert {d.host_id for d in live.expire(33.0)} == {"a", "b"}


def test_a_lone_host_silent_is_dead():
    live = Liveness(beats=3)
    beat(live, "a", 0.0)
    assert [d.host_id for d in live.expire(1.5)] == ["a"]
