#!/usr/bin/env bash
# engramprof set-up for a fresh Debian 12 machine (run by `make setup`; idempotent).
#
# Does, only where something is missing:
#   1. apt: python3-bpfcc python3-venv bpfcc-tools bpftrace jq prometheus + kernel headers
#      (linux-headers-$(uname -r) when Debian has it, else linux-headers-<arch>), and points
#      /lib/modules/$(uname -r)/{build,source} at the installed headers (BCC needs them);
#      prometheus is the server tests/test_export*.py start on 127.0.0.1 to scrape
#      `engramprof export` (about 16 s to install here; its own service is not used);
#   2. mounts tracefs at /sys/kernel/tracing;
#   3. creates .venv with /usr/bin/python3 -m venv --system-site-packages (so BCC imports);
#   4. pip install -e .[dev,plot] (re-run only when pyproject.toml changed; plot: matplotlib, for
#      batch-tail --plot, which the tests and the demo use).
# When everything is in place it changes nothing and finishes in a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'setup: %s\n' "$*"; }
need_root() {
  say "cannot $1: not root. Run as root:  $2" >&2
  exit 1
}
KREL=$(uname -r)
ARCH=$(dpkg --print-architecture 2>/dev/null || echo amd64)
PKGS=(python3-bpfcc python3-venv bpfcc-tools bpftrace jq prometheus fio)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
headers_dir() { ls -d /usr/src/linux-headers-*-"$ARCH" 2>/dev/null | sort -V | tail -n 1; }
have_headers=0
if [ -e "/lib/modules/$KREL/build/include" ] || [ -n "$(headers_dir)" ]; then have_headers=1; fi

if [ ${#missing[@]} -gt 0 ] || [ $have_headers = 0 ]; then
  command -v apt-get >/dev/null || { say "no apt-get here: install ${missing[*]} and kernel headers for $KREL with your package manager" >&2; exit 1; }
  [ "$(id -u)" = 0 ] || need_root "install packages" "apt-get update && apt-get install -y ${missing[*]} linux-headers-$ARCH"
  say "installing ${missing[*]} kernel-headers"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  hdr="linux-headers-$ARCH"
  if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then hdr="linux-headers-$KREL"; fi
  [ $have_headers = 1 ] && hdr=""
  apt-get install -y -q "${missing[@]}" $hdr
fi

# BCC compiles against /lib/modules/$(uname -r)/build; this kernel has no headers package of its
# own, so point build/source at Debian's generic headers (tracepoint programs only need them
# to compile; argument layouts come from tracefs at run time).
if [ ! -e "/lib/modules/$KREL/build/include" ]; then
  [ "$(id -u)" = 0 ] || need_root "link kernel headers" "sudo make setup"
  hd=$(headers_dir)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
  [ -n "$hd" ] || { say "no kernel headers found under /usr/src" >&2; exit 1; }
  mkdir -p "/lib/modules/$KREL"
  [ -e "/lib/modules/$KREL/build" ] || ln -s "$hd" "/lib/modules/$KREL/build"
  [ -e "/lib/modules/$KREL/source" ] || ln -s "${common:-$hd}" "/lib/modules/$KREL/source"
  say "linked /lib/modules/$KREL/build -> $hd"
fi

if [ ! -d /sys/kernel/tracing/events ]; then
  if [ "$(id -u)" = 0 ]; then
    mount -t tracefs nodev /sys/kernel/tracing && say "mounted tracefs at /sys/kernel/tracing"
  else
    say "tracefs is not mounted; as root run: mount -t tracefs nodev /sys/kernel/tracing" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  say "creating .venv (system site packages, for BCC)"
  /usr/bin/python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.engramprof-installed
sum=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$sum" ] || ! .venv/bin/python -c 'import engramprof' 2>/dev/null; then
  say "pip install -e .[dev,plot] (log: .venv/pip-install.log)"
  if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[dev,plot]'; } \
      > .venv/pip-install.log 2>&1; then
    tail -n 30 .venv/pip-install.log >&2
    say "pip install failed (full log: .venv/pip-install.log)" >&2
    exit 1
  fi
  echo "$sum" > "$stamp"
fi
.venv/bin/python -c 'import bcc' 2>/dev/null || say "warning: bcc does not import in .venv (python3-bpfcc is for /usr/bin/python3)" >&2
say "ready"
