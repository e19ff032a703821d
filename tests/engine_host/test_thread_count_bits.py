"""A block's bytes must not depend on the torch intra-op thread count of the host that runs it (issue 29):
a replacement regenerates the dead owner's journalled blocks, and the journal does not record the
owner's thread count. Today the avatar backend's output differs between 1 and 2 threads (found
2026-12-02, deterministic for each count), so a failover between hosts whose thread counts differ
(`torch_threads`, or a default derived from the cores and the hosts on the machine) would regenerate
different bytes. Strict xfail until the thread count is fixed across a fleet, or recorded and
matched; then this passes and the marker goes."""

from __future__ import annotations

import threading

import pytest
import torch

from libs.schemas.engine import SessionInit
from services.engine_host.backends import Registry, make_backend


def block_bytes(backend: str, threads: int) -> list[bytes]:
    """Three blocks of a fresh session run on a thread with `threads` intra-op threads: their output tensors' bytes."""
    out: list[bytes] = []
    errors: list[BaseException] = []

    def run() -> None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            b = make_backend(Registry({}), backend, b"", torch.device("cpu"))
            state = b.init_state(7, SessionInit(prompt="narrator"))
            for _ in range(3):
                carry = b.denoise(state, b.encode(state, []), b.tiers[0])
                result = b.decode(state, carry)
                out.append(result.frames.contiguous().numpy().tobytes())
                assert result.audio is not None
                out.append(result.audio.contiguous().numpy().tobytes())
        except BaseException as e:  # re-raised on the test's thread
            errors.append(e)
        finally:
            torch.set_num_threads(before)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out


@pytest.mark.xfail(strict=True, reason="avatar's output bytes depend on the torch thread count (issue 29)")
def test_avatar_blocks_are_the_same_bytes_at_one_and_two_threads():
    one, two = block_bytes("avatar", 1), block_bytes("avatar", 2)
    assert one == block_bytes("avatar", 1)  # deterministic at one count: the xfail is the count, not noise
    assert len(one) == len(two) == 6
    assert one == two
