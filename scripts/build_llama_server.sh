#!/usr/bin/env bash
# Build llama.cpp once, from the llama.cpp source that llama-cpp-python's sdist ships
# (vendor/llama.cpp, with tools/server), as shared libraries plus llama-server, and install
# llama-server into .venv (and, with --llamacpp, llama-cpp-python running those same libraries).
#   scripts/build_llama_server.sh              llama-server only
#   scripts/build_llama_server.sh --llamacpp   also llama-cpp-python, its own compile switched off
#                                              (-DLLAMA_BUILD=OFF) and the libraries of this build
#                                              put where it loads them (llama_cpp/lib)
# (scripts/install.sh --llama-server calls this, with --llamacpp under --dev/--llamacpp.)
# Layout: the binary and its libraries (libllama, libggml*, libmtmd, ...) sit together in
# .venv/lib/llama-server/, each with RUNPATH $ORIGIN; .venv/bin/llama-server is a symlink to it
# (the loader takes $ORIGIN from the resolved path). The build is cached under
# ~/.cache/gate/llama-server/<source version>-<flags hash>/, so a fresh clone on the same machine
# copies it instead of rebuilding (about 5 minutes on 2 cores).
# Environment:
#   LLAMA_SERVER_SOURCE  the sdist to build from (default llama-cpp-python==0.3.36, the version
#                        gate[llamacpp] runs; with --llamacpp that same sdist is installed, so
#                        `--engine llama-server` and `--engine llamacpp` run the same build)
#   LLAMA_SERVER_CMAKE_ARGS  extra cmake flags (e.g. -DGGML_NATIVE=ON for this CPU's kernels)
#   CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
with_llamacpp=0
for arg in "$@"; do
  case "$arg" in
    --llamacpp) with_llamacpp=1 ;;
    *) echo "usage: scripts/build_llama_server.sh [--llamacpp]" >&2; exit 2 ;;
  esac
done
# Shared libraries with RUNPATH $ORIGIN on Linux; elsewhere (macOS: @loader_path, .dylib, not
# done here) a static llama-server alone, as before, and no --llamacpp.
shared=0
[ "$(uname -s)" = Linux ] && shared=1
if [ "$with_llamacpp" = 1 ] && [ "$shared" = 0 ]; then
  echo "scripts/build_llama_server.sh --llamacpp: Linux only (elsewhere pip builds llama-cpp-python)" >&2
  exit 2
fi
source_spec=${LLAMA_SERVER_SOURCE:-llama-cpp-python==0.3.36}
version=${source_spec#*==}
# GGML_NATIVE=OFF: the portable AVX2/FMA/F16C kernels, not -march=native, so the cached build
# runs on any such CPU. Shared libraries with RUNPATH $ORIGIN (set at build time, nothing is
# relinked on install), so the binary and the libraries need nothing but each other (or, off
# Linux, static libraries: the binary needs nothing from the build tree). The web UI
# is not built and not downloaded (LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF): the sdist has
# no prebuilt UI assets and gate needs only the HTTP API; the server then embeds an empty table.
flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF)
[ "$shared" = 1 ] && flags=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
)
flags+=(
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF "-DLLAMA_BUILD_COMMIT=llama-cpp-python-$version"
)
# shellcheck disable=SC2206
flags+=(${LLAMA_SERVER_CMAKE_ARGS:-})
key="$version-$(printf '%s\n' "${flags[@]}" "$(uname -m)" | sha256sum | cut -c1-12)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gate/llama-server/$key"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ ! -x "$cache/llama-server" ] || { [ "$shared" = 1 ] && [ ! -e "$cache/libllama.so" ]; }; then
  echo "llama-server: building llama.cpp from $source_spec (cached afterwards in $cache)" >&2
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
  # Atomic: the cache directory appears whole under its name or not at all (a leftover without
  # the library is not a cache entry: replaced).
  mkdir -p "$(dirname "$cache")"
  rm -rf "$cache"
  staged="$cache.tmp.$$"
  mkdir "$staged"
  cp -a "$work/build/bin/llama-server" "$staged/"
  [ "$shared" = 0 ] || cp -a "$work"/build/bin/lib*.so* "$staged/"
  mv -T "$staged" "$cache" 2>/dev/null || rm -rf "$staged"
fi
# Into the venv, the same way: a staged copy renamed over the old one.
dest=.venv/lib/llama-server
rm -rf "$dest.tmp.$$"
cp -a "$cache" "$dest.tmp.$$"
rm -rf "$dest"
mv -T "$dest.tmp.$$" "$dest"
ln -sfn ../lib/llama-server/llama-server ".venv/bin/llama-server.tmp.$$"
mv -T ".venv/bin/llama-server.tmp.$$" .venv/bin/llama-server
.venv/bin/llama-server --version 2>&1 | sed 's/^/llama-server: /' >&2
if [ "$with_llamacpp" = 1 ]; then
  # llama-cpp-python from the same sdist, its CMake build switched off (LLAMA_BUILD=OFF: a pure
  # Python wheel, seconds). --no-cache-dir: pip's wheel cache keys a built wheel by the sdist
  # alone, so a cached library-less wheel would later be taken by a plain `pip install` of it.
  CMAKE_ARGS="-DLLAMA_BUILD=OFF" .venv/bin/python -m pip install --disable-pip-version-check -q \
    --no-cache-dir "$source_spec"
  lib=$(.venv/bin/python -c 'import importlib.util, pathlib; s = importlib.util.find_spec("llama_cpp"); print(pathlib.Path(s.origin).parent / "lib")')
  mkdir -p "$lib"
  cp -a "$dest"/lib*.so* "$lib/"
  .venv/bin/python -c 'import llama_cpp; print("llama-cpp-python:", llama_cpp.__version__, "on", llama_cpp.llama_cpp._base_path)' >&2
fi
