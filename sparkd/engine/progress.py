"""A byte progress bar on a terminal (model writes and loads); a no-op elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Callable

# Called with (bytes done, total or None); (None, None) closes the bar.
ByteProgress = Callable[[int | None, int | None], None]


def byte_progress(label: str, total: int | None = None, quiet: bool = False) -> ByteProgress:
    if quiet or not sys.stderr.isatty():
        return lambda done, tot: None
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

    prog = Progress(label, BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True)
    task = prog.add_task(label, total=total)
    prog.start()

    def update(done: int | None, tot: int | None) -> None:
        if done is None:
            prog.stop()
        else:
            prog.update(task, completed=done, total=tot if tot is not None else total)
    return update
