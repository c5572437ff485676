"""`tpuforge sandbox up|down|status|env|logs|preempt`."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from tpuforge.api.constants import GKE_SPOT, GKE_TPU_ACCELERATOR, TPU_RESOURCE
from tpuforge_sandbox import curves
from tpuforge_sandbox.config import DEFAULT_NODES, Ports, default_dir
from tpuforge_sandbox.kubeapi import Kube
from tpuforge_sandbox.nodes import node_ready
from tpuforge_sandbox.podlogs import containers_with_logs, follow, pod_finished, tail
from tpuforge_sandbox.sandbox import Sandbox, SandboxError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuforge sandbox",
        description=(
            "A local Kubernetes control plane with JobSet and Kueue, fake GCS and emulated GKE TPU nodes on loopback."
        ),
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dir",
        type=Path,
        default=argparse.SUPPRESS,
        help=f"state directory (env TPUFORGE_SANDBOX_DIR; default {default_dir()})",
    )
    p.add_argument("--dir", type=Path, default=None, help=argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", parents=[common], help="start the sandbox (does nothing when it is already up)")
    for name, default in Ports().__dict__.items():
        flag = name.replace("_", "-")
        up.add_argument(
            f"--{flag}-port",
            type=int,
            dest=f"{name}_port",
            help=f"(env TPUFORGE_SANDBOX_{name.upper()}_PORT; default {default})",
        )
    up.add_argument("--nodes", help=f"node pools, e.g. {DEFAULT_NODES!r} (env TPUFORGE_SANDBOX_NODES)")
    up.add_argument("--bucket", help="the default GCS bucket to create (default tpuforge)")
    up.add_argument("--crds", type=Path, help="directory of CRD YAML files to install (default: the repo's crds/)")
    up.add_argument("--timeout", type=float, default=120.0)

    down = sub.add_parser("down", parents=[common], help="stop every process the sandbox started")
    down.add_argument("--purge", action="store_true", help="also delete the state directory")

    sub.add_parser("status", parents=[common], help="show each component and node")
    sub.add_parser("env", parents=[common], help="print `export` lines for KUBECONFIG and the GCS emulator; eval them")

    logs = sub.add_parser("logs", parents=[common], help="print a sandbox pod's container log")
    logs.add_argument("pod")
    logs.add_argument("-n", "--namespace", default="default")
    logs.add_argument("-c", "--container")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the pod ends")
    logs.add_argument("--tail", type=int, default=-1, help="only the last N lines")

    pre = sub.add_parser("preempt", parents=[common], help="simulate a GKE Spot preemption of a node")
    pre.add_argument("node")
    pre.add_argument("--grace", type=int, help="seconds between SIGTERM and SIGKILL (default: min(pod's, 15))")
    pre.add_argument("--no-wait", action="store_true", help="return once the preemption is requested")

    tb = sub.add_parser(
        "tensorboard",
        parents=[common],
        help="a FineTuneJob's curves: copy its event files from the sandbox's GCS and serve them with TensorBoard",
    )
    tb.add_argument("job", help="the FineTuneJob's name")
    tb.add_argument("-n", "--namespace", default="default")
    tb.add_argument("--port", type=int, default=curves.DEFAULT_PORT, help="TensorBoard's port on 127.0.0.1")
    tb.add_argument("--every", type=float, default=curves.PULL_EVERY, help="seconds between copies of new files")
    tb.add_argument("--no-serve", action="store_true", help="only copy the files; print the command that serves them")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(_run(args))
    except (SandboxError, FileNotFoundError, ValueError, TimeoutError) as e:
        print(f"tpuforge sandbox {args.command}: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "up":
        overrides = {k: getattr(args, f"{k}_port") for k in Ports().__dict__}
        explicit = any(v is not None for v in overrides.values())
        nodes = args.nodes or os.environ.get("TPUFORGE_SANDBOX_NODES")
        sb = Sandbox(
            args.dir,
            ports=Ports.from_env(**overrides) if explicit else None,
            nodes=nodes,
            bucket=args.bucket,
            crds_dir=args.crds,
            log=print,
        )
        sb.up(timeout=args.timeout)
        print(f"\nkubeconfig: {sb.kubeconfig}\nGCS: {sb.gcs_url} (bucket gs://{sb.bucket})")
        print('use it from a shell with:  eval "$(tpuforge sandbox env)"')
        return 0
    sb = Sandbox(args.dir)
    if args.command in ("env", "logs", "preempt", "tensorboard") and not (sb.dir / "sandbox.json").exists():
        raise SandboxError(f"no sandbox in {sb.dir}: start one with `tpuforge sandbox up` (or pass --dir)")
    if args.command == "down":
        stopped = sb.down(purge=args.purge)
        print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
        if args.purge:
            print(f"removed {sb.dir}")
        return 0
    if args.command == "status":
        return _status(sb)
    if args.command == "env":
        for k, v in sb.env().items():
            if k == "PATH":  # the sandbox's kubectl first, the shell's own PATH after it
                print(f'export PATH={shlex.quote(str(sb.bin_dir))}:"$PATH"')
            else:
                print(f"export {k}={shlex.quote(v)}")
        return 0
    if args.command == "logs":
        return _logs(sb, args)
    if args.command == "preempt":
        sb.preempt(args.node, grace=args.grace, wait=not args.no_wait)
        print(f"preempted {args.node}" if not args.no_wait else f"preemption of {args.node} requested")
        return 0
    if args.command == "tensorboard":
        return curves.show(sb, args.job, args.namespace, args.port, serve=not args.no_serve, every=args.every)
    raise AssertionError(args.command)


def _status(sb: Sandbox) -> int:
    rows = sb.status()
    print(f"sandbox in {sb.dir}")
    for r in rows:
        pid = f"pid {r.pid}" if r.pid else ""
        print(f"  {r.name:<24} {r.state:<9} {pid:<10} {r.detail}")
    up = all(r.state != "stopped" for r in rows)
    if up:
        try:
            with sb.api_client() as api:
                for n in Kube(api).list_nodes(""):
                    labels = n["metadata"].get("labels") or {}
                    tpu = (n["status"].get("allocatable") or {}).get(TPU_RESOURCE, "0")
                    acc = labels.get(GKE_TPU_ACCELERATOR, "cpu")
                    spot = " spot" if labels.get(GKE_SPOT) == "true" else ""
                    state = "Ready" if node_ready(n) else "NotReady"
                    print(f"  node {n['metadata']['name']:<19} {state:<9} {acc}{spot}, {TPU_RESOURCE}: {tpu}")
        except (ApiException, OSError) as e:
            print(f"  (apiserver not answering: {e})")
    return 0 if up else 1


def _logs(sb: Sandbox, args: argparse.Namespace) -> int:
    pods_dir = sb.config.pods_dir
    containers = containers_with_logs(pods_dir, args.namespace, args.pod)
    if not containers:
        raise SandboxError(f"no logs for pod {args.namespace}/{args.pod} in {pods_dir} (has it started?)")
    container = args.container
    if container is None:
        if len(containers) > 1:
            raise SandboxError(f"pod {args.pod} has containers {', '.join(containers)}: choose one with -c")
        container = containers[0]
    if container not in containers:
        raise SandboxError(f"pod {args.pod} has no logs for container {container!r}; it has {', '.join(containers)}")
    path = sb.pod_log(args.namespace, args.pod, container)
    out = sys.stdout.buffer
    data, size = tail(path, args.tail)
    out.write(data)
    out.flush()
    if args.follow:

        def write(data: bytes) -> None:
            out.write(data)
            out.flush()

        with contextlib.suppress(KeyboardInterrupt):
            follow(path, size, write, lambda: pod_finished(pods_dir, args.namespace, args.pod))
    return 0
