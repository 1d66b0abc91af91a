#!/usr/bin/env bash
# Installs the Debian build dependencies and builds strata into build/.
# Usage: scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libcpp-httplib-dev libmicrohttpd-dev
      libspdlog-dev libfmt-dev libcli11-dev libpcre2-dev libgtest-dev
      libxxhash-dev prometheus  # prometheus: promtool checks /metrics in the server e2e tests
      python3  # scripts/check_includes.py (the include-rule check; a ctest and .ci/run)
      git clang-format  # scripts/check_format.py (clang-format of the changed lines; .ci/run)
      clang libclang-rt-14-dev llvm  # sanitizer + libFuzzer build (fuzz/ci.sh); llvm: llvm-symbolizer
      lld)  # the linker of CI's builds (.ci/run, fuzz/ci.sh): a fraction of ld.bfd's time
# node + npm: the openai npm client (tests/e2e/js). Checked apart: a machine may have node without npm.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

# The official openai npm client for tests/e2e/js. A failure stops setup: without it the Node
# end-to-end test (tests/e2e/server/node_client_test.cc) cannot run, and it fails rather than skips.
if ! (cd tests/e2e/js && npm ci --no-audit --no-fund --loglevel=error); then
  echo "error: 'npm ci' failed in tests/e2e/js (is the npm registry reachable?); the Node e2e test needs it" >&2
  exit 1
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j"$(nproc)"
