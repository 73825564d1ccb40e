#!/usr/bin/env bash
# Creates .venv/ at the repo root with the locked dependencies and the package (editable).
# When run as root, installs the Debian packages the project and its tests need if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

want_debs=(libdbus-1-dev libglib2.0-dev pkg-config gcc dbus-daemon chromium avahi-daemon avahi-utils iproute2 tmux curl)
missing=()
for deb in "${want_debs[@]}"; do
  dpkg-query -W -f='${Status}' "$deb" 2>/dev/null | grep -q "install ok installed" || missing+=("$deb")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "bootstrap: missing Debian packages (need root to install): ${missing[*]}" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.lock-installed
if [ ! -f "$stamp" ] || ! cmp -s requirements.lock "$stamp"; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -U pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.lock
  cp requirements.lock "$stamp"
fi
# The editable install again only when the build configuration changed; setuptools' informational warnings
# (beta `[tool.setuptools]`, folders named like the package) are silenced: they repeat on every start.
built=.venv/.editable-installed
config_digest=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
if [ ! -f "$built" ] || [ "$(cat "$built")" != "$config_digest" ] || ! .venv/bin/python -c 'import connector' 2>/dev/null; then
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
    --no-build-isolation -e . >/dev/null
  echo "$config_digest" > "$built"
fi
