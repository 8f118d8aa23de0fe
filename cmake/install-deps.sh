#!/usr/bin/env bash
# Installs what trainplan needs to build and test, when it is missing. Safe to run repeatedly.
set -euo pipefail

# Debian packages (headers and libraries for the C++ build).
pkgs=(cmake g++ make ccache libboost-graph-dev libfmt-dev nlohmann-json3-dev libgtest-dev
      libgmock-dev libbenchmark-dev python3 python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
