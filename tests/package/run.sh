#!/usr/bin/env bash
# rdx's Debian packages (cmake/RdxPackaging.cmake), made and used for real.
#
#   run.sh build   SRC WORK        configure SRC afresh in WORK (examples on, tests,
#                                  benchmarks and CUDA off), build, cpack -G DEB into
#                                  WORK/debs, and check both packages with dpkg-deb
#   run.sh install SRC WORK DEBS   as root: dpkg -i the packages in DEBS, build the
#                                  consumers against /usr (tests/consumers/run.sh
#                                  system), run the programs' --help, then dpkg
#                                  --purge both and check that nothing is left
#
# Environment (set by tests/package/CMakeLists.txt): RDX_CMAKE and RDX_CPACK (the
# cmake and cpack to use), RDX_VERSION (the project's version), RDX_EXPECT_DOCTOR
# (1 where the target rdx-doctor exists).
#
# Exits 77 (skipped) where dpkg-deb is missing (not Debian) and, for install,
# when not root. An rdx-dev or rdx-tools this test did not install is never
# removed: the test fails instead.
set -euo pipefail
mode="${1:?mode}"
src="$(cd "${2:?rdx source dir}" && pwd)"
work="${3:?work dir}"
cmake="${RDX_CMAKE:-cmake}"
cpack="${RDX_CPACK:-cpack}"
version="${RDX_VERSION:?RDX_VERSION (the project version)}"
packages=(rdx-dev rdx-tools)
programs=(rdx-devinfo rdx-pingpong rdx-kv-window rdx-doctor)

