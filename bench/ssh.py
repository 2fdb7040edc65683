"""The SSH host's mirror: a line appended to the host's events.jsonl -> the same
bytes in the local attempt folder, over Debian's sshd on 127.0.0.1 (tests/support/sshd.py).

Subject: the host's agent `follow` stream into `Mirror` (execution/ssh/mirror.py), as the
engine follows a remote worker. Baseline, the bare thing doing the same work: `tail -F`
of a file on the host over the same master connection, its bytes appended to a local
file. Rounds interleave the two (alternating which goes first), EVENTS lines each at 20 a
second; a sample is a round's median delay, the ratio is taken per round. The issue's own
figures (median <= 150 ms, p99 <= 500 ms over loopback) are the context rows.

Then the controller's cost per followed remote worker at 20 events a second
(bench/sshload.py: the same engine following local workers is the baseline) and the bytes
sent for the first and the second task of a repository of 50 MB of incompressible content
(bench/sshbytes.py: counted on the wire; the packs git must send are the baselines). The
issue's absolute budgets (<= 5 MB and <= 1 % of a core per worker) are judged in the notes;
the budgets of the report are ratios (bench/README.md).
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
import time
from pathlib import Path

from bench.common import BenchResult, Figure, bench_env, make_repo, quantile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

# From runs on this 2-core machine under other work: the mirror's per-round median 1.3-7.5 ms
# against tail -F's 0.7-4.5 ms (1.7-3.6×; the agent wakes on inotify as tail -F does):
# 6× leaves headroom for a machine twice as slow.
BUDGET = 6.0
SPACING = 0.05  # 20 events a second


def _arrival(local: Path, size: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not local.exists() or local.stat().st_size < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{local}: {size} bytes did not arrive within {timeout:g} s")
        time.sleep(0.0005)


def _delays(remote: Path, local: Path, events: int, tag: str) -> list[float]:
    """Append `events` lines to `remote` (the host's file) and time each one's arrival in
    `local` (ms)."""
    out = []
    with open(remote, "ab", buffering=0) as fh:
        for i in range(events):
            line = f'{{"type":"system","bench":"{tag}","n":{i},"pad":"{"x" * 200}"}}\n'
            fh.write(line.encode())
            size = fh.tell()
            sent = time.monotonic()
            _arrival(local, size)
            out.append((time.monotonic() - sent) * 1000)
            time.sleep(max(0.0, SPACING - (time.monotonic() - sent)))
    return out


def _copy(stream: object, local: Path) -> None:
    with open(local, "ab", buffering=0) as fh:
        while chunk := stream.read1(65536):  # type: ignore[attr-defined]
            fh.write(chunk)


def run(smoke: bool = False, runs: int | None = None) -> BenchResult:
    latency = _latency(smoke, runs)
    load, load_notes = _per_worker(smoke, runs)
    sent, sent_notes = _bytes(smoke, runs)
    return BenchResult("ssh", "12. SSH host", latency + load + sent,
                       notes=load_notes + sent_notes)


def _latency(smoke: bool, runs: int | None) -> list[Figure]:
    import sshd

    from fleet_tui.execution.ssh.host import SshHost
    from fleet_tui.execution.ssh.mirror import Mirror

    why = sshd.missing()
    if why is not None:
        raise RuntimeError(f"the SSH benchmark needs Debian's sshd: {why}")
    rounds = runs or (1 if smoke else 5)
    events = 8 if smoke else 60
    mirror_medians: list[float] = []
    mirror_p99: list[float] = []
    bare_medians: list[float] = []
    ratios: list[float] = []
    with bench_env("fleet-bench-ssh-") as benv:
        server = sshd.Sshd(benv.root / "sshd", alias="fleet-bench-host").start()
        try:
            host = SshHost(name="bench", target=server.alias, env=benv.env,
                           python="/usr/bin/python3", ssh_config=server.client_config)
            remote = Path(host.remote_attempt_dir("bench", 1))
            remote.mkdir(parents=True)
            lock = os.open(remote / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)  # a live runner, as far as the agent sees
            (remote / "runner.json").write_text('{"runner_pid": 1}')
            local = benv.root / "local"
            local.mkdir()
            bare_remote, bare_local = remote / "bare.jsonl", benv.root / "bare.jsonl"
            bare_remote.touch()
            mirror = Mirror(local, lambda offsets: host.follow_stream(str(remote), offsets))
            mirror.start()
            mirror.wait_first(15.0)  # the first answer, before the clock starts
            tail = host.connection.popen(f"exec tail -c +1 -F {bare_remote}")
            copier = threading.Thread(target=_copy, args=(tail.stdout, bare_local),
                                      daemon=True)
            copier.start()
            try:
                for index in range(rounds):
                    got: dict[str, list[float]] = {}
                    for kind in (("mirror", "bare") if index % 2 == 0 else ("bare", "mirror")):
                        if kind == "mirror":
                            got[kind] = _delays(remote / "events.jsonl",
                                                local / "events.jsonl", events, kind)
                        else:
                            got[kind] = _delays(bare_remote, bare_local, events, kind)
                    m, b = quantile(got["mirror"], 0.5), quantile(got["bare"], 0.5)
                    mirror_medians.append(m)
                    mirror_p99.append(quantile(got["mirror"], 0.99))
                    bare_medians.append(b)
                    ratios.append(m / b)
                same = (local / "events.jsonl").read_bytes() == \
                    (remote / "events.jsonl").read_bytes()
                if not same:
                    raise RuntimeError("the mirror is not byte-identical to the host's file")
            finally:
                tail.kill()
                tail.wait()
                mirror.stop()
                os.close(lock)
                host.close()
        finally:
            server.stop()
    figures = [
        Figure("ssh.latency_ratio", "event delay: the mirror ÷ a bare tail -F over ssh", "×",
               ratios, budget=BUDGET, baseline="ssh.bare_median",
               note=f"{events} lines of ~250 bytes a round at 20/s, over 127.0.0.1"),
        Figure("ssh.mirror_median", "event delay through the mirror, median of a round",
               "ms", mirror_medians, note="the issue's budget: 150 ms"),
        Figure("ssh.mirror_p99", "event delay through the mirror, p99 of a round", "ms",
               mirror_p99, note="the issue's budget: 500 ms"),
        Figure("ssh.bare_median", "event delay through tail -F over ssh (baseline)", "ms",
               bare_medians),
    ]
    return figures


# From runs on this 2-core machine under other work (2026-12-02, N = 5, 8 s windows): see
# the constants' notes in bench/RESULTS.md; set with headroom for a machine twice as slow.
WORKERS = 5
WINDOW = 8.0
MEM_BUDGET = 1.5  # the controller with N remote workers ÷ with N local workers (RSS)
CPU_BUDGET = 4.0  # the same, CPU (% of a core)
ISSUE_MB, ISSUE_CPU = 5.0, 1.0  # the issue's own budgets, per remote worker


def _per_worker(smoke: bool, runs: int | None) -> tuple[list[Figure], list[str]]:
    import sshd
    import standin_claude

    from bench import sshload

    rounds = runs or (1 if smoke else 3)
    n, window = (2, 2.0) if smoke else (WORKERS, WINDOW)
    got: dict[str, list[float]] = {k: [] for k in (
        "mem_ratio", "cpu_ratio", "local_mem", "local_cpu", "remote_mem", "remote_cpu",
        "worker_mem", "worker_cpu", "worker_uss", "worker_ssh_uss", "local_worker_mem",
        "local_worker_cpu")}
    children = 0
    with bench_env("fleet-bench-sshload-") as benv:
        server = sshd.Sshd(benv.root / "sshd", alias="fleet-bench-host").start()
        try:
            repo = make_repo(benv.root / "repo")
            (benv.root / "capture").mkdir()
            claude = standin_claude.stream_wrapper(benv.root / "bin", sshload.RATE,
                                                   sshload.RATE * 900, benv.root / "capture")
            for index in range(rounds):
                steps = {}
                for mode in (("local", "ssh") if index % 2 == 0 else ("ssh", "local")):
                    steps[mode] = sshload.measure(mode, n, window, benv.env, repo, claude,
                                                  server if mode == "ssh" else None)
                local, remote = steps["local"]["n"], steps["ssh"]["n"]
                remote_mb = (remote["rss_kib"] + remote["ssh_uss_kib"]
                             + remote["master_uss_kib"]) / 1024
                remote_cpu = (remote["cpu"] + remote["ssh_cpu"] + remote["master_cpu"]) \
                    * 100 / remote["wall"]
                local_cpu = local["cpu"] * 100 / local["wall"]
                got["local_mem"].append(local["rss_kib"] / 1024)
                got["local_cpu"].append(local_cpu)
                got["remote_mem"].append(remote_mb)
                got["remote_cpu"].append(remote_cpu)
                got["mem_ratio"].append(remote_mb / (local["rss_kib"] / 1024))
                # CPU ticks are 10 ms: a window with none is counted as one tick
                got["cpu_ratio"].append(remote_cpu / max(local_cpu, 1 / local["wall"]))
                mine = sshload.per_worker(steps["ssh"], with_ssh=True)
                theirs = sshload.per_worker(steps["local"], with_ssh=False)
                got["worker_mem"].append(mine["rss_mb"])
                got["worker_uss"].append(mine["uss_mb"])
                got["worker_cpu"].append(mine["cpu_pct"])
                got["worker_ssh_uss"].append(mine["ssh_uss_mb"])
                got["local_worker_mem"].append(theirs["rss_mb"])
                got["local_worker_cpu"].append(theirs["cpu_pct"])
                children = remote["ssh_children"]
        finally:
            server.stop()
    what = f"{n} workers at {sshload.RATE} events/s each, a {window:g} s window"
    figures = [
        Figure("ssh.worker_mem_ratio", "controller memory: N remote workers ÷ N local", "×",
               got["mem_ratio"], budget=MEM_BUDGET, baseline="ssh.local_mem",
               note=f"{what}; remote: its RSS + its ssh processes' USS"),
        Figure("ssh.worker_cpu_ratio", "controller CPU: N remote workers ÷ N local", "×",
               got["cpu_ratio"], budget=CPU_BUDGET, baseline="ssh.local_cpu",
               note=f"{what}; remote: its CPU + its ssh processes'"),
        Figure("ssh.local_mem", "controller RSS with N local workers (baseline)", "MB",
               got["local_mem"]),
        Figure("ssh.local_cpu", "controller CPU with N local workers (baseline)",
               "% of a core", got["local_cpu"]),
        Figure("ssh.remote_mem", "controller with N remote workers: RSS + ssh USS", "MB",
               got["remote_mem"]),
        Figure("ssh.remote_cpu", "controller CPU with N remote workers, ssh included",
               "% of a core", got["remote_cpu"]),
        Figure("ssh.worker_mem", "memory per remote worker (RSS + ssh USS, marginal)", "MB",
               got["worker_mem"], note=f"the issue's budget: {ISSUE_MB:g} MB"),
        Figure("ssh.worker_uss", "memory per remote worker (USS + ssh USS, marginal)", "MB",
               got["worker_uss"]),
        Figure("ssh.worker_ssh_uss", "of which its ssh client process (USS)", "MB",
               got["worker_ssh_uss"]),
        Figure("ssh.worker_cpu", "CPU per remote worker (marginal)", "% of a core",
               got["worker_cpu"], note=f"the issue's budget: {ISSUE_CPU:g} %"),
        Figure("ssh.local_worker_mem", "memory per local worker (RSS, marginal)", "MB",
               got["local_worker_mem"]),
        Figure("ssh.local_worker_cpu", "CPU per local worker (marginal)", "% of a core",
               got["local_worker_cpu"]),
    ]
    mem, cpu = figures[6].median, figures[9].median
    notes = [
        f"Per remote worker, the issue's budgets: memory {mem:.2f} MB against ≤ {ISSUE_MB:g} MB "
        f"({'met' if mem <= ISSUE_MB else 'MISSED'}), CPU {cpu:.2f} % of a core against "
        f"≤ {ISSUE_CPU:g} % ({'met' if cpu <= ISSUE_CPU else 'MISSED'}); medians of the "
        f"marginal cost, (step N − step 1) ÷ (N − 1), over {rounds} round(s). The controller "
        f"had {children} ssh client processes for {n} remote workers (one per followed run's "
        "stream, multiplexed on one master: its USS is counted, shared libraries are not).",
    ]
    return figures, notes


BYTES_SIZE = 50_000_000
BYTES_BUDGET_FIRST = 1.1  # on the wire ÷ the pack: quiet runs 1.002-1.003
BYTES_BUDGET_SECOND = 2.0  # on the wire ÷ the new objects' pack: quiet runs 1.09-1.10


def _bytes(smoke: bool, runs: int | None) -> tuple[list[Figure], list[str]]:
    import sshd

    from bench import sshbytes

    rounds = runs or (1 if smoke else 3)
    size = 1_000_000 if smoke else BYTES_SIZE
    got: dict[str, list[float]] = {k: [] for k in (
        "r1", "r2", "first", "second", "pack1", "pack2", "git1", "git2", "back1", "back2")}
    with bench_env("fleet-bench-sshbytes-") as benv:
        server = sshd.Sshd(benv.root / "sshd", alias="fleet-bench-host").start()
        try:
            repo = sshbytes.make_big_repo(benv.root / "repo", size)
            for index in range(rounds):
                r = sshbytes.one_round(server, repo, benv.env, benv.root, index)
                got["r1"].append(r["first"] / r["pack_first"])
                got["r2"].append(r["second"] / r["pack_second"])
                got["first"].append(r["first"] / 1e6)
                got["second"].append(r["second"] / 1e3)
                got["pack1"].append(r["pack_first"] / 1e6)
                got["pack2"].append(r["pack_second"] / 1e3)
                got["git1"].append(r["git_first"] / 1e6)
                got["git2"].append(r["git_second"] / 1e3)
                got["back1"].append(r["first_back"] / 1e3)
                got["back2"].append(r["second_back"] / 1e3)
        finally:
            server.stop()
    what = f"a repository of {size / 1e6:g} MB of random content in 1 MB files"
    figures = [
        Figure("ssh.push1_ratio", "task 1: bytes sent on the wire ÷ the repository's pack",
               "×", got["r1"], budget=BYTES_BUDGET_FIRST, baseline="ssh.pack1", note=what),
        Figure("ssh.push2_ratio", "task 2: bytes sent on the wire ÷ the new commit's pack",
               "×", got["r2"], budget=BYTES_BUDGET_SECOND, baseline="ssh.pack2",
               note=f"one new commit of {sshbytes.NEW_FILE:,} random bytes"),
        Figure("ssh.push1", "task 1: bytes sent to the host (on the wire)", "MB",
               got["first"], note="every byte the ssh master wrote to the host's sshd"),
        Figure("ssh.push2", "task 2: bytes sent to the host (on the wire)", "kB",
               got["second"]),
        Figure("ssh.pack1", "the repository's pack (baseline)", "MB", got["pack1"]),
        Figure("ssh.pack2", "the new commit's pack (baseline)", "kB", got["pack2"]),
        Figure("ssh.git1", "task 1: what git push reported writing", "MB", got["git1"]),
        Figure("ssh.git2", "task 2: what git push reported writing", "kB", got["git2"]),
        Figure("ssh.back1", "task 1: bytes the host sent back", "kB", got["back1"]),
        Figure("ssh.back2", "task 2: bytes the host sent back", "kB", got["back2"]),
    ]
    notes = [f"Bytes: task 1 sent {figures[2].median:.2f} MB for a {figures[4].median:.2f} MB "
             f"pack, task 2 {figures[3].median:.1f} kB for a {figures[5].median:.1f} kB pack "
             "(counted by a relay in the client config's ProxyCommand: the master's "
             "encrypted bytes to the host's sshd, from after the package was installed: "
             "the `git init --bare` command, git's protocol and pack, SSH's framing)."]
    return figures, notes
