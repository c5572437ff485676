"""What every step of a demo works with (`DemoBase`): the sandbox, the console, the options, the job and the pods
to point at in the end, and the helpers the steps share: printing, the sandbox's environment, `kubectl get`
tables and an API client; and how to type one of this environment's commands (`tool_path`). The steps are
mixins of DemoBase (`demo_setup`, `demo_follow`); `demo.Demo` puts them together."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from tpuforge_sandbox.config import repo_root
from tpuforge_sandbox.demo_job import DemoJob
from tpuforge_sandbox.demo_view import duration
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


class DemoBase:
    """A demo's state and the helpers its steps share."""

    sections: int  # how many numbered sections the demo's headings count; each demo sets its own

    def __init__(self, sb: Sandbox, console: Console, preempt: bool, serve: bool | None, hosts: int = 1):
        self.sb = sb
        self.console = console
        self.preempt = preempt
        self.hosts = hosts
        self.serve = serve
        self.root = repo_root()
        self.started = time.monotonic()
        self.operator_port = 0
        self.kubectl = shutil.which("kubectl", path=self.env()["PATH"])
        self.tpuforge = tool_path("tpuforge")
        self.job: DemoJob | None = None
        self.pods: dict[str, str] = {}  # what to point at in the end: "train-0", "merge", "serve" -> pod name
        self.serving_name = "demo"  # examples/serving-demo.yaml's
        # What the demo set out to show and did not (a failed evaluation it meant to pass, serving that never
        # became Ready, a preemption that was not resumed): the demo goes on to the end, then fails with these.
        self.problems: list[str] = []

    def finish(self) -> int:
        """The last lines: the time taken, or what did not happen and exit status 1."""
        if self.problems:
            self.say("\ndemo failed: " + "; ".join(self.problems), style="bold red")
            return 1
        self.say(f"\ndemo finished in {duration(time.monotonic() - self.started)}", style="bold green")
        return 0

    # -- helpers ---------------------------------------------------------------------------------------------
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

    def api(self) -> Any:
        return self.sb.api_client()
