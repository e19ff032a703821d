"""`statefleet session create --image/--audio`: PPM and WAV files become the create body's init inputs."""

from __future__ import annotations

import base64
import wave

import pytest

from libs.errors import BadRequest
from statefleet.init_files import read_audio, read_image


def test_a_ppm_becomes_the_image_and_other_files_are_refused(tmp_path):
    rgb = bytes(range(2 * 3 * 3))
    ok = tmp_path / "a.ppm"
    ok.write_bytes(b"P6\n# made by hand\n3 2\n255\n" + rgb)
    assert read_image(str(ok)) == {"width": 3, "height": 2, "rgb": base64.b64encode(rgb).decode()}
    for name, data in (("short.ppm", b"P6 3 2 255\n" + rgb[:-1]), ("deep.ppm", b"P6 3 2 65535\n" + rgb * 2),
                       ("a.png", b"\x89PNG\r\n")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(BadRequest):
            read_image(str(tmp_path / name))
    with pytest.raises(BadRequest):
        read_image(str(tmp_path / "missing.ppm"))


@pytest.mark.parametrize(("rate", "channels", "ok"), [(16000, 1, True), (44100, 1, False), (16000, 2, False)])
def test_only_16_khz_mono_16_bit_wav_becomes_the_audio(tmp_path, rate, channels, ok):
    pcm = b"\x01\x02" * 40 * channels
    path = tmp_path / "a.wav"
    with wave.open(str(path), "wb") as f:
        f.setnchannels(channels)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(pcm)
    if ok:
        assert base64.b64decode(read_audio(str(path))) == pcm
    else:
        with pytest.raises(BadRequest):
            read_audio(str(path))
