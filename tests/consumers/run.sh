#!/usr/bin/env bash
# Builds and runs a consumer project against rdx.
#
#   run.sh find_package     SRC WORK   install rdx into WORK/prefix, then
#                                      find_package(rdx CONFIG) (and COMPONENTS cm, auth, pmix)
#   run.sh find_package_cm  SRC WORK   the same, COMPONENTS cm only: a program using rdx/cm/cm.hpp
#   run.sh add_subdirectory SRC WORK   add_subdirectory(SRC)
#   run.sh system           SRC WORK   rdx already installed in /usr (the rdx-dev
#                                      Debian package, tests/package): the consumers
#                                      of find_package mode with no prefix given, and
#                                      consumer.cpp built with `pkg-config rdx`
#
# Fails when any step fails; exits 77 only when cmake or a compiler is missing.
set -euo pipefail
mode="${1:?mode}"
src="$(cd "${2:?rdx source dir}" && pwd)"
work="$(mkdir -p "${3:?work dir}" && cd "$3" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
rm -rf "$work"
mkdir -p "$work"

step() {
  echo "+ $*"
  "$@"
}

# No flags of the consumer's own: what rdx's targets carry must be enough, and
# the compiler must see nothing rdx did not export.
case "$mode" in
  find_package | find_package_cm | system)
    if [[ "$mode" == system ]]; then
      # Found as any Debian package is: no CMAKE_PREFIX_PATH, no PKG_CONFIG_PATH.
      prefix=/usr
      at=()
      cfg="$(find /usr/share/cmake /usr/lib/cmake /usr/lib/*/cmake -maxdepth 2 \
        -name rdxConfig.cmake 2>/dev/null | head -n 1 || true)"
      [[ -n "$cfg" ]] || { echo "no rdxConfig.cmake under /usr: is rdx-dev installed?" >&2; exit 1; }
      pc=/usr/share/pkgconfig/rdx.pc
      [[ -f "$pc" ]] || { echo "no $pc: is rdx-dev installed?" >&2; exit 1; }
    else
      prefix="$work/prefix"
      at=(-DCMAKE_PREFIX_PATH="$prefix")
      step cmake -S "$src" -B "$work/rdx-build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DRDX_BUILD_TESTS=OFF -DRDX_BUILD_EXAMPLES=OFF -DRDX_BUILD_BENCHMARKS=OFF -DRDX_INSTALL=ON \
        -DCMAKE_INSTALL_PREFIX="$prefix" >"$work/rdx-configure.log" ||
        { cat "$work/rdx-configure.log"; exit 1; }
      # The dev component only: what rdx-dev holds; the programs are not built here.
      step cmake --install "$work/rdx-build" --component dev >"$work/install.log"
      cfg="$(find "$prefix" -name rdxConfig.cmake | head -n 1)"
      [[ -n "$cfg" ]] || { echo "no rdxConfig.cmake in the install tree" >&2; exit 1; }
      pc="$(find "$prefix" -name rdx.pc | head -n 1)"
      [[ -n "$pc" ]] || { echo "no rdx.pc in the install tree" >&2; exit 1; }
    fi
    test -f "$prefix/include/rdx/rdx.hpp"
    # The design notes that the headers' comments cite.
    [[ -f "$prefix/share/doc/rdx/design.md" ]] || { echo "no share/doc/rdx/design.md in the install tree" >&2; exit 1; }
    cms=(OFF ON)
    [[ "$mode" == find_package_cm ]] && cms=(ON)
    for cm in "${cms[@]}"; do
      b="$work/consumer-cm-$cm"
      step cmake -S "$here/find_package" -B "$b" "${gen[@]}" "${at[@]}" -DWITH_CM="$cm"
      # The rdx found must be the one meant (not, say, one in /usr/local).
      found="$(sed -n 's/^rdx_DIR:PATH=//p' "$b/CMakeCache.txt")"
      [[ "$(readlink -f "$found")" == "$(readlink -f "$(dirname "$cfg")")" ]] ||
        { echo "find_package(rdx) found $found, not $(dirname "$cfg")" >&2; exit 1; }
      step cmake --build "$b"
      step "$b/consumer"
    done
    if [[ "$mode" == system ]]; then
      # pkg-config: one file, built by the compiler alone with what rdx.pc says.
      [[ "$(pkg-config --variable=pcfiledir rdx)" == "$(dirname "$pc")" ]] ||
        { echo "pkg-config finds rdx.pc in $(pkg-config --variable=pcfiledir rdx), not $(dirname "$pc")" >&2; exit 1; }
      flags="$(pkg-config --cflags --libs rdx)"
      echo "pkg-config --cflags --libs rdx: $flags"
      # shellcheck disable=SC2086 # the flags are words
      step "${CXX:-c++}" -o "$work/consumer-pkg-config" "$here/consumer.cpp" $flags
      step "$work/consumer-pkg-config"
    fi
    if [[ "$mode" == find_package_cm ]]; then
      grep -q "rdx/cm/cm.hpp" <("$work/consumer-cm-ON/consumer") ||
        { echo "the consumer did not use rdx/cm/cm.hpp" >&2; exit 1; }
      exit 0
    fi
    # Where rdx::auth was installed (OpenSSL was found), the component resolves and links.
    if [[ -f "$(dirname "$cfg")/rdxAuthTargets.cmake" ]]; then
      b="$work/consumer-auth"
      step cmake -S "$here/find_package" -B "$b" "${gen[@]}" "${at[@]}" -DWITH_AUTH=ON
      step cmake --build "$b"
      step "$b/consumer"
    fi
    # A component rdx does not have must make find_package fail.
    mkdir -p "$work/bogus"
    cat >"$work/bogus/CMakeLists.txt" <<'CML'
