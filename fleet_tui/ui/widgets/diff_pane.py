"""The diff pane: the selected task's changes, and the loader that computes them.

The pane owns the "load a diff" state machine, so the main screen only says which task is
selected (``show``) and whether the diff tab is the one on screen (``set_shown``):

- One `git diff` at a time, in a thread worker: a diff asked for while one runs is
  remembered and loaded next (a key held down over the list costs one diff, not one per
  row).
- A diff is loaded when the selection changes, when the task's state or attempt changes
  (a worker finishing right after the last timed refresh), and every ``interval`` seconds
  while the task runs.
- Nothing is computed while the diff tab is hidden (a `git diff` holds the GIL for nobody
  to see); showing the tab loads what was asked for meanwhile.
- The viewed marks are read from the store with a task's first diff (the view keeps them
  from then on; the detail controller writes each one toggled).
- The DiffView itself is mounted after the first frame (``mount_view``): its file list
  and styles cost the first frame tens of milliseconds. What arrives before it is kept
  and shown when it is there.
"""

from __future__ import annotations

from textual import on, work
from textual.containers import Vertical
from textual.worker import Worker, WorkerState

from fleet_tui.core.states import ACTIVE_STATES, CLOSED_STATES, TaskState
from fleet_tui.ui.formatting import PreparedDiff
from fleet_tui.ui.messages import CommentsLoaded, DiffLoaded, report_failure
from fleet_tui.ui.widgets.line_view import LineView, SearchBar

TYPE_CHECKING = False
if TYPE_CHECKING:
    from fleet_tui.core.model import Task
    from fleet_tui.engine.fleet import Fleet
    from fleet_tui.store.reviews import ReviewComment
    from fleet_tui.ui.widgets.diff_view import DiffView

NOTHING_SELECTED = "Select a task to see its changes."


