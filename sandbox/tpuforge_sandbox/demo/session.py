"""What every step of a demo works with: `DemoSession`, the state one run builds up (the sandbox, the console,
the options, the jobs and their last statuses, the API client, the pods to point at in the end, what went
wrong), and the helpers the steps share: printing, numbered headings, the sandbox's environment, `kubectl get`
tables; and how to type one of this environment's commands (`tool_path`).

A demo is a `Scenario`: data naming its jobs' documents and the steps it runs, in order. A step is a plain
function of the session (`setup`, `follow`, `results`, `evaluation`, `verilog`, `kueue` hold them); a
`Section` is a step under a numbered heading. `scenarios` lists the demos and runs one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from tpuforge_sandbox.config import repo_root
from tpuforge_sandbox.demo.job import DemoJob
from tpuforge_sandbox.demo.view import duration, heading
from tpuforge_sandbox.sandbox import Sandbox

NAMESPACE = "default"


def tool_path(name: str) -> str:
    """How to type one of this environment's commands: bare when it is on PATH, else its path."""
    mine = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and Path(found).resolve() == mine.resolve():
        return name
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)


Step = Callable[["DemoSession"], None]


@dataclass(frozen=True)
class Section:
    """A step under a numbered heading; `title` may read the session (the job's name, a version)."""

    title: str | Callable[[DemoSession], str]
    step: Step


@dataclass(frozen=True)
class Scenario:
    """One demo as data: the FineTuneJob documents it applies, the steps it runs in order, and what it expects."""

    name: str
    jobs_yaml: Path
    steps: tuple[Step | Section, ...]
    watched: str = "finetunejobs"  # what the live `kubectl get` tables list
    held_back: tuple[str, ...] = ()  # jobs whose evaluation is meant to fail (not be promoted)

    @property
    def sections(self) -> int:
        return sum(isinstance(s, Section) for s in self.steps)


@dataclass
class DemoSession:
    """One demo run's state, built up by its steps."""

    sb: Sandbox
    console: Console
    scenario: Scenario
    preempt: bool = False
    serve: bool | None = None
    hosts: int = 1
    method: str = "sft"  # the training method of a preference demo's job (dpo, orpo)
    root: Path = field(default_factory=repo_root)
    started: float = field(default_factory=time.monotonic)
    jobs: list[DemoJob] = field(default_factory=list)
    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)  # job name -> its last status
    pods: dict[str, str] = field(default_factory=dict)  # what to point at in the end: "train-0", "merge", "serve"
    serving_name: str = "demo"  # examples/serving-demo.yaml's
    serving_body: dict[str, Any] | None = None  # the ServingDeployment a demo of several jobs applies
    kueue: list[dict[str, Any]] = field(default_factory=list)  # the chart's Kueue objects, for the queue demo
    operator_port: int = 0
    # What the demo set out to show and did not (a failed evaluation it meant to pass, serving that never became
    # Ready, a preemption that was not resumed): the demo goes on to the end, then fails with these.
    problems: list[str] = field(default_factory=list)
    halted: bool = False  # a step found the demo cannot go on (a job failed): the run ends with exit status 1
    section: int = 0
    kubectl: str | None = field(init=False)
    tpuforge: str = field(init=False)
    _api: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.kubectl = shutil.which("kubectl", path=self.env()["PATH"])
        self.tpuforge = tool_path("tpuforge")

    @property
    def job(self) -> DemoJob | None:
        """The demo's (first) job: the one the closing commands name."""
        return self.jobs[0] if self.jobs else None

    @property
    def api(self) -> Any:
        """The admin's API client, opened on first use (once the sandbox is up) and closed by `close`."""
        if self._api is None:
            self._api = self.sb.api_client()
        return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    def finish(self) -> int:
        """The last lines: the time taken, or what did not happen and exit status 1."""
        if self.problems:
            self.say("\ndemo failed: " + "; ".join(self.problems), style="bold red")
            return 1
        self.say(f"\ndemo finished in {duration(time.monotonic() - self.started)}", style="bold green")
        return 0

    # -- helpers ---------------------------------------------------------------------------------------------
    def heading(self, title: str) -> None:
        self.section += 1
        heading(self.console, self.section, self.scenario.sections, title)

    def say(self, text: str, style: str = "") -> None:
        self.console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)

    def env(self) -> dict[str, str]:
        return {**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, **self.sb.env()}

    def kubectl_table(self, *args: str) -> str:
        if not self.kubectl:
            return ""
        out = subprocess.run(
            [self.kubectl, *args, "-n", NAMESPACE], env=self.env(), capture_output=True, text=True, timeout=30
        )
        return out.stdout.rstrip()


def run(session: DemoSession) -> int:
    """Run the session's scenario, its steps in order; the demo's exit status."""
    try:
        for item in session.scenario.steps:
            if isinstance(item, Section):
                session.heading(item.title if isinstance(item.title, str) else item.title(session))
                item.step(session)
            else:
                item(session)
            if session.halted:
                return 1
    finally:
        session.close()
    return session.finish()
