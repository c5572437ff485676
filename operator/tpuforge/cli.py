"""The `tpuforge` command: operator, crds, sandbox, demo, preflight, images.

Each subcommand's own options live with the code it runs; this module only dispatches, importing lazily so
that `tpuforge crds` never pays for kopf and `tpuforge operator` never imports the sandbox. `sandbox` and `demo`
belong to the package `tpuforge_sandbox` (sandbox/ in the repository, its own distribution `tpuforge-sandbox`):
the operator's image does not carry it, so when it is not installed these two say how to get it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence

# command -> module whose main(argv) runs it
COMMANDS = {
    "operator": "tpuforge.controllers.main",
    "crds": "tpuforge.crds",
    "sandbox": "tpuforge_sandbox.cli",
    "demo": "tpuforge_sandbox.demo.cli",
    "preflight": "tpuforge.preflight",
    "images": "tpuforge.build_images",
}

SANDBOX_PACKAGE = "tpuforge_sandbox"
SANDBOX_MISSING = (
    "tpuforge {cmd}: the sandbox is a package of its own (tpuforge-sandbox, in sandbox/ of the tpuforge "
    "repository) and it is not installed here: from a checkout, `make setup` installs it, or "
    "`pip install -e ./sandbox` into this environment"
)

USAGE = """usage: tpuforge COMMAND [ARGS]

commands:
  operator   run the operator (kopf) against the current kubeconfig
  crds       write the CustomResourceDefinitions generated from tpuforge.api
  sandbox    the local control plane, GCS and emulated TPU nodes: up|down|status|env|logs|preempt|tensorboard
  demo       the whole pipeline on the sandbox: fine-tune, merge, verify, (serve)
  preflight  compile a FineTuneJob's train step for its TPU slice here: HBM per chip, speed, cost
  images     build (and push) every image in images/ under one registry and tag

`tpuforge COMMAND --help` shows each command's options.
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = args[0], args[1:]
    if cmd not in COMMANDS:
        print(f"tpuforge: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    if COMMANDS[cmd].startswith(SANDBOX_PACKAGE + ".") and importlib.util.find_spec(SANDBOX_PACKAGE) is None:
        print(SANDBOX_MISSING.format(cmd=cmd), file=sys.stderr)
        return 2
    run: Callable[[list[str]], int | None] = importlib.import_module(COMMANDS[cmd]).main
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
