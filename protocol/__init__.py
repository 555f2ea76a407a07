"""Sans-IO codecs: KServe v2 JSON + binary extension, gRPC framing and messages, config.pbtxt, datatypes.

Some of these modules may be compiled (``python -m trident.native build``): extension modules
beside the sources, which Python imports instead. Importing this package checks that none of
them was compiled from a source that has changed since (trident.native): an edited module is
never silently shadowed by its old compiled form.
"""

from __future__ import annotations

import os

from trident.native import stale_native_modules

_stale = stale_native_modules(os.path.dirname(os.path.abspath(__file__)))
if _stale:
    raise ImportError(
        "compiled trident.protocol modules are older than their sources: " + ", ".join(_stale)
        + " (run `python -m trident.native build` to rebuild them, or `python -m trident.native clean`)"
    )
