"""What the demo shows on the terminal: section headings, a live training bar fed from a FineTuneJob's status,
and small tables. On a terminal the bar redraws in place; elsewhere (CI logs, a pipe) it prints one line per
phase change and per tenth of the steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError


def heading(console: Console, number: int, total: int, title: str) -> None:
    console.print()
    console.rule(f"[bold]{number}/{total}  {title}", align="left")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> Table:
    t = Table(show_edge=False, box=None, padding=(0, 2, 0, 0), header_style="bold")
    for i, h in enumerate(headers):
        t.add_column(h, justify="right" if i in right else "left", overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


class TrainingBar:
    """A progress bar with the job's phase, step/total, loss, tokens/s and ETA, updated from status."""

    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(
            TextColumn("[bold cyan]{task.fields[phase]:<10}"),
            BarColumn(bar_width=32),
            TextColumn("{task.fields[steps]:>11}"),
            TextColumn("loss {task.fields[loss]:>7}"),
            TextColumn("{task.fields[tps]:>7} tokens/s"),
            TextColumn("ETA {task.fields[eta]:>6}"),
            console=console,
            disable=not self.live,
        )
        self.task: TaskID | None = None
        self._printed: tuple[str, int] = ("", -1)

    def __enter__(self) -> TrainingBar:
        self.progress.start()
        self.task = self.progress.add_task("training", total=None, **self._fields({}))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.progress.stop()

    @staticmethod
    def _fields(status: Mapping[str, Any]) -> dict[str, Any]:
        p = status.get("progress") or {}
        step, total = p.get("step"), p.get("totalSteps")
        loss, tps = p.get("loss"), p.get("tokensPerSecond")
        return {
            "phase": status.get("phase") or "Pending",
            "steps": f"{step if step is not None else '-'}/{total or '-'}",
            # The texts `kubectl get` shows, when the status has them.
            "loss": p.get("lossDisplay") or (f"{loss:.4f}" if loss is not None else "-"),
            "tps": f"{tps:.0f}" if tps is not None else "-",
            "eta": p.get("etaDisplay") or duration(p.get("etaSeconds")),
        }

    def update(self, status: Mapping[str, Any]) -> None:
        assert self.task is not None
        p = status.get("progress") or {}
        fields = self._fields(status)
        total = p.get("totalSteps")
        self.progress.update(self.task, total=total, completed=p.get("step") or 0, **fields)
        if not self.live:
            tenth = int(10 * (p.get("step") or 0) / total) if total else -1
            if (fields["phase"], tenth) != self._printed:
                self._printed = (fields["phase"], tenth)
                self.print(
                    f"{fields['phase']:<10} step {fields['steps']}  loss {fields['loss']}  "
                    f"{fields['tps']} tokens/s  ETA {fields['eta']}"
                )

    def print(self, renderable: Any) -> None:
        """Print above the bar (the bar stays at the bottom)."""
        if isinstance(renderable, str):
            self.console.print(Text(renderable), soft_wrap=True)
        else:
            self.console.print(renderable)
