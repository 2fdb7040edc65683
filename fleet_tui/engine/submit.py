"""A new task: its spec validated (everything that would only fail at launch is refused
before anything is stored), then stored queued, as one task or as copies of one prompt."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fleet_tui.core import titles
from fleet_tui.core.durations import check_seconds
from fleet_tui.core.errors import FleetTuiError, InvalidSpec
from fleet_tui.core.model import MAX_COPIES, Task, TaskSpec, check_text
from fleet_tui.engine.context import Part
from fleet_tui.execution import remote_cage
from fleet_tui.settings.config import PERMISSION_MODES, ConfigError
from fleet_tui.settings.config_core import check_length
from fleet_tui.vcs import git

__all__ = ["Submissions", "check_text"]


class Submissions(Part):
    """Submitting tasks (`submit`)."""

    def submit(self, spec: TaskSpec, copies: int = 1, *,
               base: git.Base | None = None) -> list[Task]:
        """Validate a task spec and store `copies` queued tasks (they start in `tick`).

        `base`: the base `spec.base_ref` names, as the entry point that checked the ref
        resolved it (the launch form), taken as it is; None: the ref is resolved here.

        Everything that would only fail at launch is refused here, before anything is
        stored (InvalidSpec): text claude cannot take (`check_text`), numbers out of range,
        and a setup claude refuses (root with bypassPermissions without the sandbox
        opt-in; scrub_tool_env without bubblewrap). Prompts of any length are accepted."""
        prompt = spec.prompt.strip() if isinstance(spec.prompt, str) else ""
        if not prompt:
            raise InvalidSpec("the prompt is empty; say what the worker should do")
        check_text("prompt", spec.prompt)
        for what, text in (("title", spec.title), ("base ref", spec.base_ref),
                           ("model", spec.model), ("effort", spec.effort)):
            if isinstance(text, str):
                check_text(what, text)
        for arg in spec.extra_args:
            check_text("argument", arg)
        for what, text in (("base ref", spec.base_ref), ("model", spec.model),
                           ("effort", spec.effort), *(("argument", a) for a in spec.extra_args)):
            try:  # each reaches claude's argv or environment: refused here, not at launch
                if isinstance(text, str):
                    check_length(text)
            except ValueError as exc:
                raise InvalidSpec(f"the {what} is {exc}") from None
        if isinstance(copies, bool) or not isinstance(copies, int) or \
                not 1 <= copies <= MAX_COPIES:
            raise InvalidSpec(f"copies must be a whole number from 1 to {MAX_COPIES} "
                              f"(got {copies!r})")
        turns = spec.max_turns
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int)
                                  or turns < 1):
            raise InvalidSpec(f"max turns must be a whole number of at least 1 (got {turns!r})")
        if spec.timeout is not None:  # durations.py's rule, as --timeout and the form
            try:
                check_seconds(spec.timeout)
            except ValueError as exc:
                raise InvalidSpec(f"the timeout must be {exc}; 0 for none "
                                  f"(got {spec.timeout!r})") from None
        if spec.permission_mode is not None and spec.permission_mode not in PERMISSION_MODES:
            raise InvalidSpec(f"unknown permission mode {spec.permission_mode!r}; use one of "
                              + ", ".join(PERMISSION_MODES))
        if spec.endpoint is not None:
            check_text("endpoint", spec.endpoint)
        try:  # a name config.toml does not define: refused with the names it does
            endpoint = self.settings.endpoint(spec.endpoint).name
        except ConfigError as exc:
            raise InvalidSpec(str(exc)) from None
        host = self._host(spec.host)
        repo = git.main_worktree(spec.repo if spec.repo is not None else Path.cwd())
        try:  # a repository whose settings never read would fail each attempt at its start
            repo_cfg = self.repo_settings.get(repo)
        except ConfigError as exc:
            raise InvalidSpec(f"the repository's settings do not read: {exc}") from None
        from fleet_tui.settings.hosts import ANY, LOCAL

        settings = repo_cfg.apply(self.settings.for_endpoint(endpoint))
        uncageable = None
        if host not in (LOCAL, ANY):  # caged there only where its last `host check` said so
            uncageable = remote_cage.refusal(self.supervisor.host_of_name(host), settings.cage)
            settings = dataclasses.replace(settings, cage="off")  # this machine's cage: n/a
        try:  # what the host's claude would refuse (root, the cage: the local host's)
            self.supervisor.host_of_name(host).check_setup(
                settings, self.env, args=spec.extra_args, permission_mode=spec.permission_mode)
        except FleetTuiError as exc:
            raise InvalidSpec(str(exc)) from None
        if uncageable is not None:
            raise InvalidSpec(uncageable)
        model = (spec.model or "main").strip()
        if not model:
            raise InvalidSpec("the model is empty; use main, small or a model name")
        base_ref = spec.base_ref.strip() if spec.base_ref else None
        if base is None or base_ref is None:
            base = git.resolve_base(repo, base_ref)
        title = titles.task_title(spec.title, prompt)
        # copies of one prompt share a group (the compare view and pick find them by it)
        group_id = None
        if copies > 1:
            import secrets  # here: hmac, hashlib and random load for copies alone

            group_id = f"g{secrets.token_hex(6)}"
        tasks: list[Task] = []
        for i in range(copies):
            tasks.append(self.store.create_task(
                prompt=spec.prompt, repo=repo, now=self.clock(), group_id=group_id,
                title=titles.copy_title(title, i + 1, copies),
                base_ref=base_ref,
                base_branch=base.branch, base_commit=base.commit,
                endpoint=endpoint, host=host, model=model,
                permission_mode=spec.permission_mode, effort=spec.effort,
                max_turns=spec.max_turns, timeout=spec.timeout,
                extra_args=list(spec.extra_args)))
        return tasks

    def _host(self, wanted: str | None) -> str:
        """The host a new task asks for: a host of config.toml, `local` (None), or `any`
        (placed by its first claim on the host with a free slot). InvalidSpec naming the
        hosts for any other name, and for a host this build or machine cannot use."""
        from fleet_tui.settings.hosts import ANY

        if wanted is None or not wanted.strip():
            return self.settings.host().name
        name = wanted.strip()
        check_text("host", name)
        if name == ANY:
            return ANY
        if name in self.supervisor.hosts.names():  # config.toml's, or given to the engine
            host = name
        else:
            try:
                host = self.settings.host(name).name
            except ConfigError as exc:
                raise InvalidSpec(f"{exc}; or `any`: the host with a free slot") from None
        why = self.supervisor.hosts.why_not(host)
        if why is not None:
            raise InvalidSpec(why)
        return host
