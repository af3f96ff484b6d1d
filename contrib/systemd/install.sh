#!/usr/bin/env bash
# Install mqserver as a systemd service: a virtualenv owned by root in
# $PREFIX (default /opt/mqserver), the unit, the example settings (kept if
# already there) and a `mqserver` system user.  Run as root:
#
#     sudo contrib/systemd/install.sh [WHEEL_OR_SOURCE_DIR]   # default: this source tree
#
# Re-running it upgrades mqserver in place and restarts nothing: do
# `systemctl restart mqserver` when ready.
set -euo pipefail

PREFIX=${PREFIX:-/opt/mqserver}
ETC=${ETC:-/etc/mqserver}
UNIT_DIR=${UNIT_DIR:-/etc/systemd/system}
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
PACKAGE=${1:-$(cd "$HERE/../.." && pwd)}

test -x "$PREFIX/bin/python" || "$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install -q --upgrade pip
"$PREFIX/bin/python" -m pip install -q --upgrade "$PACKAGE"

# Twisted caches what it finds in each twisted/plugins directory in a
# dropin.cache next to the modules.  The service user cannot write to this
# root-owned venv, so without a fresh cache every start rescans the plugins
# and logs a warning that the cache could not be written.  Rebuild it now,
# as the owner, after every install or upgrade.
"$PREFIX/bin/python" -c "from twisted.plugin import IPlugin, getPlugins; list(getPlugins(IPlugin))"

# the docs the unit's Documentation= points to, when run from a source tree
if [ -f "$HERE/../../docs/deployment.md" ]; then
    install -d "$PREFIX/share/doc/mqserver"
    install -m 0644 "$HERE/../../docs/deployment.md" "$PREFIX/share/doc/mqserver/"
fi

if [ "${SKIP_SYSTEM:-}" = "1" ]; then
    exit 0  # a venv only: for tests and for images that add the service themselves
fi

getent passwd mqserver >/dev/null ||
    useradd --system --home-dir /var/lib/mqserver --shell /usr/sbin/nologin mqserver
install -d -m 0755 "$ETC"
[ -f "$ETC/mqserver.env" ] || install -m 0644 "$HERE/mqserver.env" "$ETC/mqserver.env"
install -m 0644 "$HERE/mqserver.service" "$UNIT_DIR/mqserver.service"
systemctl daemon-reload
echo "installed; edit $ETC/mqserver.env, then: systemctl enable --now mqserver"