cmake_minimum_required(VERSION 3.21)
project(bogus LANGUAGES CXX)
find_package(rdx CONFIG QUIET COMPONENTS no_such_component)
if(rdx_FOUND)
  message(FATAL_ERROR "find_package(rdx COMPONENTS no_such_component) succeeded")
endif()
CML
    step cmake -S "$work/bogus" -B "$work/bogus/build" "${gen[@]}" "${at[@]}" >/dev/null
    echo "ok: an unknown component is refused"
    # Where rdx::cuda was installed (a CUDA Toolkit exists), the component resolves.
    if [[ -f "$(dirname "$cfg")/rdxCudaTargets.cmake" ]]; then
      mkdir -p "$work/cuda"
      cat >"$work/cuda/CMakeLists.txt" <<'CML'
cmake_minimum_required(VERSION 3.21)
project(cuda_component LANGUAGES CXX)
find_package(rdx CONFIG REQUIRED COMPONENTS cuda cm)
if(NOT TARGET rdx::cuda OR NOT TARGET rdx::cm)
  message(FATAL_ERROR "find_package(rdx COMPONENTS cuda cm) did not give rdx::cuda and rdx::cm")
endif()
CML
      step cmake -S "$work/cuda" -B "$work/cuda/build" "${gen[@]}" "${at[@]}" >/dev/null
      echo "ok: COMPONENTS cuda cm"
    fi
    # Where rdx::pmix was installed (libpmix was found), the component resolves,
    # and a program using rdx/group/pmix.hpp builds and runs (outside a PMIx job).
    if [[ -f "$(dirname "$cfg")/rdxPmixTargets.cmake" ]]; then
      mkdir -p "$work/pmix"
      cat >"$work/pmix/CMakeLists.txt" <<'CML'
cmake_minimum_required(VERSION 3.21)
project(pmix_component LANGUAGES CXX)
find_package(rdx CONFIG REQUIRED COMPONENTS pmix)
if(NOT TARGET rdx::pmix OR NOT rdx_pmix_FOUND)
  message(FATAL_ERROR "find_package(rdx COMPONENTS pmix) did not give rdx::pmix")
endif()
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE rdx::pmix)
CML
      cat >"$work/pmix/main.cpp" <<'CPP'
#include <rdx/group/pmix.hpp>

#include <cstdio>

int main() {
  std::printf("launched by PMIx: %d\n", rdx::group::pmix_session::launched_by_pmix() ? 1 : 0);
  return 0;
}
CPP
      step cmake -S "$work/pmix" -B "$work/pmix/build" "${gen[@]}" "${at[@]}" >/dev/null
      step cmake --build "$work/pmix/build" >/dev/null
      step "$work/pmix/build/consumer"
      echo "ok: COMPONENTS pmix"
    fi
    ;;
  add_subdirectory)
    step cmake -S "$here/add_subdirectory" -B "$work/build" "${gen[@]}" -DRDX_SOURCE_DIR="$src"
    step cmake --build "$work/build"
    step "$work/build/consumer"
    ;;
  *)
    echo "usage: run.sh find_package|find_package_cm|add_subdirectory|system SRC WORK" >&2
    exit 2
    ;;
esac
