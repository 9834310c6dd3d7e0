#!/usr/bin/env bash
# Build llama.cpp's llama-server from the llama.cpp source that llama-cpp-python's sdist ships
# (vendor/llama.cpp, with tools/server), and put it at .venv/bin/llama-server.
#   scripts/build_llama_server.sh            (scripts/install.sh --llama-server calls this)
# The built binary is cached under ~/.cache/gate/llama-server/<source version>-<flags hash>/, so
# a fresh clone on the same machine copies it instead of rebuilding (about 5 minutes on 2 cores).
# Environment:
#   LLAMA_SERVER_SOURCE  the sdist to build from (default llama-cpp-python==0.3.36, the version
#                        gate[llamacpp] runs, so `--engine llama-server` and `--engine llamacpp`
#                        run the same llama.cpp)
#   LLAMA_SERVER_CMAKE_ARGS  extra cmake flags (e.g. -DGGML_NATIVE=ON for this CPU's kernels)
#   CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
source_spec=${LLAMA_SERVER_SOURCE:-llama-cpp-python==0.3.36}
version=${source_spec#*==}
# Like the library build in scripts/install.sh: GGML_NATIVE=OFF, so the kernels are the
# portable AVX2/FMA/F16C set and the cached binary runs on any such CPU. Static libraries, so the
# binary needs nothing from the build tree. The web UI is not built and not downloaded
# (LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF): the sdist has no prebuilt UI assets and gate
# needs only the HTTP API; the server then embeds an empty asset table.
flags=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF "-DLLAMA_BUILD_COMMIT=llama-cpp-python-$version"
)
# shellcheck disable=SC2206
flags+=(${LLAMA_SERVER_CMAKE_ARGS:-})
key="$version-$(printf '%s\n' "${flags[@]}" "$(uname -m)" | sha256sum | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gate/llama-server/$key"
if [ ! -x "$cache/llama-server" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "llama-server: building from $source_spec (cached afterwards in $cache)" >&2
  .venv/bin/python -m pip download --disable-pip-version-check -q --no-deps --no-binary :all: \
    "$source_spec" -d "$work"
  tar xzf "$work"/*.tar.gz -C "$work"
  src=$(echo "$work"/*/vendor/llama.cpp)
  [ -f "$src/tools/server/CMakeLists.txt" ] || { echo "llama-server: $source_spec has no tools/server" >&2; exit 1; }
  # Built outside any git checkout: llama.cpp's build info would read the enclosing repository.
  cmake -S "$src" -B "$work/build" "${flags[@]}" >"$work/cmake.log" 2>&1 \
    || { tail -30 "$work/cmake.log" >&2; exit 1; }
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    cmake --build "$work/build" --target llama-server >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log" >&2; exit 1; }
  mkdir -p "$cache"
  # Atomic: a half-copied binary is never found under the cache's name.
  cp "$work/build/bin/llama-server" "$cache/llama-server.tmp.$$"
  mv "$cache/llama-server.tmp.$$" "$cache/llama-server"
fi
cp "$cache/llama-server" ".venv/bin/llama-server.tmp.$$"
mv ".venv/bin/llama-server.tmp.$$" .venv/bin/llama-server
.venv/bin/llama-server --version 2>&1 | sed 's/^/llama-server: /' >&2
