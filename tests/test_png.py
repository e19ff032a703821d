"""The PNG codec frames travel in: lossless, standard (a third-party reader agrees), strict on input."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from libs import png
from libs.schemas.engine import SessionInit
from services.engine_host.backends import AvatarBackend, Output, advance
from services.engine_host.output import MAX_CHUNK_BYTES, assemble, chunks, encode


@settings(max_examples=40, deadline=None)
@given(arrays(np.uint8, st.tuples(st.just(3), st.integers(1, 17), st.integers(1, 17))))
def test_decode_reads_back_exactly_what_encode_wrote(img):
    assert np.array_equal(png.decode(png.encode(img)), img)


def test_a_standard_reader_sees_the_same_pixels():
    pil = pytest.importorskip("PIL.Image")
    img = np.random.default_rng(1).integers(0, 256, (3, 20, 30), dtype=np.uint8)
    seen = np.asarray(pil.open(io.BytesIO(png.encode(img))).convert("RGB"))
    assert np.array_equal(seen, img.transpose(1, 2, 0))


@pytest.mark.parametrize("bad", [b"", b"GIF89a", png.encode(np.zeros((3, 2, 2), np.uint8))[:-5]],
                         ids=["empty", "gif", "truncated"])
def test_truncated_or_foreign_bytes_are_a_value_error(bad):
    with pytest.raises(ValueError):
        png.decode(bad)


def test_a_corrupt_chunk_is_a_value_error():
    data = bytearray(png.encode(np.zeros((3, 4, 4), np.uint8)))
    data[40] ^= 0xFF  # inside IDAT
    with pytest.raises(ValueError):
        png.decode(bytes(data))


def test_avatar_frames_travel_as_one_png_each_and_reassemble_bit_exactly():
    backend = AvatarBackend()
    state = backend.init_state(3, SessionInit(prompt="hi"))
    out = advance(backend, state, [b"hello"], backend.tiers[-1])
    parts = chunks("s", 1, encode(out), media_s=backend.media_s_per_block, input_seq=4)
    frames = [c for c in parts if c.kind == "frames"]
    assert len(frames) == out.frames.shape[0] and all(c.encoding == "png" for c in frames)
    assert all(len(c.data) < MAX_CHUNK_BYTES for c in parts)
    assert {(c.media_s, c.input_seq) for c in parts} == {(backend.media_s_per_block, 4)}
    assert torch.equal(assemble(frames), out.frames)
    assert torch.equal(assemble([c for c in parts if c.kind == "audio"]), out.audio)


def test_a_frame_whose_png_would_not_fit_a_chunk_goes_raw():
    noise = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (2, 3, 64, 64), dtype=np.uint8))
    enc = encode(Output(frames=noise), max_bytes=8 * 1024)
    assert enc[0].encoding == "raw" and all(len(p) <= 8 * 1024 for p in enc[0].parts)
    assert torch.equal(assemble(chunks("s", 1, enc)), noise)


def test_decode_hwc_is_decode_channels_last():
    img = np.random.default_rng(5).integers(0, 256, (3, 9, 14), dtype=np.uint8)
    assert np.array_equal(png.decode_hwc(png.encode(img)), img.transpose(1, 2, 0))
