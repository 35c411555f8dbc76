# Sourced by the test parts: installs what a fresh machine lacks, only when it
# is missing, and says what it installs. Each function returns non-zero, after
# saying why, when it cannot install (not root and no sudo, no network); the
# part then prints `SKIP <what>: <why>` and the run's summary shows it.
#
#   vmmw_need_toolchain NAME [COMPONENT...]   a rustup toolchain (minimal profile)
#   vmmw_need_cargo_tool BIN CRATE VERSION    a `cargo install --locked` tool
#   vmmw_need_apt COMMAND PACKAGE             a Debian package, by the command it gives
#
# rustup and cargo are assumed (the repository is a Rust crate).

export PATH="$HOME/.cargo/bin:$PATH"

vmmw_need_toolchain() {
  local name=$1
  shift
  local comps=("$@") missing=()
  if rustup run "$name" rustc --version >/dev/null 2>&1; then
    local have
    have=$(rustup component list --toolchain "$name" --installed 2>/dev/null)
    for c in "${comps[@]}"; do
      grep -q "^$c\(-\|$\)" <<<"$have" || missing+=("$c")
    done
    [ ${#missing[@]} = 0 ] && return 0
    echo "install: rustup component add --toolchain $name ${missing[*]}"
    rustup component add --toolchain "$name" "${missing[@]}" && return 0
    # A nightly without one of them (miri is not built every night): the
    # latest nightly that has every component asked for.
    echo "install: $name lacks ${missing[*]}; the latest $name that has them"
  else
    echo "install: rust toolchain $name${comps[*]:+ with ${comps[*]}} (rustup, minimal profile)"
  fi
  local with=()
  [ ${#comps[@]} -gt 0 ] && with=(--component "$(IFS=,; echo "${comps[*]}")")
  rustup toolchain install "$name" --profile minimal "${with[@]}" --allow-downgrade --no-self-update
}

vmmw_need_cargo_tool() {
  local bin=$1 crate=$2 version=$3
  command -v "$bin" >/dev/null && return 0
  echo "install: cargo install $crate --version $version --locked (for $bin)"
  # A debug build: these tools run for seconds, and it compiles in about half the time.
  cargo install "$crate" --version "$version" --locked --quiet --debug
}

vmmw_need_apt() {
  local cmd=$1 pkg=$2
  command -v "$cmd" >/dev/null && return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "cannot install $pkg (for $cmd): not root and no password-less sudo"
      return 1
    fi
  fi
  if ! command -v apt-get >/dev/null; then
    echo "cannot install $pkg (for $cmd): no apt-get on this machine; install it by hand"
    return 1
  fi
  echo "install: apt-get install $pkg (for $cmd)"
  # The package lists of a fresh machine may be missing or stale.
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 \
    || { "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 \
      && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; } \
    || { echo "cannot install $pkg (for $cmd): apt-get failed"; return 1; }
  command -v "$cmd" >/dev/null || { echo "apt-get installed $pkg but $cmd is not on PATH"; return 1; }
}

# The toolchain Cargo.toml's rust-version names, as rustup names it (1.88.0).
vmmw_msrv() {
  local v
  v=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
  [[ $v == *.*.* ]] || v="$v.0"
  echo "$v"
}
