# Pinned tools for the machine builds, installed on first use. Sourced by the scripts in cross/,
# systemd/ and .ci/; defines functions only, runs nothing.
#
# Every version that decides what a machine can run is pinned here, once:
# - glibc 2.31 is JetPack 5's (Ubuntu 20.04); a binary linked against it also runs on JetPack 6
#   (2.35) and 7 (2.39). Debian 12's own aarch64 gcc links against 2.36 and yields binaries that
#   need GLIBC_2.34, which JetPack 5 cannot load.
# - cargo-zigbuild and zig together decide the glibc stubs linked against; both are pinned so a
#   new release cannot move the ceiling unnoticed (CI checks it anyway: cross/check-glibc).
# shellcheck shell=bash

EDGEWATCH_GLIBC_CEILING=2.31
EDGEWATCH_ZIGBUILD_VERSION=0.24.1
EDGEWATCH_ZIGLANG_VERSION=0.13.0
# Tools live outside the work tree so every clone on a machine shares them.
EDGEWATCH_TOOLS_DIR=${EDGEWATCH_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgewatch}
# Runtime libraries for aarch64 binaries under qemu (libc6-arm64-cross: glibc for running, not
# for linking: the link goes against zig's 2.31 stubs).
EDGEWATCH_AARCH64_SYSROOT=/usr/aarch64-linux-gnu

# The Rust target triple for a Debian architecture name.
edgewatch_triple() {
    case "$1" in
        arm64) echo aarch64-unknown-linux-gnu ;;
        amd64) echo x86_64-unknown-linux-gnu ;;
        *) echo "unknown Debian architecture: $1" >&2; return 1 ;;
    esac
}

edgewatch_as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Installs the named Debian packages that are not installed yet.
edgewatch_apt_install() {
    local missing=() package
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "Installing: ${missing[*]}"
    edgewatch_as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive edgewatch_as_root apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"
}

edgewatch_ensure_rust_target() {
    rustup target list --installed | grep -qx "$1" || rustup target add "$1"
}

# cargo-zigbuild comes from PyPI too (a prebuilt wheel, seconds instead of minutes of `cargo
# install`), in the same venv as zig; `cargo install` is the fallback where no wheel fits.
edgewatch_ensure_zigbuild() {
    edgewatch_ensure_zig
    local venv="$EDGEWATCH_TOOLS_DIR/ziglang-$EDGEWATCH_ZIGLANG_VERSION"
    if [ "$("$venv/bin/cargo-zigbuild" --version 2>/dev/null)" != "cargo-zigbuild $EDGEWATCH_ZIGBUILD_VERSION" ]; then
        "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
            "cargo-zigbuild==$EDGEWATCH_ZIGBUILD_VERSION" 2>/dev/null || true
    fi
    if [ "$("$venv/bin/cargo-zigbuild" --version 2>/dev/null)" = "cargo-zigbuild $EDGEWATCH_ZIGBUILD_VERSION" ]; then
        case ":$PATH:" in *":$venv/bin:"*) ;; *) export PATH="$venv/bin:$PATH" ;; esac
    elif [ "$(cargo-zigbuild --version 2>/dev/null)" != "cargo-zigbuild $EDGEWATCH_ZIGBUILD_VERSION" ]; then
        cargo install --locked --quiet cargo-zigbuild --version "$EDGEWATCH_ZIGBUILD_VERSION"
    fi
}

# zig comes from PyPI's `ziglang` wheel in a private venv; cargo-zigbuild runs it as
# `python -m ziglang`, told which python by CARGO_ZIGBUILD_PYTHON_PATH.
edgewatch_ensure_zig() {
    local venv="$EDGEWATCH_TOOLS_DIR/ziglang-$EDGEWATCH_ZIGLANG_VERSION"
    if [ "$("$venv/bin/python3" -m ziglang version 2>/dev/null)" != "$EDGEWATCH_ZIGLANG_VERSION" ]; then
        mkdir -p "$EDGEWATCH_TOOLS_DIR"
        rm -rf "$venv"
        if ! python3 -m venv "$venv" 2>/dev/null; then
            edgewatch_apt_install python3-venv
            python3 -m venv "$venv"
        fi
        "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check \
            "ziglang==$EDGEWATCH_ZIGLANG_VERSION"
    fi
    export CARGO_ZIGBUILD_PYTHON_PATH="$venv/bin/python3"
}

# Everything `cargo zigbuild --target <triple>.2.31` needs.
edgewatch_ensure_cross_build() {
    edgewatch_ensure_rust_target "$1"
    edgewatch_ensure_zigbuild
}

# The packages to build (third column of cross/machine-binaries): EDGEWATCH_PACKAGES if set (names
# separated by spaces), else all. Prints one per line.
edgewatch_selected_packages() {
    local all
    all=$(awk '!/^#/ && NF==3 {print $3}' cross/machine-binaries | sort -u)
    if [ -n "${EDGEWATCH_PACKAGES:-}" ]; then
        local name
        for name in $EDGEWATCH_PACKAGES; do
            grep -qx "$name" <<<"$all" || { echo "unknown package in EDGEWATCH_PACKAGES: $name" >&2; return 1; }
            echo "$name"
        done
    else
        echo "$all"
    fi
}

# Makes aarch64 executables run on this host: qemu-user-static registered with binfmt_misc (so a
# test that spawns an aarch64 binary works too), and QEMU_LD_PREFIX pointing qemu at an aarch64
# loader and libc.
edgewatch_ensure_qemu_aarch64() {
    edgewatch_apt_install qemu-user-static libc6-arm64-cross libgcc-s1-arm64-cross
    local binfmt=/proc/sys/fs/binfmt_misc
    if [ ! -e "$binfmt/register" ]; then
        edgewatch_as_root mount -t binfmt_misc binfmt_misc "$binfmt"
    fi
    if [ ! -e "$binfmt/qemu-aarch64" ]; then
        # Debian registers it through systemd-binfmt at boot; without a running systemd (containers,
        # CI machines) register the packaged entry by hand. Its F flag opens the interpreter now, so
        # it also works inside a chroot.
        edgewatch_as_root /lib/systemd/systemd-binfmt /usr/lib/binfmt.d/qemu-aarch64.conf
    fi
    export QEMU_LD_PREFIX="$EDGEWATCH_AARCH64_SYSROOT"
}
