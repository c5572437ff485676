"""The operator at scale, on a sandbox of its own (real kube-apiserver, kube-controller-manager): a burst of
FineTuneJobs (the default, phases below) or of ServingDeployments (--kind servingdeployment: the burst only,
see benchmarks/scale/serving.py).

Phases, all in one run against the same apiserver:
  baseline  for N FineTuneJobs created beforehand (untimed, no operator), one client makes exactly the writes
            the operator makes for each, computed by the operator's own decision code: the ServiceAccount,
            Role, RoleBinding, ConfigMap and Job, the status, the Event; with as many threads as the
            operator makes API calls at once
  burst     the operator runs; one client creates N FineTuneJobs as fast as it can; the time until every one
            has its training Job, over the baseline's time (target <= 1.5). The burst also holds the N
            creates themselves, which the baseline does not. The baseline runs before the burst and again
            after it (other load on the machine drifts): the ratio is over their mean
  live      the operator's CPU seconds for the burst; its peak RSS (target <= 250 MB) with the N jobs live,
            once the cluster has settled (pods created, then reported unschedulable: the sandbox has no nodes)
  steady    R FineTuneJobs per second for D seconds, with the N jobs live; create -> training Job latency
            p50/p99 (target p99 <= 1 s)
  check     every FineTuneJob has exactly one of each child (duplicates must be 0)

The sandbox has no nodes, so no pod runs: the numbers are the control plane's and the operator's alone.
Each phase also reports the CPU seconds of each process and the watches the apiserver closed because they
fell behind (apiserver_forced_watch_closes): on a saturated machine these are what move the ratio.

    python benchmarks/operator_scale.py                    # 1000 jobs, 10/s for 60 s
    python benchmarks/operator_scale.py --jobs 200 --duration 20 --json out.json
    python benchmarks/operator_scale.py --jobs 500 --burst-only --profile burst.prof   # where the CPU goes
    python benchmarks/operator_scale.py --load 2           # the same with two busy processes beside it
    python benchmarks/operator_scale.py --kind servingdeployment   # 1000 ServingDeployments in a burst

--load K starts K processes that spin on the CPU (at the same priority) before the first baseline and stops
them at the end: a loaded machine that every run can reproduce, where other work's load is whatever it was.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The repository's root (which holds benchmarks/) as the other benchmarks put it: run as a script, only this
# file's own folder is on the path.
sys.path[:0] = [p for p in (str(REPO), str(REPO / "operator")) if p not in sys.path]

# The parts (benchmarks/scale/): workload.py, processes.py, observe.py, phases.py; serving.py for --kind.
from benchmarks.scale import serving  # noqa: E402
from benchmarks.scale.phases import measure  # noqa: E402
from benchmarks.scale.processes import CpuLoad  # noqa: E402

from tpuforge import crds  # noqa: E402
from tpuforge.kube import client as kube_client  # noqa: E402
from tpuforge_sandbox import Ports, Sandbox  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--kind",
        choices=("finetunejob", "servingdeployment"),
        default="finetunejob",
        help="what the burst creates (default finetunejob)",
    )
    p.add_argument("--jobs", type=int, default=1000, help="objects in the burst (default 1000)")
    p.add_argument("--rate", type=float, default=10.0, help="steady creations per second (default 10)")
    p.add_argument("--duration", type=float, default=60.0, help="steady phase seconds (default 60)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--operator-log", type=Path, help="keep the operator's log here")
    p.add_argument(
        "--profile",
        type=Path,
        help="profile the operator: py-spy during the burst, its flame graph (.svg) or raw stacks (.txt); or, "
        "for a .prof path, cProfile of its event loop thread for the whole run (with --burst-only: the burst)",
    )
    p.add_argument(
        "--burst-only",
        action="store_true",
        help="stop after the burst (no settling, second baseline or steady phase): for profiling",
    )
    p.add_argument("--load", type=int, default=0, help="CPU-spinning processes to run beside it (default 0)")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="tpuforge-bench-") as tmp_s:
        tmp = Path(tmp_s)
        crd_dir = tmp / "crds"
        crd_dir.mkdir()
        for kind in crds.KINDS:
            (crd_dir / crds.filename(kind)).write_text(crds.render(kind))
        sandbox = Sandbox(tmp / "sandbox", ports=Ports.free(), nodes="", crds_dir=crd_dir, attach=True, log=print)
        sandbox.up(timeout=180)
        load = CpuLoad(args.load)
        try:
            kube_client.configure(sandbox.kubeconfig)
            api = kube_client.api_client()
            run = serving.measure if args.kind == "servingdeployment" else measure
            results = {"load_processes": args.load, **run(api, sandbox, tmp, args)}
        finally:
            load.stop()
            sandbox.down()
            if args.operator_log and (tmp / "operator.log").exists():
                shutil.copyfile(tmp / "operator.log", args.operator_log)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if results["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
