"""``python -m trident`` is the ``trident`` command."""

import sys

from trident.cli import main

sys.exit(main())
