# shellcheck shell=bash
# Sourced by containers/*.sh: podman settings that let containers run on this host.
# Inside an unprivileged-for-rlimits container (no CAP_SYS_RESOURCE) podman's default ulimits
# (nofile 1048576) cannot be set, and crun refuses cgroup v1/v2 hybrid hosts; a generated
# containers.conf (CONTAINERS_CONF) then sets ulimits within the current hard limits and runc.
# On an ordinary host the file changes nothing that matters.
trident_podman_env() {
    local conf=${TMPDIR:-/tmp}/trident-containers.conf nofile nproc runtime=""
    nofile=$(ulimit -Hn)
    nproc=$(ulimit -Hu)
    [[ $nofile == unlimited || $nofile -gt 1048576 ]] && nofile=1048576
    # runc applies RLIMIT_NPROC in the container's user; above ~32k it fails here for root too
    [[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
    if [[ ! -f /sys/fs/cgroup/cgroup.controllers ]] && command -v runc >/dev/null; then
        runtime='runtime = "runc"'
    fi
    printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n[engine]\n%s\n' \
        "$nofile" "$nofile" "$nproc" "$nproc" "$runtime" >"$conf"
    export CONTAINERS_CONF=$conf
}
trident_podman_env
