# Shared by scripts/test and scripts/demo: idempotent installs, quiet when already done.

sparkd_setup_system() {
  # Debian packages the real-part tests use: systemd + D-Bus for the sandbox, util-linux for unshare.
  local need=()
  command -v unshare >/dev/null || need+=(util-linux)
  [ -x /lib/systemd/systemd ] || need+=(systemd)
  command -v dbus-daemon >/dev/null || need+=(dbus)
  if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then echo "missing packages: ${need[*]} (run as root or install them)" >&2; return 1; fi
    echo "installing ${need[*]} ..."
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  fi
}

sparkd_setup_venv() {
  if [ ! -x .venv/bin/python ]; then
    echo "creating .venv ..."
    python3 -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  # torch: the CPU wheel first, so nothing pulls a multi-GB CUDA build.
  .venv/bin/python -c 'import torch' 2>/dev/null || .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e '.[test]'
}
