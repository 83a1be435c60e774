"""Errors of the launcher and the process around the ranks (the hook library's own errors and
the exit codes live in ``openclaw_ref.sync.errors``, which imports nothing outside ``sync/``)."""

from __future__ import annotations

from openclaw_ref.sync.errors import EXIT_FAILURE, OpenClawError, SyncTimeout


class RankFailed(OpenClawError):
    """A rank raised or died. ``cause`` is the rank's own exception where it could be sent back."""

    def __init__(self, rank: int, summary: str, traceback_text: str = "",
                 cause: BaseException | None = None) -> None:
        self.rank = rank
        self.summary = summary
        self.traceback_text = traceback_text
        self.cause = cause
        super().__init__(f"rank {rank} failed: {summary}")

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        if isinstance(self.cause, OpenClawError):
            return self.cause.exit_code
        return EXIT_FAILURE

    def __reduce__(self):
        return (RankFailed, (self.rank, self.summary, self.traceback_text, self.cause))


class LaunchTimeout(SyncTimeout):
    """The launcher's own deadline passed; ``ranks`` had not finished. ``stacks_dir``: where
    each of them wrote its stacks (``rank_process.stacks_file``), if they were asked."""

    def __init__(self, detail: str, *, ranks: list[int] | None = None,
                 stacks_dir: str | None = None) -> None:
        super().__init__(detail, ranks=ranks)
        self.stacks_dir = stacks_dir

    def __reduce__(self):
        return (_rebuild_launch_timeout, (self.detail, self.ranks, self.stacks_dir))


def _rebuild_launch_timeout(detail, ranks, stacks_dir=None):
    return LaunchTimeout(detail, ranks=ranks, stacks_dir=stacks_dir)


def exit_code_for(exc: BaseException) -> int:
    return exc.exit_code if isinstance(exc, OpenClawError) else EXIT_FAILURE
