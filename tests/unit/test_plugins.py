"""Plugin discovery: ours through twisted.plugin, and a third party's the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from twisted.application.service import IServiceMaker
from twisted.plugin import getPlugins

from mqserver.interfaces import IProtocolPlugin, IStoragePlugin


def test_builtin_plugins_are_found():
    assert "mqserver" in {p.tapname for p in getPlugins(IServiceMaker)}
    assert {"mqks", "phpmq", "emqp"} <= {p.name for p in getPlugins(IProtocolPlugin)}
    assert "memory" in {p.name for p in getPlugins(IStoragePlugin)}


def test_importing_the_twistd_plugin_imports_nothing_heavy():
    code = textwrap.dedent(
        """
        import json, sys
        import twisted.plugins.mqserver_plugin
        heavy = [m for m in ("mqserver.tap", "mqserver.broker.core", "mqserver.storage.memory",
                             "mqserver.protocols.mqks.protocol", "twisted.internet.reactor",
                             "mqserver.protocols.phpmq.protocol",
                             "mqserver.protocols.emqp.service", "mqserver.zmtp.router",
                             "twisted.web") if m in sys.modules]
        print(json.dumps(heavy))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


THIRD_PARTY = '''
from twisted.plugin import IPlugin
from zope.interface import implementer
from mqserver.interfaces import IStoragePlugin


@implementer(IPlugin, IStoragePlugin)
class Vault:
    name = "vault"
    description = "a third party's backend"
    options = [["vault-url", None, "mem://", "Where the vault is."]]

    def build_store(self, config, reactor):
        from mqserver.storage.memory import MemoryStore
        return MemoryStore()


vault = Vault()
'''


def test_a_third_party_plugin_in_its_own_package_is_found(tmp_path):
    plugins = tmp_path / "twisted" / "plugins"
    plugins.mkdir(parents=True)
    (plugins / "vault_plugin.py").write_text(THIRD_PARTY)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    twistd = os.path.join(os.path.dirname(sys.executable), "twistd")
    out = subprocess.run(
        [twistd, "mqserver", "--help"], capture_output=True, text=True, env=env, cwd=tmp_path,
        check=True,
    )
    assert "vault" in out.stdout and "--vault-url" in out.stdout
    bad = subprocess.run(
        [twistd, "-n", "mqserver", "--storage", "nope"], capture_output=True, text=True,
        env=env, cwd=tmp_path,
    )
    assert bad.returncode != 0
    assert "unknown storage 'nope'" in bad.stdout + bad.stderr
    assert "vault" in bad.stdout + bad.stderr
