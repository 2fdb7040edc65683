"""The main screen's actions: one record per action, and everything about it derived from it.

A record says what the action is (its id, the action it runs, its default keys), how it is
named (the key bar's word, the one-line help of `?` and of the command palette) and when it
applies (its guard). The screen's BINDINGS, its `check_action`, the help screen and the
command palette are all generated from `ACTIONS`, so adding a key means adding one record
here and its handler in the controller that answers it (its `bindings()`: the record's id
to the method, ui/controllers/). lazygit keeps a binding, its handler, its "why not now" and
its description together the same way; posting puts the help on the binding and lets users
rebind keys by the binding's id (`FleetApp(keymap=...)`). Every binding runs the screen's
one action, `act(<id>)`, which calls the handler the id names.

A guard answers with True (the action applies now), False (it does not apply here: the key
is hidden) or a sentence saying why not (the key is shown dimmed, and the reason is what a
click on it, or the command palette, tells). Task actions ask `fleet_tui.core.policy`, the rule
the engine and the CLI follow too: the state table decides whether an action is offered at
all (a finished task is not killed), the policy says why not where it is offered but cannot
be done now (a follow-up for a task whose run never started a session).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from textual.binding import Binding

from fleet_tui.core.states import STATES, VERBS, Action

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.core.model import Task

DISPATCH = "act"
"""The screen's one action (`MainScreen.action_act`): it runs the handler of a record's id."""

Verdict = bool | str
"""True: applies now; False: does not apply here (hidden); a str: why not (dimmed)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What the guards look at: the main screen's state, read once by the screen."""

    targets: Sequence[Task]  # the marked tasks, else the cursor's task
    cursor: Task | None  # the task on the cursor row
    selected: Task | None  # the task the stream and diff show
    marked: int  # how many tasks are marked
    unmarked_shown: bool  # the list shows a task that is not marked
    diff_file: str | None  # the file highlighted in the diff's file list
    filtering: bool  # a filter is typed or its box is open
    in_view: bool = False  # the keys are in the stream, the diff or the tabs, not the list
    served: bool = False  # the panel is in a browser (`fleet-tui serve`)
    diff_files: int = 0  # files in the diff on screen (0: the diff tab is hidden, or none)
    in_diff: bool = False  # the keys are in the diff's lines (a comment goes on the cursor's)
    unsent: int = 0  # review comments of the selected task not sent yet


IN_BROWSER_SHELL = ("The panel is in a browser: a shell would open on the machine that "
                    "serves it, not here. Open one there (ssh), or run `fleet-tui` in its "
                    "terminal.")
IN_BROWSER_EDITOR = ("The panel is in a browser: $EDITOR would open on the machine that "
                     "serves it, not here. The diff shows the file's changes; edit it there "
                     "(ssh), or send the worker a follow-up.")




def task_verdict(action: Action, tasks: Sequence[Task]) -> Verdict:
    """Whether `action` applies to every one of `tasks`: False when one's state does not
    offer it at all (or there is no task), the policy's reason for the first that cannot
    do it now, else True."""
    if not tasks:
        return False
    # here, not at the top: the first frame has no task, and the policy (with the provider
    # tables it reads) costs it milliseconds; the engine, made after it, imports it anyway
    from fleet_tui.core.policy import why_not

    for task in tasks:
        row = STATES.get(task.state)
        if row is None or action not in row.actions:
            return False
    for task in tasks:
        reason = why_not(task, action)
        if reason is not None:
            return f"Cannot {VERBS[action]} {task.id}: {reason}."
    return True


Guard = Callable[[Context], Verdict]


