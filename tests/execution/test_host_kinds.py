"""A host kind is a folder: a new kind is its own package (config, options, check, host)
and one line of the kinds table (settings/kinds.py). Here a kind made in the test's own
folder, registered by that one line alone, is read from config.toml, added and listed by
`fleet-tui host`, checked by `host check`, and built by the engine's registry of hosts;
and every kind of the table has the four parts."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_tui.commands import host as host_cli
from fleet_tui.execution.hosts import Hosts
from fleet_tui.execution.memory import MemoryHost
from fleet_tui.settings import kinds
from fleet_tui.settings.config import ConfigError, load_settings

FILES = {
    "__init__.py": '"""A kind made by a test: its hosts are in-memory hosts under a folder."""\n',
    "config.py": '''
        from __future__ import annotations

        from dataclasses import dataclass

        from fleet_tui.settings.config_core import ConfigError
        from fleet_tui.settings.hosts import HostConfig, cap_of, unknown_fields


        @dataclass(frozen=True)
        class EchoOptions:
            root: str


        class EchoSchema:
            mark = "echo"
            label = "echo"
            fields = ("echo", "max_workers")

            def parse(self, name, table, where, default_cap):
                unknown_fields(table, self.fields, where, "an echo host")
                root = table.get("echo")
                if not isinstance(root, str) or not root.startswith("/"):
                    raise ConfigError(f"{where}: echo: expected an absolute folder, got "
                                      f"{root!r}", key="echo")
                cap = cap_of(table.get("max_workers", default_cap), where)
                return HostConfig(name, cap, "echo", EchoOptions(root))

            def table(self, host):
                return {"echo": host.options.root, "max_workers": host.max_workers}

            def target(self, host):
                return host.options.root


        SCHEMA = EchoSchema()
    ''',
    "options.py": '''
        from __future__ import annotations


        class EchoOptions:
            flag = "--echo"
            how = "--echo FOLDER"

            def add_arguments(self, add):
                add.add_argument("--echo", metavar="FOLDER", help="an echo host's folder")

            def picks(self, args):
                return args.echo is not None

            def refuse_stray(self, args, flag, label):
                return None

            def table(self, args):
                return {"echo": args.echo}

            def added(self, host):
                return f"echo {host.target}, max_workers {host.max_workers}"

            def blank_row(self):
                return {"echo": None}

            def row(self, host):
                return {"echo": host.options.root}

            def key_shown(self, host):
                return "none"


        OPTIONS = EchoOptions()
    ''',
    "check.py": '''
        from __future__ import annotations

        from pathlib import Path

        from fleet_tui.execution.probe import Check


        class EchoChecks:
            probes = False
            records = False

            def describe(self, host):
                return f"echo {host.target}"

            def shell(self, host):
                return None

            def claude_where(self, settings, host):
                return (), None

            def run(self, host, *, claude, install_to, probe, env=None):
                there = Path(host.options.root).is_dir()
                return [Check("folder", there, host.target, "make the folder")], {}


        CHECKS = EchoChecks()
    ''',
    "host.py": '''
        from __future__ import annotations

        from pathlib import Path

        from fleet_tui.execution.memory import MemoryHost


        def build(config, *, env, python):
            return MemoryHost(Path(config.options.root), name=config.name)
    ''',
}


@pytest.fixture
def echo_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kind's folder written as a package of its own; the table gains its one line."""
    package = tmp_path / "pkgs" / "echo_kind"
    package.mkdir(parents=True)
    for name, text in FILES.items():
        (package / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setattr(kinds, "KINDS", (*kinds.KINDS, kinds.Kind("echo", "echo_kind")))
    yield "echo_kind"
    for name in [m for m in sys.modules if m == "echo_kind" or m.startswith("echo_kind.")]:
        del sys.modules[name]


def test_a_new_kind_is_its_folder_and_one_line_of_the_table(
        echo_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setenv("FLEET_TUI_CONFIG", str(config))
    root = tmp_path / "echo-root"
    root.mkdir()
    assert host_cli.main(["add", "e1", "--echo", str(root), "--max-workers", "2"]) == 0
    out = capsys.readouterr().out
    assert f"added host e1: echo {root}, max_workers 2" in out
    assert config.read_text() == f'[hosts.e1]\necho = "{root}"\nmax_workers = 2\n'

    settings = load_settings(config_file=config)
    host = settings.host("e1")
    assert (host.kind, host.target, host.max_workers) == ("echo", str(root), 2)

    assert host_cli.main(["ls", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["e1"]["echo"] == str(root) and rows["e1"]["key"] == "none"
    assert rows["local"]["echo"] is None and rows["local"]["ssh"] is None

    assert host_cli.main(["check", "e1"]) == 0
    out = capsys.readouterr().out
    assert f"host e1 (echo {root}):" in out and f"ok    folder     {root}" in out

    built = Hosts(settings.all_hosts, env={}, python="python3").get("e1")
    assert isinstance(built, MemoryHost) and built.name == "e1"

    # its own table's rules, said as every kind's are
    config.write_text('[hosts.e2]\necho = "relative"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[hosts\.e2\]: echo: expected an absolute folder"):
        load_settings(config_file=config)
    # the kinds already there are untouched by it
    config.write_text("", encoding="utf-8")
    assert host_cli.main(["add", "box", "me@box"]) == 0
    assert "added host box: ssh me@box, max_workers" in capsys.readouterr().out


@pytest.mark.parametrize("kind", kinds.KINDS, ids=lambda k: k.name)
def test_every_kind_of_the_table_has_its_four_parts(kind: kinds.Kind) -> None:
    """config (the schema), options, check and host, each with what its reader calls."""
    parts = {"config": ("SCHEMA", ("mark", "label", "fields", "parse", "table", "target")),
             "options": ("OPTIONS", ("flag", "how", "add_arguments", "picks", "refuse_stray",
                                     "table", "added", "blank_row", "row", "key_shown")),
             "check": ("CHECKS", ("probes", "records", "describe", "shell", "claude_where",
                                  "run"))}
    for part, (name, members) in parts.items():
        given = getattr(kind.part(part), name)
        assert [m for m in members if not hasattr(given, m)] == [], (kind.name, part)
    assert callable(kind.part("host").build)
