#!/usr/bin/env bash
# The compose stack's images built on this machine, with no container registry:
#   fedqueue-debian:bookworm    Debian bookworm (debootstrap --variant=minbase), imported with `docker import`
#   fedqueue-python:bookworm    + Debian's python3 in a venv, torch and torchvision from PyPI (the Makefile's pins)
#   fedqueue:bookworm           workers/Dockerfile on fedqueue-python (workers, Flower, the CLI)
#   fedqueue-redis:bookworm     Debian's redis-server
#   fedqueue-postgres:bookworm  Debian's PostgreSQL 15, set up from POSTGRES_USER/_DB/_PASSWORD on first start
# A second run reuses what exists: the Debian image if it is there, the rest through Docker's build
# cache (only layers whose inputs changed are built again). FEDQUEUE_IMAGES_REBUILD=1 starts from Debian.
# Needs root and Debian's archive (it installs docker.io, debootstrap and docker-compose where missing,
# and starts dockerd where no engine answers); PyPI for the Python image.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="${FEDQUEUE_IMAGES_TAG:-bookworm}"
SUITE="${FEDQUEUE_DEBIAN_SUITE:-bookworm}"
MIRROR="${FEDQUEUE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_IMAGE="fedqueue-debian:$TAG"
DOCKER="${DOCKER:-docker}"

say() { printf '%s images: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
exists() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# On a bare Debian machine: Debian's Docker engine, debootstrap and docker-compose, and dockerd
# started in the background where nothing (systemd) starts it.
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v docker-compose >/dev/null || missing+=(docker-compose)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
if ! "$DOCKER" info >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null; then
    say "starting dockerd (log: /var/log/fedqueue-dockerd.log)"
    nohup dockerd >/var/log/fedqueue-dockerd.log 2>&1 &
    for _ in $(seq 60); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done
fi
"$DOCKER" info >/dev/null 2>&1 || { echo "images: no Docker engine answers (start dockerd first)" >&2; exit 1; }

NO_CACHE=()
if [ "${FEDQUEUE_IMAGES_REBUILD:-0}" = 1 ]; then
    # Every image again, from debootstrap on: the ones built on Debian first, then Debian itself.
    for image in "fedqueue:$TAG" "fedqueue-python:$TAG" "fedqueue-postgres:$TAG" "fedqueue-redis:$TAG" "$DEBIAN_IMAGE"; do
        "$DOCKER" image rm "$image" >/dev/null 2>&1 || true
    done
    exists "$DEBIAN_IMAGE" && { echo "images: $DEBIAN_IMAGE is in use (docker ps -a); not rebuilt" >&2; exit 1; }
    NO_CACHE=(--no-cache)
fi

if exists "$DEBIAN_IMAGE"; then
    say "$DEBIAN_IMAGE is there: reused"
else
    command -v debootstrap >/dev/null || { echo "images: debootstrap is missing (apt-get install debootstrap)" >&2; exit 1; }
    root="$(mktemp -d "${TMPDIR:-/tmp}/fedqueue-rootfs.XXXXXX")"
    trap 'rm -rf "$root"' EXIT
    say "debootstrap --variant=minbase $SUITE from $MIRROR"
    debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
        || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
    rm -f "$root.log"
    # What a base image leaves out: apt's downloaded packages and lists (apt-get update fetches them again).
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    say "docker import $DEBIAN_IMAGE"
    tar -C "$root" -c . | "$DOCKER" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["bash"]' \
        - "$DEBIAN_IMAGE" >/dev/null
    rm -rf "$root"
    trap - EXIT
fi

build() {  # build IMAGE DOCKERFILE CONTEXT [ARGS...]
    local image="$1" dockerfile="$2" context="$3" log previous
    shift 3
    log="$(mktemp)"
    previous="$("$DOCKER" image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    say "docker build $image"
    if ! "$DOCKER" build --force-rm "${NO_CACHE[@]}" -t "$image" -f "$dockerfile" --build-arg "DEBIAN_IMAGE=$DEBIAN_IMAGE" "$@" "$context" >"$log" 2>&1; then
        tail -40 "$log" >&2
        rm -f "$log"
        exit 1
    fi
    rm -f "$log"
    # The image this build replaced, left without a name: removed (kept while a container uses it).
    if [ -n "$previous" ] && [ "$previous" != "$("$DOCKER" image inspect -f '{{.Id}}' "$image")" ]; then
        "$DOCKER" image rm "$previous" >/dev/null 2>&1 || true
    fi
}

# The same torch and torchvision as `make install` puts in .venv: runs in containers match runs here.
read -r TORCH TORCHVISION < <(sed -n 's/.*torch==\([0-9.]*\) torchvision==\([0-9.]*\).*/\1 \2/p' Makefile)

build "fedqueue-redis:$TAG" images/redis.Dockerfile images
build "fedqueue-postgres:$TAG" images/postgres.Dockerfile images
# The Python image's context: its Dockerfile and this machine's CA bundle (pip inside trusts what the host does).
context="$(mktemp -d "${TMPDIR:-/tmp}/fedqueue-python.XXXXXX")"
trap 'rm -rf "$context"' EXIT
cp images/python.Dockerfile "$context/"
CA_BUNDLE="${FEDQUEUE_IMAGES_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
if [ -s "$CA_BUNDLE" ]; then cp "$CA_BUNDLE" "$context/build-host-ca.crt"; else : >"$context/build-host-ca.crt"; fi
build "fedqueue-python:$TAG" "$context/python.Dockerfile" "$context" \
    --build-arg "TORCH_VERSION=${TORCH:?no torch pin in the Makefile}" --build-arg "TORCHVISION_VERSION=$TORCHVISION"
rm -rf "$context"
trap - EXIT
# The fedqueue image from what workers/Dockerfile copies, and nothing else of the working tree
# (other virtual environments, data, runs): the context stays small whatever lies beside the code.
context="$(mktemp -d "${TMPDIR:-/tmp}/fedqueue-image.XXXXXX")"
trap 'rm -rf "$context"' EXIT
tar -c --exclude=__pycache__ --exclude='*.egg-info' --exclude='*.pyc' \
    pyproject.toml README.md fedqueue examples workers/Dockerfile | tar -x -C "$context"
build "fedqueue:$TAG" "$context/workers/Dockerfile" "$context" --build-arg "BASE_IMAGE=fedqueue-python:$TAG"
rm -rf "$context"
trap - EXIT

"$DOCKER" image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep -E "^fedqueue(-[a-z]+)?:$TAG " >&2