@dataclass(frozen=True, slots=True)
class PanelAction:
    """One action of the main screen."""

    id: str  # the binding's id: what a keymap names to rebind it ("task.merge")
    action: str  # its handler, as its controller names it: "merge", "show_tab('tab-diff')"
    keys: str  # default keys, Textual's names, comma-separated
    label: str  # the key bar's word and the palette's title
    help: str  # one line for `?` and the palette
    show: bool = True  # in the key bar
    key_display: str | None = None
    task: Action | None = None  # a task action: the state table and the policy decide
    on: str = "targets"  # task actions act on "targets" (bulk), "cursor" or "selected"
    when: Guard | None = None  # the rest of the guard (checked first)
    palette: bool = True  # offered by the command palette
    hint: str = ""  # its word in the stream's caption, which names the view's keys
    terminal_only: str = ""  # why not in a browser: it hands this machine's terminal over

    @property
    def name(self) -> str:
        """The action's method name without its arguments ("show_tab")."""
        return self.action.partition("(")[0]

    @property
    def params(self) -> tuple[object, ...]:
        args = self.action.partition("(")[2]
        return (args.rstrip(")").strip("'\""),) if args else ()

    @property
    def dispatch(self) -> str:
        """The Textual action its binding runs: the screen's `act`, with this record's id."""
        return f"{DISPATCH}({self.id!r})"

    def binding(self) -> Binding:
        return Binding(self.keys, self.dispatch, self.label, show=self.show,
                       key_display=self.key_display, id=self.id)

    def verdict(self, ctx: Context) -> Verdict:
        answer = self._verdict(ctx)
        if answer is True and ctx.served and self.terminal_only:
            return self.terminal_only  # it would apply: dimmed, with the reason
        return answer

    def _verdict(self, ctx: Context) -> Verdict:
        if self.when is not None:
            answer = self.when(ctx)
            if answer is not True:
                return answer
        if self.task is None:
            return True
        if self.on == "targets":
            tasks: Sequence[Task] = ctx.targets
        else:
            one = ctx.cursor if self.on == "cursor" else ctx.selected
            tasks = [one] if one is not None else []
        return task_verdict(self.task, tasks)


def _has_worktree(task: Task | None) -> bool:
    return task is not None and task.worktree is not None


def _has_copies(task: Task | None) -> bool:
    """The task was launched as one of several copies of its prompt (best of N)."""
    return task is not None and task.group_id is not None


