"""atheris target for the config.pbtxt parser and writer (trident.protocol.pbtxt).

The input is a config.pbtxt file. It must parse into a ModelConfig or fail with PbtxtError
(INVALID_ARG with file, line and column); anything else is a bug. A parsed config must
format and parse back to the same text (formatting is compared rather than messages, so
NaN values compare equal).

Run: ``python fuzz/fuzz_pbtxt.py fuzz/corpus/pbtxt`` (needs ``pip install atheris``).
The normal test run replays the corpus through :func:`one_input` (fuzz/test_replay_pbtxt.py).
"""

from __future__ import annotations

import sys

from trident.protocol.generated.inference import ModelConfig
from trident.protocol.pbtxt import PbtxtError, format_pbtxt, parse_pbtxt


def one_input(data: bytes) -> ModelConfig | None:
    """Parse one fuzz input; the config, or None when it was rejected with PbtxtError.

    Raises only for bugs: any exception other than PbtxtError, or a failed round trip.
    """
    try:
        config = parse_pbtxt(data, filename="fuzz.pbtxt")
    except PbtxtError as exc:
        assert exc.message.startswith(f"fuzz.pbtxt:{exc.line}:{exc.column}: ")
        assert exc.line >= 1 and exc.column >= 1
        return None
    text = format_pbtxt(config)
    again = parse_pbtxt(text, filename="formatted.pbtxt")
    assert format_pbtxt(again) == text
    return config


def main() -> None:
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