step() {
  echo "+ $*"
  "$@"
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
skip() {
  echo "SKIP: $*"
  exit 77
}

command -v dpkg-deb >/dev/null || skip "no dpkg-deb: not a Debian system"
arch="$(dpkg --print-architecture)"
dev_deb="rdx-dev_${version}_all.deb"
tools_deb="rdx-tools_${version}_${arch}.deb"

# Paths in a package, as dpkg-deb -c prints them (./usr/...).
contents() { dpkg-deb -c "$1" | awk '{ print $6 }'; }
has() { grep -qxF "$2" "$1" || fail "$(basename "${1%.contents}") lacks $2"; }

do_build() {
  local b="$work/build" t0 t
  for tool in dpkg-shlibdeps:dpkg-dev file:file; do
    command -v "${tool%%:*}" >/dev/null ||
      fail "cpack needs ${tool%%:*} for rdx-tools' Depends: apt-get install ${tool#*:}"
  done
  rm -rf "$work"
  mkdir -p "$work"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  t0=$SECONDS
  step "$cmake" -S "$src" -B "$b" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DRDX_BUILD_TESTS=OFF -DRDX_BUILD_EXAMPLES=ON -DRDX_BUILD_BENCHMARKS=OFF -DRDX_INSTALL=ON \
    -DRDX_CUDA=OFF >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
  step "$cmake" --build "$b" -j 2 >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; fail "build"; }
  t=$SECONDS
  echo "configure and build: $((t - t0))s"
  step "$cpack" --config "$b/CPackConfig.cmake" -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1 ||
    { cat "$work/cpack.log"; fail "cpack"; }
  echo "cpack: $((SECONDS - t))s"
  local dev="$work/debs/$dev_deb" tools="$work/debs/$tools_deb"
  [[ -f "$dev" ]] || fail "no $dev_deb; cpack made: $(cd "$work/debs" && find . -name "*.deb" | tr '\n' ' ')"
  [[ -f "$tools" ]] || fail "no $tools_deb; cpack made: $(cd "$work/debs" && find . -name "*.deb" | tr '\n' ' ')"

  # rdx-dev: architecture-independent, everything a consumer builds against.
  field() { dpkg-deb -f "$1" "$2"; }
  [[ "$(field "$dev" Package)" == rdx-dev ]] || fail "$dev_deb is package $(field "$dev" Package)"
  [[ "$(field "$dev" Architecture)" == all ]] || fail "rdx-dev is Architecture: $(field "$dev" Architecture), not all"
  [[ "$(field "$dev" Version)" == "$version" ]] || fail "rdx-dev is version $(field "$dev" Version), not $version"
  [[ "$(field "$dev" Depends)" == *libibverbs-dev* ]] || fail "rdx-dev does not depend on libibverbs-dev"
  [[ -n "$(field "$dev" Maintainer)" && -n "$(field "$dev" Description)" ]] || fail "rdx-dev lacks Maintainer or Description"
  contents "$dev" >"$work/rdx-dev.contents"
  local c="$work/rdx-dev.contents" f
  for f in include/rdx/rdx.hpp share/cmake/rdx/rdxConfig.cmake share/cmake/rdx/rdxConfigVersion.cmake \
    share/cmake/rdx/rdxTargets.cmake share/cmake/rdx/FindIBVerbs.cmake share/cmake/rdx/FindRDMACM.cmake \
    share/pkgconfig/rdx.pc share/doc/rdx-dev/copyright share/doc/rdx/design.md; do
    has "$c" "./usr/$f"
  done
  if [[ -f /usr/include/rdma/rdma_cma.h ]]; then
    has "$c" ./usr/share/cmake/rdx/rdxCmTargets.cmake
  fi
  # Every public header, and nothing outside /usr nor any program or library.
  while IFS= read -r f; do
    has "$c" "./usr/include/$f"
  done < <(cd "$src/include" && find rdx -type f \( -name '*.hpp' -o -name '*.cuh' \) | sort)
  f="$(grep -v -e '^\./usr/' -e '^\./$' "$c" || true)"
  [[ -z "$f" ]] || fail "rdx-dev has files outside /usr: $f"
  ! grep -qE '^\./usr/(bin|sbin|lib)/.' "$c" || fail "rdx-dev holds programs or libraries"
  f="$(dpkg-deb --fsys-tarfile "$dev" | tar -xO ./usr/share/pkgconfig/rdx.pc)"
  grep -qx 'prefix=/usr' <<<"$f" || fail "rdx-dev's rdx.pc does not say prefix=/usr: $f"

  # rdx-tools: this architecture, rdx-* programs, Depends from dpkg-shlibdeps.
  [[ "$(field "$tools" Package)" == rdx-tools ]] || fail "$tools_deb is package $(field "$tools" Package)"
  [[ "$(field "$tools" Architecture)" == "$arch" ]] || fail "rdx-tools is Architecture: $(field "$tools" Architecture), not $arch"
  [[ "$(field "$tools" Depends)" == *libibverbs1* ]] ||
    fail "rdx-tools' Depends ($(field "$tools" Depends)) lacks libibverbs1: did dpkg-shlibdeps run?"
  contents "$tools" >"$work/rdx-tools.contents"
  c="$work/rdx-tools.contents"
  for f in rdx-devinfo rdx-pingpong rdx-kv-window; do
    has "$c" "./usr/bin/$f"
  done
  # rdx-doctor once its target exists (here, or in the build that runs this test).
  if [[ "${RDX_EXPECT_DOCTOR:-0}" == 1 || -n "$(find "$b" -type f -name rdx-doctor -perm -u+x)" ]]; then
    has "$c" ./usr/bin/rdx-doctor
  fi
  has "$c" ./usr/share/doc/rdx-tools/copyright
  f="$(grep -E '^\./usr/bin/.' "$c" | grep -v '^\./usr/bin/rdx-' || true)"
  [[ -z "$f" ]] || fail "rdx-tools has programs not named rdx-*: $f"

  for p in "$dev" "$tools"; do
    echo
    echo "$(basename "$p"): $(stat -c %s "$p") bytes, $(grep -cv '/$' "$work/$(field "$p" Package).contents") files"
    dpkg-deb -f "$p" Package Version Architecture Depends Recommends Suggests | sed 's/^/  /'
  done
  echo "  rdx-tools: $(grep '^\./usr/bin/.' "$work/rdx-tools.contents" | sed 's|^\./usr/bin/||' | tr '\n' ' ')"
}

# Not installed: unknown to dpkg, or only its (absent) configuration left.
installed() {
  local s
  s="$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null || true)"
  [[ -n "$s" && "${s:1:1}" != n && "${s:1:1}" != c ]]
}

