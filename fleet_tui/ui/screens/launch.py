"""The launch form: a prompt and the knobs of one task, validated inline.

It remembers the last options (not the prompt, not the number of copies) in a small JSON
file in fleet-tui's home, because a fleet is usually launched with the same base, model
and limits many times; a line at the top of the form names every remembered value that is
not the default, so nothing is carried over unseen. Copies always starts at 1: a count
carried over silently started twice the workers the user meant, and
the Launch button says how many it starts.

Closing the form (escape, Close) keeps what was typed as a draft: the next `n` in the same
repository opens the form as it was left, says so, and `ctrl+l` clears it. A draft is
what lazygit does with a commit message abandoned half-way: nothing typed is lost to a
stray escape, and no question stands between the user and closing the form. It lives as
long as the panel (a prompt is not written to disk by the form).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, TextArea
from textual.worker import Worker, WorkerState

from fleet_tui.core import durations
from fleet_tui.core.model import MAX_COPIES, TaskSpec
from fleet_tui.core.titles import task_title, title_from_prompt
from fleet_tui.settings.config import PERMISSION_MODES
from fleet_tui.settings.endpoints import DEFAULT as DEFAULT_ENDPOINT
from fleet_tui.settings.hosts import ANY as ANY_HOST
from fleet_tui.settings.hosts import LOCAL as LOCAL_HOST
from fleet_tui.system import paths
from fleet_tui.ui.screens import DIALOG_CSS
from fleet_tui.ui.screens.modals import after_typed_keys, keyed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.vcs.git import Base

EFFORTS = ("low", "medium", "high", "max")
FORM_FILE = "launch-form.json"


@dataclass
class FormValues:
    """The remembered options of the form (everything but the prompt, the title and the
    number of copies)."""

    base_ref: str = ""
    model: str = "main"
    permission_mode: str = ""
    effort: str = ""
    max_turns: str = ""
    timeout: str = ""
    endpoint: str = ""  # a named endpoint of config.toml ("": the default)
    host: str = ""  # a host of config.toml, or "any" ("": local)

    def carried(self) -> list[str]:
        """The remembered values that differ from a fresh form's, as "name value"."""
        fresh = FormValues()
        names = (("base_ref", "base ref"), ("model", "model"),
                 ("permission_mode", "permission mode"), ("effort", "effort"),
                 ("max_turns", "max turns"), ("timeout", "timeout"),
                 ("endpoint", "endpoint"), ("host", "host"))
        return [f"{label} {getattr(self, name)}" for name, label in names
                if getattr(self, name) != getattr(fresh, name)]

    @classmethod
    def load(cls, path: Path | None = None) -> FormValues:
        path = path or (paths.home() / FORM_FILE)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        known = {k: str(v) for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def save(self, path: Path | None = None) -> None:
        path = path or (paths.home() / FORM_FILE)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        except OSError:
            pass  # remembering is a convenience; never fail a launch over it


@dataclass(frozen=True)
class FormDraft:
    """What a closed form held, as typed: the next form in the repository starts from it."""

    prompt: str
    title: str
    copies: str
    base_ref: str
    model: str
    permission_mode: str
    effort: str
    max_turns: str
    timeout: str
    endpoint: str = ""
    host: str = ""


@dataclass(frozen=True)
class LaunchRequest:
    spec: TaskSpec
    copies: int
    base: Base | None = None  # the base the form's check resolved spec.base_ref to


def parse_duration(text: str) -> float | None:
    """'90', '90s', '15m', '1h30m' -> seconds, '0' -> no limit (durations.parse_duration,
    as the CLI's --timeout and config.toml); '' -> None (the setting); ValueError
    otherwise."""
    return durations.parse_duration(text) if text.strip() else None


def parse_positive_int(text: str, *, maximum: int | None = None) -> int | None:
    if not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError("a whole number") from None
    if value < 1 or (maximum is not None and value > maximum):
        raise ValueError(f"between 1 and {maximum}" if maximum else "1 or more")
    return value


def check_base_ref(repo: Path, ref: str) -> str | None:
    """None when ``ref`` names a commit in ``repo``, else a message saying what is wrong
    (git.resolve_base: the engine's own base resolution)."""
    return resolve_base_ref(repo, ref)[1]


def resolve_base_ref(repo: Path, ref: str) -> tuple[Base | None, str | None]:
    """The base ``ref`` names in ``repo`` (git.resolve_base: the engine's own base
    resolution), or a message saying what is wrong. The base goes to the engine with the
    task, which takes it as it is: the ref is looked up once."""
    from fleet_tui.vcs import git  # in the form's check thread: not at the panel's start

    try:
        return git.resolve_base(repo, ref), None
    except git.GitError as exc:
        return None, str(exc)


class LaunchScreen(ModalScreen[LaunchRequest | None]):
    """New task: ctrl+s submits, escape closes (keeping a draft), ctrl+l clears; every field
    says what is wrong with it."""

    CSS_PATH = DIALOG_CSS
    # The prompt takes the focus in on_mount, at once (below): not the first focusable
    # widget (the scrolling fields) meanwhile, where a prompt typed right after `n` went.
    AUTO_FOCUS = ""

    BINDINGS = [
        Binding("ctrl+s", "submit", "Launch", id="launch.submit", priority=True),
        Binding("ctrl+l", "clear", "Clear", id="launch.clear", priority=True),
        Binding("escape", "cancel", "Close", id="launch.cancel"),
    ]

    def __init__(self, repo: Path, *, default_base: str = "", default_model: str = "",
                 form_file: Path | None = None, draft: FormDraft | None = None,
                 endpoints: Sequence[str] = (), hosts: Sequence[str] = ()) -> None:
        """``draft``: what the last form closed in this repository held (it opens so).
        ``endpoints``: the configured endpoints' names, the default first; ``hosts``: the
        hosts' names, local first. The form asks which one only when there are several
        (a host: one of them, or any host with a free slot)."""
        super().__init__(classes="modal")
        self._repo = repo
        self._default_base = default_base
        self._default_model = default_model
        self._form_file = form_file
        self._endpoints = tuple(endpoints) or (DEFAULT_ENDPOINT,)
        self._hosts = tuple(hosts) or (LOCAL_HOST,)
        values = FormValues.load(form_file)
        if values.endpoint not in self._endpoints[1:]:  # gone from config.toml, or default
            values = replace(values, endpoint="")
        if values.host not in (*self._hosts[1:], ANY_HOST):  # gone, or local
            values = replace(values, host="")
        self._values = values
        self._submitting = False
        self._restored = draft
        self._fresh: FormDraft | None = None  # the fields of a fresh form (on mount)
        self.draft: FormDraft | None = None
        """Once closed without launching: what it held, if anything was typed (else None)."""

    def compose(self) -> ComposeResult:
        v = self._values
        carried = self._values.carried()
        with Vertical(classes="dialog form", id="launch-dialog"):
            yield Label(f"New task in {self._repo.name}", classes="dialog-title", markup=False)
            notice = Label("Kept from your last launch: " + ", ".join(carried) + ".",
                           id="carried", classes="dialog-hint", markup=False)
            notice.display = bool(carried) and self._restored is None
            yield notice
            draft = Label("Your draft, as you left it (ctrl+l clears the form).",
                          id="draft-note", classes="dialog-hint", markup=False)
            draft.display = self._restored is not None
            yield draft
            with VerticalScroll(id="launch-fields"):
                yield Label("Prompt", classes="field-label")
                yield TextArea(id="prompt", soft_wrap=True, show_line_numbers=False,
                               tab_behavior="focus")
                yield Label("", id="prompt-error", classes="field-error")
                yield Label("Title", classes="field-label")
                yield Input(id="title", placeholder="the prompt's first line")
                with Grid(id="launch-grid"):
                    with Vertical():
                        yield Label("Copies", classes="field-label")
                        yield Input("1", id="copies")
                        yield Label("", id="copies-error", classes="field-error")
                    with Vertical():
                        yield Label("Base ref", classes="field-label")
                        yield Input(v.base_ref, id="base-ref",
                                    placeholder=self._default_base or "current branch")
                        yield Label("", id="base-ref-error", classes="field-error")
                    with Vertical():
                        yield Label("Model", classes="field-label")
                        yield Input(v.model or "main", id="model",
                                    placeholder="main, small, or a model name")
                        yield Label("", id="model-error", classes="field-error")
                    with Vertical():
                        yield Label("Permission mode", classes="field-label")
                        yield Select([(m, m) for m in PERMISSION_MODES], id="permission-mode",
                                     prompt="from settings",
                                     value=(v.permission_mode if v.permission_mode
                                            in PERMISSION_MODES else Select.NULL))
                    with Vertical():
                        yield Label("Effort", classes="field-label")
                        yield Select([(e, e) for e in EFFORTS], id="effort",
                                     prompt="from settings",
                                     value=v.effort if v.effort in EFFORTS else Select.NULL)
                    with Vertical():
                        yield Label("Max turns", classes="field-label")
                        yield Input(v.max_turns, id="max-turns", placeholder="no limit")
                        yield Label("", id="max-turns-error", classes="field-error")
                    with Vertical():
                        yield Label("Timeout", classes="field-label")
                        yield Input(v.timeout, id="timeout", placeholder="settings (e.g. 30m)")
                        yield Label("", id="timeout-error", classes="field-error")
                    if len(self._endpoints) > 1:  # one endpoint: nothing to choose
                        with Vertical():
                            yield Label("Endpoint", classes="field-label")
                            yield Select([(e, e) for e in self._endpoints], id="endpoint",
                                         allow_blank=False,
                                         value=v.endpoint or self._endpoints[0])
                    if len(self._hosts) > 1:  # this machine alone: nothing to choose
                        with Vertical():
                            yield Label("Host", classes="field-label")
                            yield Select([*((h, h) for h in self._hosts),
                                          ("any free host", ANY_HOST)], id="host",
                                         allow_blank=False, value=v.host or self._hosts[0])
            with Horizontal(classes="dialog-buttons"):
                # on a small terminal the last fields are below the fold: said here, in
                # the buttons' row (a row of its own would take a line from the fields)
                yield Label("", id="more-below", classes="dialog-hint", markup=False)
                yield Button(keyed("Launch", "ctrl+s"), id="launch", variant="primary")
                yield Button(keyed("Clear", "ctrl+l"), id="clear")
                yield Button(keyed("Close", "esc"), id="cancel")

    def on_mount(self) -> None:
        fields = self.query_one("#launch-fields", VerticalScroll)
        for name in ("scroll_y", "virtual_size", "size"):
            self.watch(fields, name, self._say_more_below, init=False)
        self.call_after_refresh(self._say_more_below)
        # and now and then: a layout can settle without any of those changing
        self.set_interval(0.5, self._say_more_below)
        self._fresh = self._typed()
        if self._restored is not None:
            self._fill(self._restored)
        for prompt in self.query("#prompt").results(TextArea):
            # set_focus, not focus() (that one waits for the app's queue); no scroll: a
            # focus set before the form is laid out scrolled it on a small terminal
            self.set_focus(prompt, scroll_visible=False)
            prompt.move_cursor(prompt.document.end)

    def on_resize(self) -> None:
        self.call_after_refresh(self._say_more_below)

    def _say_more_below(self, *_: object) -> None:
        """"↓ more below" while a field is out of view under the fold (a blank line under
        the last one is no field)."""
        fields = self.query_one("#launch-fields", VerticalScroll)
        bottom = fields.content_region.bottom
        below = any(w.region.bottom > bottom for w in fields.query("Input, Select, TextArea")
                    if w.display and w.region.height)
        self.query_one("#more-below", Label).update(
            "↓ more below (scroll, tab)" if below else "")

    # --- the draft -----------------------------------------------------------------------
    def _typed(self) -> FormDraft:
        """Every field as it stands."""
        def chosen(widget_id: str) -> str:
            value = self.query_one(f"#{widget_id}", Select).value
            return value if isinstance(value, str) else ""

        return FormDraft(
            prompt=self.query_one("#prompt", TextArea).text,
            title=self.query_one("#title", Input).value,
            copies=self.query_one("#copies", Input).value,
            base_ref=self.query_one("#base-ref", Input).value,
            model=self.query_one("#model", Input).value,
            permission_mode=chosen("permission-mode"), effort=chosen("effort"),
            max_turns=self.query_one("#max-turns", Input).value,
            timeout=self.query_one("#timeout", Input).value,
            endpoint=self._endpoint(), host=self._host())

    def _endpoint(self) -> str:
        """The endpoint chosen ("" when the form has no such field: the default)."""
        return self._named("endpoint", self._endpoints[0])

    def _host(self) -> str:
        """The host chosen, or "any" ("" when the form has no such field: local)."""
        return self._named("host", self._hosts[0])

    def _named(self, widget_id: str, first: str) -> str:
        """A name chosen in a Select the form may not have ("": none, or the first)."""
        for select in self.query(f"#{widget_id}").results(Select):
            value = select.value
            return value if isinstance(value, str) and value != first else ""
        return ""

    def _fill(self, draft: FormDraft) -> None:
        self.query_one("#prompt", TextArea).text = draft.prompt
        for widget_id, value in (("title", draft.title), ("copies", draft.copies),
                                 ("base-ref", draft.base_ref), ("model", draft.model),
                                 ("max-turns", draft.max_turns), ("timeout", draft.timeout)):
            self.query_one(f"#{widget_id}", Input).value = value
        for widget_id, value, allowed in (
                ("permission-mode", draft.permission_mode, PERMISSION_MODES),
                ("effort", draft.effort, EFFORTS)):
            select: Select[str] = self.query_one(f"#{widget_id}", Select)
            if value in allowed:
                select.value = value
            else:
                select.clear()
        for widget_id, name, names in (("endpoint", draft.endpoint, self._endpoints),
                                       ("host", draft.host, (*self._hosts, ANY_HOST))):
            for chosen in self.query(f"#{widget_id}").results(Select):
                chosen.value = name if name in names else names[0]

    def action_clear(self) -> None:
        """A fresh form: the prompt and title empty, one copy, the remembered options."""
        v = self._values
        if self._fresh is not None:
            self._fill(self._fresh)
        self._restored = None
        self.query_one("#draft-note", Label).display = False
        self.query_one("#carried", Label).display = bool(v.carried())
        for field in ("prompt", "copies", "base-ref", "model", "max-turns", "timeout"):
            self._error(field, "")
        self.query_one("#prompt", TextArea).focus()

    @on(Button.Pressed, "#clear")
    def _clear_pressed(self) -> None:
        self.action_clear()

    # --- live feedback -------------------------------------------------------------------
    @on(TextArea.Changed, "#prompt")
    def _prompt_changed(self, event: TextArea.Changed) -> None:
        text = event.text_area.text
        first = title_from_prompt(text) if text.strip() else ""
        self.query_one("#title", Input).placeholder = first or "the prompt's first line"
        if first:
            self._error("prompt", "")

    @on(Input.Changed)
    def _field_changed(self, event: Input.Changed) -> None:
        if event.input.id in ("max-turns", "timeout", "copies", "model"):
            self._validate_numbers()
        if event.input.id == "copies":
            self._label_launch()

    def _label_launch(self) -> None:
        """The button says what it starts: "Launch", or "Launch 3 copies"."""
        try:
            copies = parse_positive_int(self._value("copies"), maximum=MAX_COPIES) or 1
        except ValueError:
            copies = 1
        label = "Launch" if copies == 1 else f"Launch {copies} copies"
        button = self.query_one("#launch", Button)
        button.label = keyed(label, "ctrl+s")
        button.refresh(layout=True)  # Button.label does not ask for a new width itself

    def _error(self, field: str, message: str) -> None:
        label = self.query_one(f"#{field}-error", Label)
        label.update(message)
        label.set_class(bool(message), "-shown")

    def _value(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value.strip()

    def _validate_numbers(self) -> bool:
        ok = True
        for field, parse in (
            ("max-turns", lambda t: parse_positive_int(t)),
            ("timeout", parse_duration),
            ("copies", lambda t: parse_positive_int(t, maximum=MAX_COPIES)),
        ):
            try:
                parse(self._value(field))
                self._error(field, "")
            except ValueError as exc:
                self._error(field, f"Expected {exc}.")
                ok = False
        if not self._value("model"):
            self._error("model", "main, small, or a model name.")
            ok = False
        else:
            self._error("model", "")
        return ok

    # --- submit --------------------------------------------------------------------------
    def action_submit(self) -> None:
        after_typed_keys(self, self._submit)

    def _submit(self) -> None:
        if self._submitting:
            return
        prompt = self.query_one("#prompt", TextArea).text
        ok = self._validate_numbers()
        if not prompt.strip():
            self._error("prompt", "The prompt is empty: say what the worker should do.")
            ok = False
        if not ok:
            self.app.bell()
            return
        self._submitting = True
        self._check_and_submit(prompt, self._value("base-ref"))

    @work(thread=True, exclusive=True, exit_on_error=False, group="launch-check",
          description="checking the base ref")
    def _check_and_submit(self, prompt: str, base_ref: str) -> None:
        base, problem = resolve_base_ref(self._repo, base_ref) if base_ref else (None, None)
        self.app.call_from_thread(self._finish_submit, prompt, base_ref, base, problem)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self._submitting = False
            handler = getattr(self.app, "on_worker_state_changed", None)
            if handler is not None:
                handler(event)

    def _finish_submit(self, prompt: str, base_ref: str, base: Base | None,
                       problem: str | None) -> None:
        self._submitting = False
        if problem:
            self._error("base-ref", problem)
            self.app.bell()
            return
        self._error("base-ref", "")
        permission = self.query_one("#permission-mode", Select).value
        effort = self.query_one("#effort", Select).value
        title = task_title(self._value("title"), prompt)
        copies = parse_positive_int(self._value("copies"), maximum=MAX_COPIES) or 1
        spec = TaskSpec(
            prompt=prompt.strip(),
            title=title,
            repo=self._repo,
            base_ref=base_ref or None,
            model=self._value("model") or "main",
            permission_mode=permission if isinstance(permission, str) else None,
            effort=effort if isinstance(effort, str) else None,
            max_turns=parse_positive_int(self._value("max-turns")),
            timeout=parse_duration(self._value("timeout")),
            endpoint=self._endpoint() or None,
            host=self._host() or None,
        )
        FormValues(
            base_ref=base_ref, model=spec.model, permission_mode=spec.permission_mode or "",
            effort=spec.effort or "", max_turns=self._value("max-turns"),
            timeout=self._value("timeout"), endpoint=spec.endpoint or "",
            host=spec.host or "",
        ).save(self._form_file)
        self.dismiss(LaunchRequest(spec, copies, base))

    def action_cancel(self) -> None:
        """Close; what was typed stays as a draft (none when the form is as a fresh one)."""
        typed = self._typed()
        self.draft = None if typed == self._fresh else typed
        self.dismiss(None)

    @on(Button.Pressed, "#launch")
    def _launch_pressed(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel()
