"""What the tests of the SSH host share (tests/execution/ssh/test_ssh_host.py, the host rows of
tests/engine/test_reliability.py): a real sshd on 127.0.0.1 (tests/support/sshd.py), an `SshHost`
on it,
and the host's processes read on the host over ssh.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest
import sshd

from fleet_tui.execution.ssh.connection import Connection
from fleet_tui.execution.ssh.host import SshHost

_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HOST_PYTHON = "/usr/bin/python3"


def start_sshd(base: Path, alias: str = "fleet-test-host") -> sshd.Sshd:
    """A running sshd under `base`; the test is skipped where none can run (it fails on
    CI, where scripts/test installs it)."""
    why = sshd.missing()
    if why is not None:
        if _CI:
            pytest.fail(why)
        pytest.skip(why)
    return sshd.Sshd(base, alias=alias).start()


def _skip_or_fail(why: str) -> None:
    if _CI:
        pytest.fail(why)
    pytest.skip(why)


@contextlib.contextmanager
def linux_user(prefix: str = "fleeth") -> Iterator[str]:
    """A Linux user of its own for the test (root only: CI runs as root), with its own
    HOME under /home and a login shell, no password (key login only); removed after,
    every process it still has killed first (all started by this test, as that user)."""
    if os.geteuid() != 0:
        _skip_or_fail("a host as another Linux user needs root (useradd)")
    for tool in ("useradd", "usermod", "userdel"):
        if shutil.which(tool) is None:
            _skip_or_fail(f"{tool} is not installed (Debian's passwd package)")
    name = f"{prefix}{secrets.token_hex(4)}"
    home = Path("/home") / name
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell",
                    "/bin/sh", "--user-group", name], check=True, capture_output=True)
    try:
        # '*': no password, and not a locked account (sshd refuses a locked one)
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
        yield name
    finally:
        uid = pwd.getpwnam(name).pw_uid
        for _ in range(50):
            left = _pids_of_uid(uid)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _pids_of_uid(uid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            owner = proc.stat().st_uid
        except OSError:
            continue
        if owner == uid:
            found.append(int(proc.name))
    return found


def npm_registry_files(claude: str, into: Path) -> dict[str, bytes]:
    """A registry's files for the pinned claude, packed with `npm pack` from the copy the
    tests installed (`claude`: its bin): the package, its native part for this platform,
    and the manifests of its other platforms' parts (skipped by npm here, never fetched).
    Made once per run into `into` (kept there for the next test)."""
    package = Path(claude).resolve().parents[1]  # .../@anthropic-ai/claude-code
    scope = package.parent
    manifest = json.loads((package / "package.json").read_text())
    version = manifest["version"]
    into.mkdir(parents=True, exist_ok=True)
    packed: dict[str, Path] = {}
    for name, folder in ((manifest["name"], package),
                         *((n, scope / n.split("/", 1)[1])
                           for n in manifest.get("optionalDependencies", {}))):
        if not folder.is_dir():
            continue
        tarball = into / f"{name.replace('/', '-').lstrip('@')}-{version}.tgz"
        if not tarball.exists():
            work = into / "work" / folder.name
            shutil.rmtree(work, ignore_errors=True)
            if folder == package:  # the wrapper: its bin a placeholder, as published
                shutil.copytree(folder, work, ignore=shutil.ignore_patterns("claude.exe"))
                (work / "bin" / "claude.exe").write_text(
                    "#!/bin/sh\necho 'claude: the postinstall did not run' >&2\nexit 1\n")
                (work / "bin" / "claude.exe").chmod(0o755)
                # --ignore-scripts: the package's `prepare` refuses anything but its release
                subprocess.run(["npm", "pack", "--silent", "--ignore-scripts",
                                "--pack-destination", str(into), str(work)], check=True,
                               capture_output=True, timeout=600)
            else:
                _pack_fast(folder, tarball)
            made = into / f"{name.replace('/', '-').lstrip('@')}-{version}.tgz"
            assert made.exists(), sorted(p.name for p in into.iterdir())
        packed[name] = tarball
    files: dict[str, bytes] = {}
    for name in (manifest["name"], *manifest.get("optionalDependencies", {})):
        if name in packed:
            data = json.loads(subprocess.run(
                ["tar", "-xzOf", str(packed[name]), "package/package.json"],
                capture_output=True, check=True).stdout)
            body = packed[name].read_bytes()
            data["dist"] = {
                "tarball": f"/tarballs/{packed[name].name}",
                "integrity": "sha512-" + base64.b64encode(
                    hashlib.sha512(body).digest()).decode(),
                "shasum": hashlib.sha1(body).hexdigest()}
            files[f"/tarballs/{packed[name].name}"] = body
        else:  # another platform's part: its manifest, for npm to see it does not fit
            plat = name.rsplit("claude-code-", 1)[1].split("-")
            data = {"name": name, "version": version, "os": [plat[0]], "cpu": [plat[1]],
                    "dist": {"tarball": f"/tarballs/missing-{plat[0]}-{plat[1]}.tgz"}}
            if plat[0] == "linux":
                data["libc"] = ["musl" if plat[2:] == ["musl"] else "glibc"]
        data["_id"] = f"{name}@{version}"
        files["/" + name] = json.dumps({"name": name, "dist-tags": {"latest": version},
                                        "versions": {version: data}}).encode()
    return files


def _pack_fast(folder: Path, tarball: Path) -> None:
    """An installed package (the files it was published with) packed as `npm pack` does
    (each file under package/, owned by root, mode 644 or 755) but at gzip level 1: the
    native part is one 245 MB binary, and npm pack's level 9 was most of the user-path
    module's setup (~25 s of CPU; level 1 ~5 s). npm installs it the same way."""
    import gzip
    import tarfile

    partial = tarball.with_name(tarball.name + ".part")
    with open(partial, "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if not path.is_file():
                continue
            info = tar.gettarinfo(str(path), arcname=f"package/{path.relative_to(folder)}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            with open(path, "rb") as data:
                tar.addfile(info, data)
    partial.rename(tarball)


def npm_srt_files(srt: str, into: Path) -> dict[str, bytes]:
    """A registry's files for the pinned srt (the cage's sandbox runtime) and the packages
    it depends on, each packed with `npm pack` from the copy the tests installed (`srt`:
    its package folder, in a node_modules holding its dependencies). Made once per run."""
    modules = Path(srt).resolve().parents[1]
    if modules.name != "node_modules":
        modules = modules.parent
    into.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {}
    folders = [p for p in modules.iterdir() if not p.name.startswith((".", "@"))]
    folders += [q for p in modules.iterdir() if p.name.startswith("@") for q in p.iterdir()]
    for folder in folders:
        if not (folder / "package.json").is_file():
            continue
        manifest = json.loads((folder / "package.json").read_text())
        name, version = manifest["name"], manifest["version"]
        tarball = into / f"{name.replace('/', '-').lstrip('@')}-{version}.tgz"
        if not tarball.exists():
            subprocess.run(["npm", "pack", "--silent", "--ignore-scripts",
                            "--pack-destination", str(into), str(folder)], check=True,
                           capture_output=True, timeout=600)
            assert tarball.exists(), sorted(p.name for p in into.iterdir())
        body = tarball.read_bytes()
        data = json.loads(subprocess.run(["tar", "-xzOf", str(tarball), "package/package.json"],
                                         capture_output=True, check=True).stdout)
        data["dist"] = {"tarball": f"/tarballs/{tarball.name}",
                        "integrity": "sha512-" + base64.b64encode(
                            hashlib.sha512(body).digest()).decode(),
                        "shasum": hashlib.sha1(body).hexdigest()}
        data["_id"] = f"{name}@{version}"
        files[f"/tarballs/{tarball.name}"] = body
        files["/" + name] = json.dumps({"name": name, "dist-tags": {"latest": version},
                                        "versions": {version: data}}).encode()
    return files


@contextlib.contextmanager
def npm_registry(files: Mapping[str, bytes]) -> Iterator[str]:
    """`files` served on 127.0.0.1 as an npm registry (tarball paths made absolute)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = unquote(self.path.split("?", 1)[0])
            body = files.get(path)
            if body is None:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            if not path.endswith(".tgz"):  # a manifest: its tarball's address made whole
                base = f"http://127.0.0.1:{self.server.server_address[1]}"
                body = body.replace(b'"tarball": "/', f'"tarball": "{base}/'.encode())
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream"
                             if path.endswith(".tgz") else "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def same_machine_claude() -> str | None:
    """The same-machine shortcut: the "host" is this machine as this user, so this
    machine's claude is the host's too, given to the host as its own (`SshHost(claude=)`).
    The real path (another user, nothing of this machine there) is
    tests/journeys/test_ssh_user_path.py."""
    return os.environ.get("FLEET_TEST_CLAUDE") or None


def record_claude(server: sshd.Sshd, claude: str) -> None:
    """The same-machine shortcut for a host built from config.toml: this machine's claude
    recorded as the host's, where `fleet-tui host check` records the one it found."""
    server.ssh('mkdir -p -m 700 "$HOME/.fleet-tui-host" && cat > '
               '"$HOME/.fleet-tui-host/claude-path"', input=claude + "\n")


def ssh_host(server: sshd.Sshd, env: Mapping[str, str], *, name: str = "box",
             lease: float = 60.0, key_on_host: bool = True) -> SshHost:
    """The same-machine shortcut's host (see same_machine_claude). The suite's workers go
    straight to their endpoint (FLEET_WORKER_GATEWAY=0, as the older tests were written),
    which a host allows only when it keeps the key (`--key-on-host`): a test through the
    gateway says ``key_on_host=False``. Its workers run uncaged (the host's cage = "off"):
    the caged path is tests/journeys/test_ssh_user_path.py's."""
    return SshHost(name=name, target=server.alias, env=env, python=HOST_PYTHON,
                   ssh_config=server.client_config, lease=lease, key_on_host=key_on_host,
                   claude=same_machine_claude(), cage="off")


def host_config(server: sshd.Sshd, *, name: str = "box", lease: float = 60.0,
                claude: str | None = None) -> dict[str, object]:
    """`ssh_host`'s arguments as JSON, for an engine in a process of its own
    (tests/support/engine_child.py); `claude`: the host's (the same-machine shortcut's default)."""
    return {"name": name, "target": server.alias, "ssh_config": str(server.client_config),
            "python": HOST_PYTHON, "lease": lease, "key_on_host": True,
            "claude": claude or same_machine_claude(), "cage": "off"}


def master(server: sshd.Sshd) -> Connection:
    """The connection every SshHost on `server` shares (one master, by its ControlPath):
    to find or close the master another process made."""
    return Connection(server.alias, config=server.client_config)


LIST = ("for d in /proc/[0-9]*; do printf '%s\\t%s\\t' \"${d#/proc/}\" "
        "\"$(readlink \"$d/cwd\" 2>/dev/null)\"; tr '\\0' ' ' < \"$d/cmdline\" 2>/dev/null; "
        "echo; done")


def host_pids(server: sshd.Sshd, *markers: str) -> list[int]:
    """The host's processes working under its HOME whose command line is one of
    `markers` (or holds one ending in "/"), read on the host over ssh (other tests'
    processes on this machine are not counted)."""
    pids = []
    for line in server.ssh(LIST).splitlines():
        pid, _, rest = line.partition("\t")
        cwd, _, args = rest.partition("\t")
        args = args.strip()
        if not cwd.startswith(str(server.home)):
            continue
        if any(m == args or (m.endswith("/") and m in args) for m in markers):
            pids.append(int(pid))
    return pids


def token_holders(server: sshd.Sshd, token: str) -> list[int]:
    """The host's processes whose environment holds the attempt's token (the token on
    stdin, never an argv of the host)."""
    scan = ("read -r t; for d in /proc/[0-9]*; do grep -qaF \"FLEET_ATTEMPT_TOKEN=$t\" "
            "\"$d/environ\" 2>/dev/null && echo \"${d#/proc/}\"; done; true")
    out = server.ssh(f"exec bash -c {shlex.quote(scan)}", input=token + "\n")
    return [int(line) for line in out.split()]


__all__ = ["HOST_PYTHON", "host_config", "host_pids", "linux_user", "master",
           "npm_registry", "npm_registry_files", "record_claude", "same_machine_claude",
           "ssh_host", "start_sshd", "token_holders"]
