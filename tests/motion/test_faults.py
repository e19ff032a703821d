"""At least 1,000 injected faults over the real TCP data plane: every one fails closed, none installs."""

from __future__ import annotations

from bench.mover_faults import CODECS, DEVICES, KINDS, run_campaign


async def test_a_thousand_faults_fail_closed():
    c = await run_campaign(1000, seed=4)
    assert c.faults_injected == 1000
    assert set(c.by_kind) == set(KINDS) and min(c.by_kind.values()) >= 100
    assert c.corrupt_installs == 0
    assert c.unsafe == 0 and c.failed_closed == 1000
    assert c.source_changed == 0
    # Each kind failed for its own reason, not by accident.
    assert "CRC" in c.reasons["flip_payload"]
    assert "header" in c.reasons["flip_header"]
    assert "reordered" in c.reasons["reorder"]
    assert "round had" in c.reasons["extra_chunk"]
    for kind in ("wrong_token", "reused_token"):  # the receiver hangs up; the sender may see only the reset
        assert "token" in c.reasons[kind] or "connection" in c.reasons[kind]
    assert "differ from the manifest" in c.reasons["manifest_mismatch"]
    # A damaged chunk is refused on every receive path: straight into a host slot (uncompressed),
    # decoded on a worker (zstd with byte planes, lz4), staged through host into a device slot.
    for codec in CODECS:
        for device in DEVICES:
            assert all(c.by_route[f"{kind}/{codec}/{device}"] >= 10 for kind in KINDS)
            assert "CRC" in c.reasons[f"flip_payload/{codec}/{device}"]
            assert "header" in c.reasons[f"flip_header/{codec}/{device}"]