class DiffPane(Vertical):
    """The diff view of the selected task (mounted after the first frame)."""

    def __init__(self, *, interval: float = 2.0, id: str | None = None) -> None:
        """``interval``: seconds between refreshes of a running task's diff."""
        super().__init__(id=id)
        self.fleet: Fleet | None = None  # set by the screen once the engine is ready
        self.interval = interval
        self.selected: Task | None = None
        self.shown = False  # its tab is the one on screen
        self._view: DiffView | None = None
        self._loading = False  # a git diff runs
        self._worker: Worker[None] | None = None  # the worker of the diff that runs (or ran last)
        self._wanted: str | None = None  # the task whose diff goes next
        # (task id, state, attempt_count) the diff was last asked for: a change of state
        # (a worker finishing right after the last timed refresh) loads it again
        self._key: tuple[str, TaskState, int] | None = None
        self._when_shown: str | None = None  # a diff asked for while the tab was hidden
        self._pending_text = NOTHING_SELECTED  # said once the view is mounted
        self._pending_loaded: DiffLoaded | None = None
        self._search: SearchBar | None = None
        # the review comments of the task shown, read with each diff
        self.comments: tuple[str, list[ReviewComment]] | None = None

    @property
    def view(self) -> DiffView | None:
        """The diff view, or None until it is mounted (with its children)."""
        return self._view

    @property
    def selected_path(self) -> str | None:
        """The file highlighted in the file list (None: all files, or no view yet)."""
        return self._view.selected_path if self._view is not None else None

    @property
    def file_count(self) -> int:
        """Files in the diff shown (0: none, or no view yet)."""
        return self._view.file_count if self._view is not None else 0

    def start(self, fleet: Fleet) -> None:
        """The engine is ready: diffs can be computed, and a running task's is refreshed."""
        self.fleet = fleet
        self.set_interval(self.interval, self._tick)

    async def mount_view(self) -> None:
        """Mount the diff view (after the first frame) and show what came before it."""
        from fleet_tui.ui.widgets.diff_view import DiffLines, DiffView

        view = DiffView(id="diff")
        await self.mount(view)
        if not view.composed:
            return  # the panel is closing: it never got its children
        self._search = SearchBar(view.query_one(DiffLines), id="diff-search")
        await self.mount(self._search)
        self._view = view
        view.show_message(self._pending_text)
        loaded, self._pending_loaded = self._pending_loaded, None
        if loaded is not None and self.selected is not None and loaded.task_id == self.selected.id:
            self._show_loaded(view, loaded)

    # --- search -------------------------------------------------------------------------------
    def open_search(self) -> None:
        """Search the patch shown (`/` in it, ctrl+f anywhere)."""
        if self._search is not None:
            self._search.open()

    @on(LineView.SearchAsked)
    def _search_asked(self, event: LineView.SearchAsked) -> None:
        event.stop()
        self.open_search()

    @on(LineView.SearchMoved)
    def _search_moved(self, event: LineView.SearchMoved) -> None:
        event.stop()
        if self._search is not None:
            self._search.sync()

    # --- what the screen says ----------------------------------------------------------------
    def show(self, task: Task | None, *, new: bool = False) -> None:
        """Show ``task``'s diff: ``new`` for a new selection, else a fresh read of the same
        task (loaded again only when its state or attempt changed)."""
        self.selected = task
        if task is None:
            self._key = None
            if new:
                self._message(NOTHING_SELECTED)
            return
        key = (task.id, task.state, task.attempt_count)
        if new or key != self._key:
            self._key = key
            self._load_now(task, first=new)

    def set_shown(self, shown: bool) -> None:
        """The diff tab was shown (or hidden): load what was asked for while hidden."""
        self.shown = shown
        if not shown:
            return
        wanted, self._when_shown = self._when_shown, None
        if wanted is not None and self.selected is not None and wanted == self.selected.id:
            self._load_now(self.selected, first=True)

    def reload(self) -> None:
        """Load the selected task's diff again (a file was edited)."""
        if self.selected is not None:
            self._load_now(self.selected)

    # --- loading ----------------------------------------------------------------------------
    def _tick(self) -> None:
        task = self.selected
        if task is None or task.state not in ACTIVE_STATES or self._loading:
            return
        self._load_now(task)

    def _message(self, text: str) -> None:
        if self._view is None:
            self._pending_text = text
        else:
            self._view.show_message(text)

    def _load_now(self, task: Task, *, first: bool = False) -> None:
        if task.worktree is None or task.state in CLOSED_STATES:
            why = {TaskState.MERGED: "Merged: the worktree is gone; the change is on "
                                     f"{task.base_branch or 'the base branch'}.",
                   TaskState.DISCARDED: "Discarded."}.get(
                task.state, "No worktree yet: the task has not started.")
            self._message(why)
            return
        if not self.shown:
            # The diff view is hidden: no `git diff` (nor the GIL it holds) for nobody to
            # see; showing the diff tab loads it.
            self._when_shown = task.id
            return
        if first:
            self._message("Loading the diff…")
        if self._loading or self.fleet is None:
            self._wanted = task.id  # one git diff at a time: this one goes next
            return
        self._loading = True
        self._worker = self._load(self.fleet, task.id)

    @work(thread=True, exclusive=True, exit_on_error=False, group="diff",
          description="computing the diff")
    def _load(self, fleet: Fleet, task_id: str) -> None:
        from fleet_tui.core.errors import FleetTuiError
        from fleet_tui.engine.fleet import FleetError
        from fleet_tui.vcs.git import GitError

        try:
            prepared = PreparedDiff.build(fleet.diff(task_id))
        except (FleetError, GitError) as exc:
            self.post_message(DiffLoaded(task_id, None, str(exc)))
            return
        viewed: dict[str, str] | None = None
        if self._view is None or task_id not in self._view.viewed:  # the first time only
            try:
                viewed = fleet.viewed_files(task_id)
            except (FleetTuiError, OSError):
                viewed = None
        self.post_message(DiffLoaded(task_id, prepared, viewed=viewed))
        try:  # the review comments' states, against the diff just read
            comments = fleet.comments(task_id, diff=prepared.diff)
        except (FleetTuiError, OSError):
            return
        self.post_message(CommentsLoaded(task_id, comments))

    def on_comments_loaded(self, message: CommentsLoaded) -> None:
        """(Bubbles on to the screen too: the review keys may apply now.)"""
        self.comments = (message.task_id, message.comments)
        if self._view is not None:
            self._view.set_comments(message.task_id, message.comments)

    def comments_of(self, task_id: str) -> list[ReviewComment]:
        """The comments last read for ``task_id`` (empty when none or not read yet)."""
        return self.comments[1] if self.comments and self.comments[0] == task_id else []

    def on_diff_loaded(self, message: DiffLoaded) -> None:
        """(The message bubbles on to the screen: what applies may have changed.)"""
        self._loading = False
        wanted, self._wanted = self._wanted, None
        task = self.selected
        if wanted is not None and task is not None and wanted == task.id:
            self._load_now(task)  # asked for while this one ran
        if task is None or message.task_id != task.id:
            return
        if self._view is None:
            self._pending_loaded = message
            return
        self._show_loaded(self._view, message)

    def _show_loaded(self, view: DiffView, message: DiffLoaded) -> None:
        if message.prepared is None:
            view.show_message(message.problem or "No diff.")
        else:
            if message.viewed is not None:
                view.set_viewed(message.task_id, message.viewed)
            view.show(message.task_id, message.prepared)
            view.set_comments(message.task_id, self.comments_of(message.task_id))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker is self._worker and event.state in (WorkerState.ERROR,
                                                           WorkerState.CANCELLED):
            # the running diff's worker died (the app's handler says why): let the next
            # load start. Not an earlier worker's: the next diff's start cancels the one
            # before it (exclusive), which may still be reading its review comments, and
            # its end cleared this mark while the new diff ran (a third then ran beside it)
            self._loading = False
            self._wanted = None
        report_failure(self, event)
