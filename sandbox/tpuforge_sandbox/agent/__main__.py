"""`python -m tpuforge_sandbox.agent --dir STATE`: the node agent process `tpuforge sandbox up` starts."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from tpuforge_sandbox.agent.agent import NodeAgent
from tpuforge_sandbox.config import SandboxConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpuforge_sandbox.agent")
    parser.add_argument("--dir", required=True, type=Path, help="the sandbox state directory")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(threadName)s: %(message)s",
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    agent = NodeAgent(SandboxConfig.load(args.dir))
    # SIGTERM (sandbox down, or the test session ending) is a graceful node shutdown.
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    signal.signal(signal.SIGINT, lambda *_: agent.stop())
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
