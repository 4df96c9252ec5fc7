# Shared by scripts/test and scripts/demo: idempotent installs, quiet when already done.

sparkd_setup_system() {
  # Debian packages the real-part tests use: systemd + D-Bus for the sandbox, util-linux for unshare.
  local need=()
  command -v unshare >/dev/null || need+=(util-linux)
  [ -x /lib/systemd/systemd ] || need+=(systemd)
  command -v dbus-daemon >/dev/null || need+=(dbus)
  # the .deb's postinst builds /opt/sparkd/venv with Debian's python3 (tests/test_deb_package.py)
  dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
  command -v pgrep >/dev/null || need+=(procps)
  # promtool and a Prometheus server for the metrics tests (packaging/prometheus, tests/metrics);
  # without its recommends (node-exporter), and never left running.
  local bare=()
  command -v promtool >/dev/null || bare+=(prometheus)
  if [ $((${#need[@]} + ${#bare[@]})) -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then echo "missing packages: ${need[*]} ${bare[*]} (run as root or install them)" >&2; return 1; fi
    echo "installing ${need[*]} ${bare[*]} ..."
    apt-get update -q >/dev/null
    if [ ${#need[@]} -gt 0 ]; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
    fi
    if [ ${#bare[@]} -gt 0 ]; then
      sparkd_no_service_starts env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${bare[@]}" >/dev/null
    fi
  fi
}

# Run a command with invoke-rc.d refusing to start services (policy-rc.d exit 101), so installing
# a package such as prometheus never leaves a server running on the test machine. An existing
# policy-rc.d is left as it is.
sparkd_no_service_starts() {
  local policy=/usr/sbin/policy-rc.d created=0 rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created=1
  fi
  "$@" || rc=$?
  [ $created -eq 1 ] && rm -f "$policy"
  return $rc
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
