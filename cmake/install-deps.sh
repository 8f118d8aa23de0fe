#!/usr/bin/env bash
# Installs what trainplan needs to build and test, when it is missing. Safe to run repeatedly.
set -euo pipefail

# What to install: "planner" (`make run`) is only what the `trainplan` planner binary needs to build;
# "all" (`make test`, the default) adds the test, benchmark, fuzzing and Python-binding tools, the
# headless browser and LibTorch for exec/.
mode=${1:-all}
case "$mode" in planner|all) ;; *) echo "install-deps: unknown mode '$mode' (planner or all)" >&2; exit 2;; esac

# Debian packages (headers and libraries for the C++ build).
pkgs=(cmake g++ make libboost-graph-dev libfmt-dev nlohmann-json3-dev)
[ "$mode" = all ] && pkgs+=(ccache libgtest-dev libgmock-dev libbenchmark-dev python3 python3-pip python3-dev
                           clang libclang-rt-14-dev)
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
[ "$mode" = planner ] && exit 0

# The Python package's build and test tools (python/, tests/python/, run by ctest): nanobind for the
# binding, scikit-build-core for `pip install .`, pytest. Small pure-Python wheels from PyPI.
# Optional: without them ctest builds no module and says so at configure time.
py_tools=(nanobind==3.1.0 scikit-build-core==1.1.2 pytest==9.2.0)
if ! python3 -c 'import nanobind, scikit_build_core, pytest' >/dev/null 2>&1; then
  echo "install-deps: installing ${py_tools[*]} (Python binding and its tests)"
  pip_flags=(--quiet --disable-pip-version-check)
  [ "$(id -u)" -eq 0 ] && pip_flags+=(--root-user-action=ignore)
  python3 -m pip install "${pip_flags[@]}" "${py_tools[@]}" \
    || python3 -m pip install "${pip_flags[@]}" --break-system-packages "${py_tools[@]}" \
    || echo "install-deps: warning: could not install ${py_tools[*]}; the Python tests will be skipped" >&2
fi

# Headless Chromium for the browser test of the HTML reports (tests/browser/), and PIL for
# its screenshot check (the test has its own PNG decoder when PIL is missing). Optional: when they
# cannot be installed (no network, no apt), the browser test says "skipped" and the rest is tested.
# TRAINPLAN_SKIP_BROWSER=1 skips this.
if [ "${TRAINPLAN_SKIP_BROWSER:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1 \
   && ! command -v chromium-browser >/dev/null 2>&1 && ! command -v google-chrome >/dev/null 2>&1; then
  echo "install-deps: installing chromium (headless browser for tests/browser; ~300 MB)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
         --no-install-recommends chromium python3-pil >/dev/null; }; then
    echo "install-deps: warning: could not install chromium; the browser test will be skipped" >&2
  fi
fi

# LibTorch for exec/: the torch 2.11.0 wheel from PyPI, without its several GB of
# nvidia-* CUDA wheels. A CPU machine needs only libtorch_cpu.so and libc10.so from the wheel
# (cmake/FindTorchFromPython.cmake links just those), plus libcudart/libcupti, which
# libtorch_cpu.so names as NEEDED (its profiler): taken from the system CUDA toolkit when present,
# else from the two small cuda-toolkit wheels. A GPU machine keeps its full torch install.
# TRAINPLAN_SKIP_TORCH=1 skips this (exec/ is then not built).
TORCH_VERSION=2.11.0
if [ "${TRAINPLAN_SKIP_TORCH:-0}" != 1 ]; then
  have=$(python3 -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
  if [ "${have%%+*}" != "$TORCH_VERSION" ]; then
    echo "install-deps: installing torch==$TORCH_VERSION (wheel only, no CUDA wheels; ~530 MB)"
    pip_flags=(--no-deps --quiet --disable-pip-version-check)
    [ "$(id -u)" -eq 0 ] && pip_flags+=(--root-user-action=ignore)
    python3 -m pip install "${pip_flags[@]}" "torch==$TORCH_VERSION" \
      || python3 -m pip install "${pip_flags[@]}" --break-system-packages "torch==$TORCH_VERSION"
  fi
  torch_lib=$(python3 -c 'import importlib.util as u, os; print(os.path.join(os.path.dirname(u.find_spec("torch").origin), "lib"))')
  if ldd "$torch_lib/libtorch_cpu.so" | grep -q "not found"; then
    echo "install-deps: libtorch_cpu.so misses CUDA runtime libraries; installing cuda-toolkit[cudart,cupti]"
    pip_flags=(--quiet --disable-pip-version-check)
    [ "$(id -u)" -eq 0 ] && pip_flags+=(--root-user-action=ignore)
    python3 -m pip install "${pip_flags[@]}" "cuda-toolkit[cudart,cupti]==13.0.2" \
      || python3 -m pip install "${pip_flags[@]}" --break-system-packages "cuda-toolkit[cudart,cupti]==13.0.2"
    if ldd "$torch_lib/libtorch_cpu.so" | grep "not found"; then
      echo "install-deps: warning: libtorch_cpu.so still misses the libraries above; exec/ will not run" >&2
    fi
  fi
fi
