"""`tpuforge images` (`make images`): build every image in images/ under the names the operator gives its
defaults (tpuforge.api.images), and push them when asked.

Each images/<name>.Dockerfile becomes `<registry>/<name>:<tag>` (`tpuforge/<name>:<tag>` with no registry),
built for linux/amd64 (GKE's TPU and CPU nodes) from the repository root, with the build arguments of
tpuforge.api.images.BUILD_ARGS: the vLLM-TPU base of the evaluator and serving images comes from
tpuforge.api.constants, never from a Dockerfile. When no container engine answers, it prints the commands it
would have run and exits non-zero: nothing was built.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tpuforge.api.constants import PROJECT_VERSION
from tpuforge.api.images import BUILD_ARGS, NAMES, ImageDefaults

IMAGES_DIR = "images"
PLATFORM = "linux/amd64"
ENV_ENGINE = "CONTAINER_ENGINE"
EXIT_NO_ENGINE = 3


@dataclass(frozen=True)
class Build:
    name: str
    dockerfile: str  # relative to the repository root, the build context
    image: str
    build_args: tuple[tuple[str, str], ...]


def dockerfile(name: str) -> str:
    return f"{IMAGES_DIR}/{name}.Dockerfile"


def plan(registry: str = "", tag: str = PROJECT_VERSION, only: Sequence[str] = ()) -> list[Build]:
    """The images to build, in NAMES order (or only those named)."""
    names = ImageDefaults(registry=registry, tag=tag)
    return [
        Build(
            name=n,
            dockerfile=dockerfile(n),
            image=names.built(n),
            build_args=tuple(sorted(BUILD_ARGS.get(n, {}).items())),
        )
        for n in NAMES
        if not only or n in only
    ]


def commands(builds: Sequence[Build], engine: str = "docker", push: bool = False) -> list[list[str]]:
    out: list[list[str]] = []
    for b in builds:
        cmd = [engine, "build", "--platform", PLATFORM, "-f", b.dockerfile, "-t", b.image]
        for key, value in b.build_args:
            cmd += ["--build-arg", f"{key}={value}"]
        out.append([*cmd, "."])
    if push:
        out += [[engine, "push", b.image] for b in builds]
    return out


def engine_answers(engine: str) -> str | None:
    """None when `engine info` works, else why not."""
    if shutil.which(engine) is None:
        return f"{engine} is not installed"
    try:
        proc = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{engine} info` failed: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()
        return f"`{engine} info` failed: {last[-1] if last else f'exit {proc.returncode}'}"
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tpuforge images", description="Build (and push) every image in images/ under one registry and tag."
    )
    p.add_argument(
        "--registry",
        default=os.environ.get("TPUFORGE_IMAGE_REGISTRY", ""),
        help="e.g. europe-docker.pkg.dev/PROJECT/tpuforge; give the operator the same (--image-registry, Helm "
        "value images.registry) (default: $TPUFORGE_IMAGE_REGISTRY, else the public names tpuforge/NAME)",
    )
    p.add_argument("--tag", default=PROJECT_VERSION, help=f"image tag (default {PROJECT_VERSION})")
    p.add_argument("--only", action="append", choices=NAMES, default=[], help="build only this image (repeatable)")
    p.add_argument("--push", action="store_true", help="push each image once all are built")
    p.add_argument(
        "--engine",
        default=os.environ.get(ENV_ENGINE, "docker"),
        help=f"container engine with docker's command line, e.g. podman (default: ${ENV_ENGINE}, else docker)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the repository root (default: here)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    root: Path = args.root
    builds = plan(args.registry.strip().rstrip("/"), args.tag.strip() or PROJECT_VERSION, args.only)
    missing = [b.dockerfile for b in builds if not (root / b.dockerfile).is_file()]
    if missing:
        print(f"tpuforge images: {root} is not the repository root: no {', '.join(missing)}", file=sys.stderr)
        return 2
    cmds = commands(builds, args.engine, args.push)
    why = None if args.dry_run else engine_answers(args.engine)
    if args.dry_run or why:
        if why:
            print(f"tpuforge images: {why}; nothing was built. It would run, from {root}:", file=sys.stderr)
        print("\n".join(shlex.join(c) for c in cmds))
        return EXIT_NO_ENGINE if why else 0
    for cmd in cmds:
        print(f"+ {shlex.join(cmd)}", flush=True)
        rc = subprocess.run(cmd, cwd=root, check=False).returncode
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
