"""Two network namespaces joined by a veth pair with a `tc` rate limit: the calculator predicts the move.

The fastest of up to three measured moves must match `admissibility.t_migrate_s`
at the tc rate within 15% (load on a shared machine only slows a move), and horizons on each side of the gate must be admitted and
rejected as the calculator says (the admitted move really finishes inside its
horizon; the rejected one really would not have).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from libs import admissibility

RATE_MBIT = 200
ROOT = Path(__file__).resolve().parents[2]


def sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def netns():
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    tag = f"{os.getpid() % 100000}"
    a, b, va, vb = f"sfmvA{tag}", f"sfmvB{tag}", f"sfa{tag}", f"sfb{tag}"
    steps = [
        ("ip", "netns", "add", a), ("ip", "netns", "add", b),
        ("ip", "link", "add", va, "type", "veth", "peer", "name", vb),
        ("ip", "link", "set", va, "netns", a), ("ip", "link", "set", vb, "netns", b),
        ("ip", "-n", a, "addr", "add", "10.213.7.1/24", "dev", va),
        ("ip", "-n", b, "addr", "add", "10.213.7.2/24", "dev", vb),
        ("ip", "-n", a, "link", "set", va, "up"), ("ip", "-n", b, "link", "set", vb, "up"),
        ("ip", "-n", a, "link", "set", "lo", "up"), ("ip", "-n", b, "link", "set", "lo", "up"),
        ("ip", "netns", "exec", a, "tc", "qdisc", "add", "dev", va, "root", "tbf", "rate", f"{RATE_MBIT}mbit",
         "burst", "64kb", "latency", "100ms"),
    ]
    try:
        for cmd in steps:
            r = sh(*cmd)
            if r.returncode != 0:
                pytest.skip(f"the kernel refused `{' '.join(cmd)}`: {r.stderr.strip()}")
        yield a, b
    finally:
        sh("ip", "netns", "del", a)
        sh("ip", "netns", "del", b)


def peer(ns: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "tests.motion.netns_peer", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def move_once(a: str, b: str) -> dict:
    token = secrets.token_hex(16)
    receiver = peer(b, "recv", "10.213.7.2:0", token)
    try:
        ready = json.loads(receiver.stdout.readline() or "{}")
        assert "ready" in ready, receiver.stderr.read()
        port = ready["ready"].rpartition(":")[2]
        sent = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-m", "tests.motion.netns_peer", "send",
                               f"10.213.7.2:{port}", token], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
        if sent.returncode != 0:
            receiver.kill()
            out, err = receiver.communicate(timeout=10)
            raise AssertionError(f"sender failed:\n{sent.stderr}\nreceiver said:\n{out}\n{err}")
        got = json.loads(sent.stdout.strip().splitlines()[-1])
        verdict = json.loads(receiver.stdout.readline())
    finally:
        receiver.kill()
        receiver.wait()
    assert verdict["ok"], verdict
    return got


def test_move_time_matches_the_calculator_within_15_percent(netns):
    # The link's rate bounds the move from below; CPU time stolen by other work on a shared machine
    # only adds to it. So the fastest of up to three moves is the one that measures the link.
    bandwidth = admissibility.gbps(RATE_MBIT / 1000)
    for _ in range(3):
        got = move_once(*netns)
        predicted = admissibility.t_migrate_s(admissibility.Transfer(
            state_bytes=got["wire_bytes"], dirty_rate_bps=0, horizon_s=3600, bandwidth_bps=bandwidth))
        error = abs(got["seconds"] - predicted) / predicted
        print(f"netns move: measured {got['seconds']:.3f}s predicted {predicted:.3f}s error {error:.1%}")
        if error <= 0.15:
            break
    assert error <= 0.15
    # Each side of the gate: the calculator admits a horizon 20% above its prediction and the move
    # indeed fits; it rejects one 20% below, which the measured move indeed overruns.
    fits = admissibility.evaluate(admissibility.Transfer(state_bytes=got["wire_bytes"], dirty_rate_bps=0,
                                                     horizon_s=1.2 * predicted, bandwidth_bps=bandwidth))
    misses = admissibility.evaluate(admissibility.Transfer(state_bytes=got["wire_bytes"], dirty_rate_bps=0,
                                                       horizon_s=0.8 * predicted, bandwidth_bps=bandwidth))
    assert fits.admissible and got["seconds"] < 1.2 * predicted
    assert not misses.admissible and got["seconds"] > 0.8 * predicted
