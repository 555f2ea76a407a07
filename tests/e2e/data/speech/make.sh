#!/bin/sh
# The speech of tests/e2e/test_streaming_audio.py, made once with espeak-ng and committed, so the
# test run needs no speech synthesizer. Each file is espeak-ng's own output (a 16-bit mono WAV at
# 22050 Hz, as `espeak-ng --stdout` writes it), gzipped. Made with Debian 12's espeak-ng
# 1.51+dfsg-10+deb12u2 (apt-get install espeak-ng), which writes these same bytes each run.
# Run from this folder: sh make.sh
set -eu
espeak-ng -v en -s 160 --stdout "Hello there, this is a test." | gzip -9n >hello_there.wav.gz
espeak-ng -v en -s 160 --stdout "Streaming speech detection works." | gzip -9n >streaming_speech_detection.wav.gz
