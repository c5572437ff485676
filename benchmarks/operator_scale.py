"""The operator at scale: a burst of FineTuneJobs (the default) or of ServingDeployments (--kind
servingdeployment), on a sandbox of its own (real kube-apiserver, kube-controller-manager, JobSet and Kueue
controllers, and the node agent with no nodes) or, with --sandbox-dir, on one already running.

Phases, all in one run against the same apiserver, each printing its figure as it ends:
  baseline  for N objects created beforehand (untimed, no operator), one client makes exactly the writes the
            operator makes for each, computed by the operator's own decision code (a FineTuneJob: the Role,
            RoleBinding, ConfigMap and training Job, the status, the Event; a ServingDeployment: its Service,
            PodDisruptionBudget and Deployment (claims too where its spec needs them), the status, the Events),
            with as many threads as the operator makes API calls at once. Then, untimed, until the controllers'
            pods for what it wrote are each placed or reported unschedulable, so that the next phase does not
            carry this one's aftermath (the burst makes its own pods while it runs, as the baseline did)
  burst     the operator runs; one client creates N objects as fast as it can; the time until every one is
            handled (a FineTuneJob has its training Job; a ServingDeployment its status with an endpoint), over
            the baseline's time (target <= 1.5). The burst also holds the N creates themselves, which the
            baseline does not. With --restart-midway the operator is stopped (SIGTERM) once half are handled
            and another started in its place: the burst's time includes the restart
  settle    the controllers' pods for every object (the Job controller's; the Deployment's ReplicaSet's), each
            placed or reported unschedulable by the node agent, then the operator handling that until it has
            not reconciled for --quiet seconds; at most --settle-timeout seconds (what did not happen is
            printed and kept in the results). Then the operator's peak RSS with the N live (target <= 250 MB)
  baseline  again, after the burst (other load on the machine drifts): the ratio is over the mean of both;
            its pods are waited for as the first's were, before the steady phase
  steady    R objects per second for D seconds, with the N live; create -> handled latency p50/p99 (target
            p99 <= 1 s), the operator's share of a core, its mean reconcile time and the apiserver's own mean
            time per write. FineTuneJobs: the operator reports each burst job's pod unschedulable 300 s after the
            node agent did (no TPU nodes here), a wave of status writes and Events; when the phase would
            overlap it, it first waits for the wave to pass and the operator to be quiet
  check     every object has exactly the children the operator makes for one (duplicates must be 0, across
            the restart too)

With no nodes no pod runs: the numbers are the control plane's and the operator's alone. On a sandbox with
nodes (--sandbox-dir), the benchmark's namespaces are marked so that the node agent starts no container in
them. Each phase also reports the CPU seconds of each process and the watches the apiserver closed because
they fell behind (apiserver_forced_watch_closes): on a saturated machine these are what move the ratio.

    python benchmarks/operator_scale.py                    # 1000 FineTuneJobs, 10/s for 60 s
    python benchmarks/operator_scale.py --jobs 1000 --restart-midway --json ftj.json
    python benchmarks/operator_scale.py --kind servingdeployment --restart-midway   # 1000 ServingDeployments
    python benchmarks/operator_scale.py --jobs 500 --burst-only --profile burst.prof   # where the CPU goes
    python benchmarks/operator_scale.py --load 2           # the same with two busy processes beside it
    python benchmarks/operator_scale.py --sandbox-dir ~/.tpuforge/sandbox --jobs 20 --duration 2   # a quick run

--load K starts K processes that spin on the CPU (at the same priority) before the first baseline and stops
them at the end: a loaded machine that every run can reproduce, where other work's load is whatever it was.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The repository's root (which holds benchmarks/) as the other benchmarks put it: run as a script, only this
# file's own folder is on the path.
sys.path[:0] = [p for p in (str(REPO), str(REPO / "operator")) if p not in sys.path]

# The parts (benchmarks/scale/): workload.py (and serving.py for --kind), processes.py, observe.py, phases.py.
from benchmarks.scale.phases import measure  # noqa: E402
from benchmarks.scale.processes import CpuLoad  # noqa: E402
from kubernetes import client  # noqa: E402

from tpuforge import crds  # noqa: E402
from tpuforge.kube import client as kube_client  # noqa: E402
from tpuforge.kube import objects as kube_objects  # noqa: E402
from tpuforge_sandbox import Ports, Sandbox  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    p.add_argument(
        "--restart-midway",
        action="store_true",
        help="stop the operator once half the burst is handled and start another (the burst's time includes it)",
    )
    p.add_argument("--settle-timeout", type=float, default=600.0, help="the most seconds settling waits (default 600)")
    p.add_argument(
        "--quiet", type=float, default=5.0, help="settled: this many seconds without a reconcile (default 5)"
    )
    p.add_argument(
        "--sandbox-dir",
        type=Path,
        help="use the sandbox running in this directory (its namespaces are the benchmark's own, deleted at the "
        "end) instead of starting one",
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument(
        "--operator-log",
        type=Path,
        help="keep the operator's log here (after a restart, the new one's beside it: NAME.1.log)",
    )
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
    args = p.parse_args(argv)
    if args.jobs < 2:
        p.error("--jobs: at least 2 (the restart and the percentiles need two)")
    if args.profile and args.restart_midway:
        p.error("--profile follows one operator process: leave out --restart-midway")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tpuforge-bench-") as tmp_s:
        tmp = Path(tmp_s)
        if args.sandbox_dir is not None:
            sandbox = Sandbox(args.sandbox_dir)
            if not sandbox.is_up():
                print(f"no sandbox is running in {args.sandbox_dir}", file=sys.stderr)
                return 2
            prefix = f"bench-{uuid.uuid4().hex[:6]}"
        else:
            crd_dir = tmp / "crds"
            crd_dir.mkdir()
            for kind in crds.KINDS:
                (crd_dir / crds.filename(kind)).write_text(crds.render(kind))
            sandbox = Sandbox(tmp / "sandbox", ports=Ports.free(), nodes="", crds_dir=crd_dir, attach=True, log=print)
            sandbox.up(timeout=180)
            prefix = "bench"
        namespaces: list[str] = []

        def ns_name(phase: str) -> str:
            namespaces.append(f"{prefix}-{phase}")
            return namespaces[-1]

        kube_client.configure(sandbox.kubeconfig)
        api = kube_client.api_client()
        load = CpuLoad(args.load)
        try:
            results = {"load_processes": args.load, **measure(api, sandbox, tmp, args, ns_name)}
        finally:
            load.stop()
            if args.sandbox_dir is None:
                sandbox.down()
            else:  # someone else's sandbox: leave it as it was, no pod of ours holding a node's TPU chips
                for ns in namespaces:
                    client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)
                    kube_objects.delete(api, "v1", "Namespace", None, ns)
            if args.operator_log:  # the first process's log, and those after a restart (operator.1.log)
                for log in sorted(tmp.glob("operator*.log")):
                    shutil.copyfile(log, args.operator_log.with_name(args.operator_log.stem + log.name[8:]))
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if results["duplicates"] else 0


if __name__ == "__main__":
    sys.exit(main())