ACTIONS: tuple[PanelAction, ...] = (
    PanelAction("task.new", "new_task", "n", "New",
                "launch a task (the form; ctrl+s submits)"),
    PanelAction("app.help", "help", "question_mark", "Help", "this help"),
    PanelAction("task.merge", "merge", "m", "Merge",
                "merge into the base branch (conflict preview, message, test gate); with "
                "tasks marked: land them one by one through the merge queue",
                task=Action.MERGE),
    PanelAction("task.discard", "discard", "d", "Discard",
                "delete the task's worktree and branch (asks first)", task=Action.DISCARD),
    PanelAction("task.retry", "retry", "r", "Retry", "run again: fresh, or resume the session",
                task=Action.RETRY),
    PanelAction("task.follow_up", "follow_up", "f", "Follow-up",
                "send a follow-up prompt to a finished task's session",
                task=Action.FOLLOW_UP, on="cursor", when=lambda c: c.marked == 0),
    PanelAction("task.kill", "kill", "k", "Kill",
                "stop a running or queued task (asks first)", task=Action.KILL),
    PanelAction("task.mark", "toggle_mark", "space", "Mark",
                "mark / unmark the cursor row and move down; merge, discard, kill and "
                "retry act on every marked task", when=lambda c: c.cursor is not None),
    PanelAction("task.mark_all", "mark_all", "ctrl+a", "Mark all",
                "mark every task shown in the list (a filter narrows it)",
                when=lambda c: c.unmarked_shown),
    # escape in the stream, the diff or the tabs gives the keys back to the task list; on the
    # list it clears the filter first (while there is one), then the marks; ctrl+\ as in k9s
    PanelAction("view.list", "focus_list", "escape", "Task list",
                "back to the task list (from the stream, the diff or the tabs)", show=False,
                when=lambda c: c.in_view, palette=False),
    PanelAction("list.clear", "clear_filter", "escape", "Clear filter", "clear the filter",
                show=False, when=lambda c: c.filtering),
    PanelAction("task.unmark_all", "unmark_all", "escape,ctrl+backslash", "Unmark all",
                "unmark every task (escape once more after a filter; ctrl+\\ too)",
                key_display="esc", when=lambda c: c.marked > 0),
    PanelAction("task.shell", "shell", "o", "Shell",
                "open $SHELL in the task's worktree (exit to come back)",
                task=Action.SHELL, on="cursor", when=lambda c: _has_worktree(c.cursor),
                terminal_only=IN_BROWSER_SHELL),
    PanelAction("task.edit", "edit", "e", "Edit", "open the highlighted diff file in $EDITOR",
                task=Action.DIFF, on="selected",
                when=lambda c: c.diff_file is not None and _has_worktree(c.selected),
                terminal_only=IN_BROWSER_EDITOR),
    # landing many branches
    PanelAction("task.update", "update", "u", "Update",
                "bring the branch up to date with its base branch; on conflicts choose: "
                "the worker resolves them, a shell, or abort", task=Action.UPDATE,
                on="cursor", when=lambda c: c.marked == 0),
    PanelAction("task.compare", "compare", "c", "Compare",
                "compare the copies of this task side by side (best of N), each one's "
                "diff below; p there picks one", when=lambda c: _has_copies(c.cursor)),
    PanelAction("task.pick", "pick", "p", "Pick",
                "keep this copy: land it through the merge queue, discard the other "
                "copies (asks first)", show=False, task=Action.PICK, on="cursor",
                when=lambda c: c.marked == 0 and _has_copies(c.cursor)),
    PanelAction("task.push", "push", "P", "Push",
                "push the branch to the remote as fleet/<id> instead of merging",
                show=False, task=Action.PUSH, on="cursor", when=lambda c: c.marked == 0),
    PanelAction("queue.view", "queue_view", "Q", "Queue",
                "the merge queue: what lands next, what is tested, what went back to its "
                "worker, what stopped and why", show=False),
    PanelAction("list.filter", "open_filter", "slash", "Filter", "filter the task list"),
    PanelAction("view.stream", "show_tab('tab-stream')", "1", "Stream", "show the live stream",
                show=False),
    PanelAction("view.diff", "show_tab('tab-diff')", "2", "Diff", "show the diff review",
                show=False),
    PanelAction("stream.tools_only", "toggle_tools", "t", "Tools only",
                "stream: tool calls only / everything", show=False,
                when=lambda c: c.selected is not None, hint="tools/all"),
    PanelAction("stream.raw", "toggle_raw", "J", "Raw JSON",
                "stream: raw JSON lines / readable", show=False,
                when=lambda c: c.selected is not None, hint="raw"),
    PanelAction("stream.attempt", "choose_attempt", "a", "Attempt",
                "stream: choose the attempt to show", show=False,
                when=lambda c: c.selected is not None and c.selected.attempt_count > 0,
                hint="attempt"),
    PanelAction("stream.follow", "toggle_follow", "F", "Follow",
                "stream: follow the end on / off", show=False,
                when=lambda c: c.selected is not None, hint="follow"),
    # steering, whole tool output, search, a long list
    PanelAction("task.say", "say", "s", "Say",
                "send a message to a running worker: it joins the worker's turn, or starts "
                "its next one (a finished task takes a follow-up)",
                task=Action.SAY, on="cursor", when=lambda c: c.marked == 0),
    PanelAction("stream.expand", "expand", "x", "Expand",
                "stream: the whole tool call of the selected line (input, output, exit "
                "status); enter too, in the stream", show=False,
                when=lambda c: c.selected is not None, hint="expand"),
    PanelAction("view.search", "search", "ctrl+f", "Search",
                "search the stream or the diff (/ inside them); n / N: next / previous "
                "match, escape: end", show=False,
                when=lambda c: c.selected is not None, hint="search"),
    # reading a diff as a forge's review does
    PanelAction("diff.next_file", "jump_file(1)", "right_square_bracket", "Next file",
                "diff: the next file of the list, its patch shown", show=False,
                when=lambda c: c.diff_files > 0, key_display="]"),
    PanelAction("diff.prev_file", "jump_file(-1)", "left_square_bracket", "Previous file",
                "diff: the previous file of the list", show=False,
                when=lambda c: c.diff_files > 0, key_display="["),
    PanelAction("diff.next_hunk", "jump_hunk(1)", "right_curly_bracket", "Next hunk",
                "diff: the next hunk, on into the next file", show=False,
                when=lambda c: c.diff_files > 0, key_display="}"),
    PanelAction("diff.prev_hunk", "jump_hunk(-1)", "left_curly_bracket", "Previous hunk",
                "diff: the previous hunk, back into the previous file", show=False,
                when=lambda c: c.diff_files > 0, key_display="{"),
    PanelAction("diff.viewed", "toggle_viewed", "v", "Viewed",
                "diff: mark the file viewed (✓) or not; a file that changes again "
                "shows ! until it is marked again", show=False,
                when=lambda c: c.diff_files > 0),
    # review comments
    PanelAction("review.comment", "comment", "C", "Comment",
                "diff: comment on the cursor's line (shift+↑↓ selects a range); the "
                "comment shows under it, and goes to the worker with the review",
                show=False, when=lambda c: c.in_diff and _has_worktree(c.selected)),
    PanelAction("review.list", "review", "R", "Review",
                "the selected task's review comments and their states (open, addressed, "
                "outdated): e edits, d deletes, s sends", show=False,
                when=lambda c: c.selected is not None),
    PanelAction("review.send", "send_review", "ctrl+r", "Send review",
                "send the selected task's comments not sent yet as one message: to the "
                "running worker, else a follow-up in its session", show=False,
                when=lambda c: c.unsent > 0),
    PanelAction("list.closed", "toggle_closed", "H", "Closed",
                "show / hide the merged and discarded tasks (hidden at first)", show=False),
    PanelAction("list.sort", "cycle_sort", "S", "Sort",
                "the next order of the list: needs you first, newest, repository, state",
                show=False),
    PanelAction("app.quit", "quit", "q", "Quit",
                "quit (workers keep running; the next start picks them up)", palette=False),
)