do_install() {
  local debs="${4:?debs dir}" p f
  # Global: the EXIT trap reads it.
  marker="$work.installed"
  ((EUID == 0)) || skip "dpkg -i needs root (this is how CI runs it: sudo scripts/quickstart.sh test)"
  [[ -f "$debs/$dev_deb" && -f "$debs/$tools_deb" ]] ||
    fail "no $dev_deb and $tools_deb in $debs: package_deb_build makes them"
  # A marker from a run of this test that was killed keeps its packages removable.
  if [[ -f "$marker" ]]; then
    echo "a previous run of this test was stopped with the packages installed: removing them"
    dpkg --purge "${packages[@]}" || fail "dpkg --purge ${packages[*]} (left by a previous run)"
    rm -f "$marker"
  fi
  for p in "${packages[@]}"; do
    ! installed "$p" || fail "$p is installed already (not by this test): remove it first (dpkg -r $p); it is left alone"
  done
  for f in /usr/include/rdx /usr/share/cmake/rdx /usr/lib/cmake/rdx /usr/share/pkgconfig/rdx.pc \
    /usr/local/include/rdx /usr/local/share/cmake/rdx /usr/local/lib/cmake/rdx /usr/local/share/pkgconfig/rdx.pc \
    "${programs[@]/#//usr/bin/}"; do
    [[ ! -e "$f" ]] || fail "$f exists, from no rdx package (cmake --install?): it would hide or be overwritten by the package; remove it first"
  done
  rm -rf "$work"
  mkdir -p "$work"

  cleanup() {
    local rc=$?
    if [[ -f "$marker" ]]; then
      echo "+ dpkg --purge ${packages[*]} (cleaning up)"
      dpkg --purge "${packages[@]}" >/dev/null || rc=1
      rm -f "$marker"
    fi
    exit "$rc"
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM HUP
  touch "$marker"
  step dpkg -i "$debs/$dev_deb" "$debs/$tools_deb" ||
    fail "dpkg -i: their dependencies (libibverbs-dev, libibverbs1, librdmacm1) must be installed first"
  dpkg-query -L rdx-dev rdx-tools | sort -u >"$work/installed-paths"
  [[ "$(dpkg -S /usr/include/rdx/rdx.hpp)" == rdx-dev:* ]] || fail "/usr/include/rdx/rdx.hpp is not rdx-dev's"

  step "$src/tests/consumers/run.sh" system "$src" "$work/consumers"
  for p in "${programs[@]}"; do
    if [[ -e "/usr/bin/$p" ]]; then
      [[ "$(dpkg -S "/usr/bin/$p")" == rdx-tools:* ]] || fail "/usr/bin/$p is not rdx-tools'"
      step "/usr/bin/$p" --help >"$work/$p.help" || fail "/usr/bin/$p --help failed"
      echo "ok: /usr/bin/$p --help ($(wc -l <"$work/$p.help") lines)"
    elif [[ "$p" != rdx-doctor || "${RDX_EXPECT_DOCTOR:-0}" == 1 ]]; then
      fail "rdx-tools did not install /usr/bin/$p"
    fi
  done

  step dpkg --purge "${packages[@]}"
  rm -f "$marker"
  for p in "${packages[@]}"; do
    ! installed "$p" || fail "$p is still installed after dpkg --purge"
    f="$(dpkg -l 2>/dev/null | grep -E "^[a-z][a-zA-Z] +${p}[ :]" || true)"
    [[ -z "$f" ]] || fail "dpkg -l still lists $p: $f"
  done
  while IFS= read -r f; do
    # Directories other packages share (/usr/share/doc) stay.
    [[ -d "$f" && ! "$f" =~ /rdx(-dev|-tools)?$ ]] && continue
    [[ ! -e "$f" ]] || fail "$f is left after dpkg --purge"
  done <"$work/installed-paths"
  for f in /usr/include/rdx /usr/share/cmake/rdx /usr/share/pkgconfig/rdx.pc; do
    [[ ! -e "$f" ]] || fail "$f is left after dpkg --purge"
  done
  echo "ok: installed, used from /usr and removed without a trace"
}

case "$mode" in
  build) do_build ;;
  install) do_install "$@" ;;
  *)
    echo "usage: run.sh build SRC WORK | run.sh install SRC WORK DEBS" >&2
    exit 2
    ;;
esac
