#!/bin/sh
# The one install script of both images (Dockerfile.cpu, Dockerfile.gpu) on every base (the
# official python image, the local mmdebstrap base, the CUDA runtime image). Two steps, run as
# root during the build:
#
#   install.sh venv SRC [EXTRAS]   build stage: /opt/trident/venv with trident from the source tree
#                                  SRC and the comma-separated EXTRAS, versions pinned by
#                                  SRC/containers/constraints.txt, its protocol modules compiled
#                                  (python -m trident.native build; NATIVE=0: left pure Python;
#                                  PINS="NAME==VERSION ...": those packages' constraints replaced);
#                                  the image's health check
#   install.sh runtime             final stage, after /opt/trident is copied in: the non-root user
#                                  trident (uid/gid 10001), /models holding the bundled example
#                                  repository (the default; mount a repository over it), and
#                                  trident, tritonserver and trident-healthcheck on PATH
#
# PYTHON names the interpreter (default python3 on PATH: /usr/local/bin/python3 in the official
# image, /usr/bin/python3 on Debian and Ubuntu).
set -eu
PREFIX=/opt/trident
VENV=$PREFIX/venv
PYTHON=${PYTHON:-python3}

step=${1:?usage: install.sh venv SRC [EXTRAS] | install.sh runtime}
case $step in
venv)
    src=${2:?install.sh venv SRC [EXTRAS]}
    extras=${3:-}
    "$PYTHON" -m venv "$VENV"
    # the constraints apply to trident's dependencies and, through the environment, to the
    # setuptools and wheel of pip's isolated build environment
    export PIP_CONSTRAINT="$src/containers/constraints.txt" PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
    if [ -n "${PINS:-}" ]; then
        # PINS (space-separated NAME==VERSION) replace those packages' lines of the constraints:
        # containers/arm64.sh pins an onnxruntime that runs under qemu emulation
        pinned=/tmp/trident-constraints.txt
        cp "$PIP_CONSTRAINT" "$pinned"
        for pin in $PINS; do
            name=${pin%%==*}
            sed -i "/^$name==/d" "$pinned"
            echo "$pin" >> "$pinned"
        done
        export PIP_CONSTRAINT="$pinned"
    fi
    "$VENV/bin/pip" install --quiet --no-compile "pip==$(sed -n 's/^pip==//p' "$PIP_CONSTRAINT")"
    "$VENV/bin/pip" install --quiet --no-compile "$src${extras:+[$extras]}"
    if [ "${NATIVE:-1}" != 0 ]; then
        # the compiled protocol modules (mypyc): a C compiler and Python's headers for this stage
        # only (the final stage copies /opt/trident, not them); mypy compiles, then goes; the
        # modules' runtime library (librt) stays
        include=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
        packages=""
        command -v cc >/dev/null 2>&1 || packages="gcc libc6-dev"
        [ -f "$include/Python.h" ] || packages="$packages python3-dev"
        if [ -n "$packages" ]; then
            apt-get update -qq
            # shellcheck disable=SC2086  # a list of package names
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages >/dev/null
        fi
        "$VENV/bin/pip" install --quiet --no-compile mypy  # the native extra (setuptools is here)
        # from / : the installed trident, not the source tree in the working directory
        (cd / && "$VENV/bin/python" -m trident.native build)
        (cd / && "$VENV/bin/python" -m trident.native status) | grep -q "9 of 9 modules compiled"
        "$VENV/bin/pip" uninstall --quiet --yes mypy
    fi
    # setuptools was only the build's (pip keeps: derived images install more extras with it)
    "$VENV/bin/pip" uninstall --quiet --yes setuptools
    { echo "#!$VENV/bin/python"; cat "$src/containers/healthcheck.py"; } > "$VENV/bin/trident-healthcheck"
    chmod 0755 "$VENV/bin/trident-healthcheck"
    # byte-compile once here (the root filesystem may be read-only at run time); tests shipped
    # inside wheels are not needed
    find "$VENV" -depth -type d \( -name tests -o -name test \) -path '*/site-packages/*' \
        ! -path '*/trident/*' -exec rm -rf {} +
    "$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null
    "$VENV/bin/trident" --help >/dev/null
    ;;
runtime)
    test -x "$VENV/bin/trident" || { echo "install.sh runtime: $VENV missing (run the venv step)" >&2; exit 1; }
    # a high uid/gid (10001, the manifests' runAsUser): no clash with a base image's users
    # (Ubuntu's 1000) or a host's when user namespaces are off
    if ! getent group trident >/dev/null; then groupadd --gid 10001 trident; fi
    if ! getent passwd trident >/dev/null; then
        useradd --uid 10001 --gid 10001 --home-dir /home/trident --create-home \
            --shell /usr/sbin/nologin trident
    fi
    for cmd in trident tritonserver trident-healthcheck; do
        ln -sf "$VENV/bin/$cmd" "/usr/local/bin/$cmd"
    done
    example=$("$VENV/bin/python" -c 'from trident.options import EXAMPLE_REPOSITORY; print(EXAMPLE_REPOSITORY)')
    rm -rf /models
    cp -r "$example" /models
    find /models -name __pycache__ -prune -exec rm -rf {} +
    chmod -R a+rX,go-w /models
    ;;
*)
    echo "install.sh: unknown step $step (venv or runtime)" >&2
    exit 2
    ;;
esac
