"""The custom resources of the monitoring.coreos.com group in the given YAML files, one JSON
object a line ({"source": path, "object": resource}), for crd-check/check_crds.mjs.

Usage: python containers/check_crds_input.py FILE... | node check_crds.mjs
"""

from __future__ import annotations

import json
import sys

import yaml

for path in sys.argv[1:]:
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc and str(doc.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
                print(json.dumps({"source": path, "object": doc}))