KEY_BAR_ORDER: tuple[str, ...] = (
    "task.new", "app.help", "task.say", "task.merge", "task.follow_up", "task.retry",
    "task.kill", "task.discard", "task.update", "task.shell", "task.edit", "task.compare",
    "task.mark", "task.mark_all", "task.unmark_all", "list.filter", "app.quit")
"""The key bar's order, the most important first: a narrow terminal drops keys from the
end (they stay behind `?`); help and quit always stay (KEY_BAR_PINNED)."""
KEY_BAR_PINNED: tuple[str, ...] = ("app.help", "app.quit")

BY_NAME: dict[str, PanelAction] = {a.name if not a.params else a.action: a for a in ACTIONS}
"""Records by action name ("merge"), or by the whole action where it has arguments."""
BY_ID: dict[str, PanelAction] = {a.id: a for a in ACTIONS}


def find(name: str, params: tuple[object, ...] = ()) -> PanelAction | None:
    """The record of an action as Textual names it (`act('task.merge')`: the dispatch, with
    the record's id), or by its handler's name and parameters ("merge")."""
    if name == DISPATCH:
        return BY_ID.get(str(params[0])) if len(params) == 1 else None
    if params:
        return BY_NAME.get(f"{name}({', '.join(repr(p) for p in params)})")
    return BY_NAME.get(name)


def known_ids(app_bindings: Iterable[object] = ()) -> list[str]:
    """Every binding id a keymap can name: the panel's actions and the ids of the app's own
    bindings (`app_bindings`: the app's BINDINGS, e.g. ctrl+q's "app.ctrl_q")."""
    extra = [b.id for b in app_bindings if isinstance(b, Binding) and b.id]
    return [a.id for a in ACTIONS] + extra


def unknown_ids(keymap: Mapping[str, str], app_bindings: Iterable[object] = ()) -> list[str]:
    """The ids in a keymap that name no binding (a typo would rebind nothing, silently)."""
    return sorted(set(keymap) - set(known_ids(app_bindings)))
