"""The in-process copy checksums source and staged bytes piece by piece: both CRCs still cover every
byte (any length, not only whole pieces), and a staged copy that differs from the source is refused."""

from __future__ import annotations

import crc32c
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from libs.errors import IntegrityError
from libs.motion import checked_copy


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=1, max_value=3 * checked_copy._PIECE_BYTES + 17), st.integers(0, 2**32 - 1))
def test_piecewise_crcs_cover_every_byte(nbytes, seed):
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    dst = torch.empty_like(src)
    src_crc, staged_crc = checked_copy.copy_checked(dst, src)
    assert torch.equal(dst, src)
    assert src_crc == staged_crc == crc32c.crc32c(src.numpy())


class _Slot:
    """Just what `copy_and_check` uses of a slot, over one flat leaf."""

    checksum = "crc32c"

    def __init__(self, nbytes: int) -> None:
        self.flat, self.recorded = torch.zeros(nbytes, dtype=torch.uint8), {}

    def region(self, leaf, offset, length):
        return self.flat[offset:offset + length]

    def record(self, leaf, offset, staged):
        self.recorded[offset] = staged


def test_a_staged_chunk_that_differs_from_the_senders_crc_is_refused_and_not_recorded():
    src = torch.arange(1 << 20, dtype=torch.int32).view(torch.uint8)[: 1 << 20].clone()
    slot = _Slot(src.numel())
    wrong = crc32c.crc32c(src.numpy()) ^ 1
    with pytest.raises(IntegrityError):
        checked_copy.copy_and_check(slot, 0, 0, src, wrong)
    assert slot.recorded == {}
    assert checked_copy.copy_and_check(slot, 0, 0, src) == crc32c.crc32c(src.numpy())
    assert slot.recorded == {0: crc32c.crc32c(src.numpy())}


def test_a_source_that_changes_while_it_is_copied_is_refused(monkeypatch):
    src = torch.randint(0, 256, (3 * checked_copy._PIECE_BYTES,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(5))
    slot = _Slot(src.numel())
    real, calls = checked_copy.crc.crc, []

    def crc_then_write(buf, value=0):  # a writer touches the piece just checksummed, before it is copied
        out = real(buf, value)
        if not calls:
            src[7] ^= 0xFF
        calls.append(1)
        return out

    monkeypatch.setattr(checked_copy.crc, "crc", crc_then_write)
    with pytest.raises(IntegrityError):
        checked_copy.copy_and_check(slot, 0, 0, src)
    assert slot.recorded == {}
