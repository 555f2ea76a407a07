"""Real speech for the audio examples: espeak-ng renders text (or a WAV it wrote earlier is read),
mixed with silence at 16 kHz."""

from __future__ import annotations

import shutil
import subprocess
import wave
from dataclasses import dataclass
from io import BytesIO

import numpy as np

SAMPLE_RATE = 16_000


def espeak(text: str, *, voice: str = "en", speed: int = 160, timeout: float = 30.0) -> np.ndarray:
    """``text`` spoken by espeak-ng, as float32 samples in [-1, 1] at 16 kHz.

    Raises FileNotFoundError without espeak-ng (Debian: ``apt-get install espeak-ng``) and
    subprocess.CalledProcessError / TimeoutExpired when it fails."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise FileNotFoundError("espeak-ng is not installed (apt-get install espeak-ng)")
    wav = subprocess.run([exe, "-v", voice, "-s", str(speed), "--stdout", text],
                         check=True, capture_output=True, timeout=timeout).stdout
    return wav_samples(wav)


def wav_samples(wav: bytes) -> np.ndarray:
    """A 16-bit mono WAV file's bytes (espeak-ng writes 22050 Hz) as float32 samples in [-1, 1] at
    16 kHz.

    Raises ValueError for another sample width or more than one channel, and wave.Error or
    EOFError for bytes that are not a WAV file."""
    with wave.open(BytesIO(wav)) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        frames = w.readframes(w.getnframes())  # espeak-ng's stdout header has no length: reads to the end
    if width != 2 or channels != 1:
        raise ValueError(f"WAV of {channels} channel(s) of {8 * width}-bit audio, expected 16-bit mono")
    pcm = np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0
    if rate != SAMPLE_RATE:  # espeak-ng writes 22050 Hz: linear resampling is enough for a VAD
        n = int(round(len(pcm) * SAMPLE_RATE / rate))
        pcm = np.interp(np.arange(n) * (rate / SAMPLE_RATE), np.arange(len(pcm)), pcm).astype(np.float32)
    return pcm


@dataclass(frozen=True)
class Clip:
    """Audio with the sample ranges that hold speech."""

    audio: np.ndarray
    speech: tuple[tuple[int, int], ...]

    def chunk_labels(self, chunk: int, margin: int) -> list[bool | None]:
        """Per chunk: True when it lies inside a speech range shrunk by ``margin`` samples, False
        when it lies outside every range grown by ``margin``, None near an edge (where a VAD's
        onset and offset lag make either answer right)."""
        labels: list[bool | None] = []
        for start in range(0, len(self.audio) - chunk + 1, chunk):
            end = start + chunk
            if any(s + margin <= start and end <= e - margin for s, e in self.speech):
                labels.append(True)
            elif all(end <= s - margin or start >= e + margin for s, e in self.speech):
                labels.append(False)
            else:
                labels.append(None)
        return labels


def speech_clip(texts: list[str], *, silence_s: float = 1.0, noise: float = 0.002, seed: int = 0) -> Clip:
    """Silence, then each text spoken by espeak-ng with silence after it (``mix_speech``)."""
    return mix_speech([espeak(text) for text in texts], silence_s=silence_s, noise=noise, seed=seed)


def mix_speech(voices: list[np.ndarray], *, silence_s: float = 1.0, noise: float = 0.002, seed: int = 0) -> Clip:
    """Silence, then each voice (16 kHz samples) with silence after it; low white noise throughout
    so the silence is not digital zero. Speech ranges are where a voice's samples are above -40 dBFS."""
    rng = np.random.default_rng(seed)
    gap = np.zeros(int(silence_s * SAMPLE_RATE), np.float32)
    parts, ranges, pos = [gap], [], len(gap)
    for voice in voices:
        loud = np.flatnonzero(np.abs(voice) > 0.01)
        if len(loud):
            ranges.append((pos + int(loud[0]), pos + int(loud[-1]) + 1))
        parts += [voice, gap]
        pos += len(voice) + len(gap)
    audio = np.concatenate(parts)
    audio = (audio + rng.normal(0, noise, len(audio))).astype(np.float32)
    return Clip(audio, tuple(ranges))
