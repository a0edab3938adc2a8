#!/usr/bin/env bash
# GPU smoke test: on a machine with an NVIDIA GPU, run the worker's discovery against the real
# driver and print the GPUs, their topology matrix and Agora's slots. Needs no Rust toolchain:
# it runs a prebuilt `agora` binary (built elsewhere with `cargo build --release -p agora-cli`).
#
#   scripts/gpu-smoke.sh [PATH-TO-AGORA]    # default: ./agora next to this script, then $PATH
#
# Exits non-zero, saying why, when there is no binary, no NVIDIA driver, or discovery fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
fail() { printf 'gpu-smoke: FAILED: %s\n' "$*" >&2; exit 1; }

agora="${1:-}"
if [ -z "$agora" ]; then
    if [ -x "$here/agora" ]; then
        agora="$here/agora"
    elif command -v agora >/dev/null 2>&1; then
        agora="$(command -v agora)"
    else
        fail "no agora binary: pass its path, or put it next to this script"
    fi
fi
[ -x "$agora" ] || fail "$agora is not an executable file"

printf 'gpu-smoke: host %s, kernel %s\n' "$(hostname)" "$(uname -r)"
if [ -r /proc/driver/nvidia/version ]; then
    printf 'gpu-smoke: driver: %s\n' "$(head -n 1 /proc/driver/nvidia/version)"
else
    printf 'gpu-smoke: no /proc/driver/nvidia/version: the NVIDIA kernel driver is not loaded\n'
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    printf 'gpu-smoke: nvidia-smi topo -m, for comparison:\n'
    nvidia-smi topo -m || true
    echo
fi

printf 'gpu-smoke: %s worker --discover\n' "$agora"
# The worker itself names the missing library (libnvidia-ml.so.1) when there is no driver.
"$agora" worker --discover ||
    fail "discovery failed (see the error above); install the NVIDIA driver, which provides libnvidia-ml.so.1"
printf 'gpu-smoke: OK\n'
