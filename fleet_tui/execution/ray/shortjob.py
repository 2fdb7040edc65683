"""A Ray host's short jobs: the update of a task's worktree on the node that holds it (the
base sent as a bundle of what the node lacks; on conflicts the worktree is left mid-merge
there, for its worker), or that update's abort. Each is a Ray job pinned to that node,
running job.py's `run_update`, waited for, its answer and the branch it sends back read from
its log.

The host (host.py) decides whether a short job is needed and may run; this part submits it,
waits for it and reads what it said.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_tui.execution.worker import job
from fleet_tui.system.files import write_json_atomic

if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.execution.ray.host import RayHost

UPDATE_WAIT = 300.0  # seconds for an update job to end


class ShortJobs:
    """The short jobs of one Ray host (its constants and errors are host.py's)."""

    def __init__(self, host: RayHost) -> None:
        self.host = host
        self.update_jobs: list[str] = []  # the update and abort jobs it ran
        self.short_bundles: list[dict[str, Any]] = []  # what each of them was sent

    def update(self, task: Task, node: str, base_commit: str, strategy: str,
               message: str) -> dict[str, Any]:
        """The update job's answer (its branch, when it sent one, kept in the newest
        attempt folder and collected as fleet/ID)."""
        found = self.host.git_identity(Path(task.repo))
        order = {"ref": f"refs/fleet/base/update/{task.id}", "update_base": base_commit,
                 "strategy": strategy, "message": message,
                 "identity": {"name": found[0], "email": found[1]} if found else {}}
        return self.run(task, node, order, bundle=base_commit)

    def run(self, task: Task, node: str, extra: dict[str, Any], *,
            bundle: str | None) -> dict[str, Any]:
        """A short job of the task pinned to `node` (job.py `run_update`: an update of its
        worktree there, `bundle` the commit it needs, sent as what the node lacks; or its
        abort), waited for; its answer, its branch kept when it sent one. A node that
        lacked what the bundle was cut against gets the job again with the whole one."""
        from fleet_tui.execution.ray import host as ray_host

        repo = Path(task.repo)
        mirror = self.host.mirror_path(repo)
        for have in ([self.host.book.tips(node, mirror)] if bundle else [[]]) + [[]]:
            staging = Path(tempfile.mkdtemp(prefix="fleet-ray-update-"))
            try:
                sent: dict[str, Any] = {}
                if bundle is not None:
                    sent = self.host._bundle(repo, bundle, f"update/{task.id}",
                                             staging / job.BUNDLE_FILE, have)
                order = {"update": True, "task_id": task.id, "host": self.host.name,
                         "mirror": mirror, "worktree": self.host.worktree_path(task.id),
                         "branch": task.branch or f"fleet/{task.id}", "base": task.base_commit,
                         "conflicted": list(task.conflicts), "data_dir": self.host.data_dir,
                         "released": self.host.book.released(), **extra}
                (staging / job.ORDER_FILE).write_text(json.dumps(order))
                kind = "abort" if extra.get("abort") else "update"
                digest = hashlib.sha256(f"{bundle} {time.time_ns()}".encode()).hexdigest()
                sid = f"fleet-{task.id}-{kind}-{digest[:10]}"
                client = self.host.client()
                try:
                    ray_host.submit_job(
                        client,
                        entrypoint=(f"{shlex.quote(self.host.python)} -m "
                                    f"{ray_host.ENTRYPOINT_MODULE}"),
                        submission_id=sid,
                        runtime_env={"working_dir": str(staging),
                                     "py_modules": [ray_host._package_dir()],
                                     "excludes": ray_host.EXCLUDES},
                        metadata={"fleet-tui-task": task.id, f"fleet-tui-{kind}": "1",
                                  "fleet-tui-host": self.host.name},
                        entrypoint_label_selector={ray_host.NODE_LABEL: node})
                except Exception as exc:
                    raise ray_host.RayError(f"host {self.host.name}: the Ray cluster did not "
                                            f"take the {kind} job: {str(exc)[-300:]}") from None
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self.update_jobs.append(sid)
            self.short_bundles.append(sent)
            answer, lacked = self._answer(task, node, sid)
            if not lacked or not have:
                return answer
            self.host.book.set_tips(node, mirror, [])  # what it held is not known: whole
        return answer

    def _answer(self, task: Task, node: str, sid: str) -> tuple[dict[str, Any], bool]:
        """A short job's answer once it ended (and whether its node lacked what its
        bundle needed)."""
        from fleet_tui.execution.ray import host as ray_host

        client = self.host.client()
        deadline = time.monotonic() + UPDATE_WAIT
        status = ""
        while True:
            info = client.get_job_info(sid)
            status = str(getattr(info.status, "value", info.status))
            if status in ray_host.TERMINAL:
                break
            if time.monotonic() >= deadline:
                with contextlib.suppress(Exception):
                    client.stop_job(sid)
                raise ray_host.RayError(f"host {self.host.name}: the job {sid} did not end "
                                        f"within {UPDATE_WAIT:g} s")
            time.sleep(0.5)
        answer: dict[str, Any] = {}
        lacked = False
        pieces = bytearray()
        bundle_head: dict[str, Any] | None = None
        for line in str(client.get_job_logs(sid)).split("\n"):
            frame = job.decode_frame(line)
            if frame is None:
                continue
            head, body = frame
            if isinstance(head.get("update"), dict):
                answer = head["update"]
            elif "mirror" in head:
                self.host.book.set_tips(node, str(head["mirror"]), list(head.get("tips") or []))
            elif isinstance(head.get("released"), dict):
                said = head["released"]
                self.host.book.cleaned(node, list(said.get("removed") or []),
                                       list(said.get("absent") or []))
            elif "error" in head:
                answer = {"error": str(head["error"])}
                lacked = bool(head.get("lacks"))
            elif "bundle" in head:
                at = int(head["o"])
                pieces[at:at + len(body)] = body
                bundle_head = head
        if not answer:
            answer = {"error": f"the job {sid} ended {status} without an answer"}
        if bundle_head is not None:
            self._keep_branch(task, bytes(pieces), bundle_head)
        return answer, lacked

    def _keep_branch(self, task: Task, data: bytes, head: dict[str, Any]) -> None:
        """A branch an update job sent, as the newest attempt folder's (what `collect`
        fetches), its digest checked."""
        from fleet_tui.execution.ray import host as ray_host

        if len(data) != int(head["size"]) or hashlib.sha256(data).hexdigest() != head["sha256"]:
            raise ray_host.RayError(f"host {self.host.name}: the update job's branch of task "
                                    f"{task.id} came back damaged")
        newest = self.host._newest_branch(task)
        if newest is None:
            return
        folder, rec = newest
        if data:
            tmp = folder / (ray_host.BRANCH_BUNDLE + ".update")
            tmp.write_bytes(data)
            os.replace(tmp, folder / ray_host.BRANCH_BUNDLE)
        write_json_atomic(folder / ray_host.BRANCH_FILE,
                          {"tip": head["bundle"], "seq": int(rec.get("seq") or 0) + 1,
                           "bundle": bool(data), "by": "update"})
        self.host.collect(task)
