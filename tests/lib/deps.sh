# shellcheck shell=bash
# shellcheck disable=SC2034 # the package lists are read by the scripts that source this file
# What Atrium needs from the machine, in one place: the Debian package lists, the function
# that installs them, the cmake configure step and the server stop the scripts share.
#
# Sourced (never executed) by deploy/run-local.sh, tests/run.sh, tests/lib/pg.sh and the
# bench scripts, so the run command and the test command cannot drift apart on what a
# fresh Debian 12 machine needs. `atrium_need_packages pkg...` installs only the missing
# packages: dpkg-query decides what is missing, `apt-get update` runs at most once per
# process, and nothing is asked interactively (CI runs with no stdin). It needs root, or
# sudo for a non-root user; otherwise it stops with the command the operator should run.
# deploy/Dockerfile repeats the build and runtime lists for its two stages.

# Building the server and its plugins. CMake also configures the tests in every build,
# so cmocka and the Python interpreter (integration tests) are needed to configure at all.
ATRIUM_BUILD_PACKAGES=(
    build-essential cmake pkg-config
    libmicrohttpd-dev libcurl4-openssl-dev libpq-dev libwebp-dev
    libjansson-dev libsodium-dev libyaml-dev libcmocka-dev
    libgnutls28-dev  # the federation listener's TLS certificate (reloaded on SIGHUP)
    libc-ares-dev  # federation: asynchronous DNS (SRV, A/AAAA with TTLs) for discovery
    libvips-dev  # media plugin: image decoding (links libwebp, libjpeg, libpng, giflib)
    python3
)

# Running the server from a checkout (deploy/run-local.sh): the private PostgreSQL
# cluster, psql to create its database, curl to wait for /health.
ATRIUM_RUNTIME_PACKAGES=(
    postgresql postgresql-client curl ca-certificates
)

# Running the test suite (tests/run.sh) on top of build + runtime (the integration tests
# need python3, already a build package, plus psql and curl from the runtime list).
ATRIUM_TEST_PACKAGES=(
    libvips-tools  # media tests: `vips`/`vipsheader` make JPEGs and decode WebP answers
    python3-matrix-nio  # test_matrix_nio: the Python SDK that speaks only the r0 prefixes
    clang          # the fuzzing suite (tests/fuzz, build-fuzz/): libFuzzer ships with it
    haproxy        # test_scaleout, bench/scaleout.sh: the balancer in front of several processes
    ccache         # tests/run.sh compiles its four trees through it (a second run recompiles
                   # only what changed, whatever the clone's path)
    # The E2E tests (matrix-js-sdk) need Node.js >= 20, which the machines bring;
    # tests/run.sh installs Debian's nodejs and npm only where node is missing.
)

# The S3 tests (tests/integration/test_media_s3.py, tests/lib/rgw.sh): a throwaway one-node
# Ceph cluster with the RADOS Gateway (about 350 MB installed, 2 minutes). tests/run.sh
# installs them and goes on when it cannot; the S3 tests then skip, saying why.
ATRIUM_S3_TEST_PACKAGES=(
    ceph-mon ceph-osd radosgw ceph-common
)

# The deploy test (tests/integration/test_deploy_podman.py, ctest label `deploy`): the
# Compose files of deploy/ run for real with podman in place of a Docker engine,
# docker-compose on podman's socket (without its recommended docker.io), and a base image
# made with debootstrap. The test installs them on first use and skips where it cannot.
ATRIUM_DEPLOY_TEST_PACKAGES=(
    podman buildah runc netavark aardvark-dns iptables catatonit
    docker-compose debootstrap
)

# Load figures (bench/).
ATRIUM_BENCH_PACKAGES=(
    wrk
    nginx-light libvips-tools  # bench/media_*.sh: the baselines beside Atrium
    libjpeg-turbo-progs        # djpeg: bench/media_gallery.sh's decode floor
)

# Set once `apt-get update` has run in this process.
ATRIUM_APT_UPDATED=${ATRIUM_APT_UPDATED:-0}

# Prints "[atrium] message" on stderr: progress for the operator, never mixed with
# output a caller may capture.
atrium_say() {
    printf '[atrium] %s\n' "$*" >&2
}

# Prints an error and exits the calling script.
atrium_die() {
    printf '[atrium] ERROR: %s\n' "$*" >&2
    exit 1
}

# True when the Debian package is installed (not merely known or half-configured).
atrium_package_installed() {
    local status
    status=$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) || return 1
    [ "$status" = installed ]
}

# Runs a command as root: directly when we are root, else through sudo.
atrium_as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo "$@"
    fi
}

# atrium_need_packages pkg...: installs the packages that are not installed yet.
atrium_need_packages() {
    local missing=() pkg
    for pkg in "$@"; do
        atrium_package_installed "$pkg" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0

    command -v apt-get >/dev/null 2>&1 ||
        atrium_die "apt-get not found: this script expects Debian 12; install these packages yourself: ${missing[*]}"
    if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
        atrium_die "missing Debian packages: ${missing[*]}. Installing them needs root and sudo is not installed: run this as root, or have an administrator run: apt-get install ${missing[*]}"
    fi
    atrium_say "installing missing Debian packages: ${missing[*]}"
    # Wait for a dpkg lock held by e.g. unattended-upgrades on a freshly booted machine
    # instead of failing at once.
    local apt_opts=(-o DPkg::Lock::Timeout=600 -o Dpkg::Use-Pty=0)
    if [ "$ATRIUM_APT_UPDATED" != 1 ]; then
        atrium_as_root env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" -q update ||
            atrium_die "apt-get update failed; check the network and /etc/apt/sources.list*"
        ATRIUM_APT_UPDATED=1
    fi
    atrium_as_root env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" -q -y \
        --no-install-recommends install "${missing[@]}" ||
        atrium_die "could not install: ${missing[*]}"
}

# atrium_configure_tree SOURCE_DIR BUILD_DIR [CMAKE ARGS...]: cmake configure. A build
# tree configured for another source directory (a moved or copied checkout) is
# reconfigured from scratch; anything else in it (build/test-pg, say) is left alone.
atrium_configure_tree() {
    local src=$1 dir=$2
    shift 2
    if [ -f "$dir/CMakeCache.txt" ] &&
        ! grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$src" "$dir/CMakeCache.txt"; then
        atrium_say "$dir was configured for another source directory; reconfiguring"
        rm -rf "$dir/CMakeCache.txt" "$dir/CMakeFiles"
    fi
    cmake -S "$src" -B "$dir" "$@" || atrium_die "cmake could not configure $dir"
}

# atrium_stop_pid PID GRACE_S: SIGTERM, up to GRACE_S seconds for PID to exit, then
# SIGKILL; reaps it (it is the caller's child). Returns 1 when it had to be killed.
atrium_stop_pid() {
    local pid=$1 grace_s=$2 waited=0 killed=0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $((grace_s * 10)) ]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
            killed=1
        fi
    fi
    wait "$pid" 2>/dev/null || true
    return "$killed"
}
