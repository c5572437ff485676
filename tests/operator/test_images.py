"""Images: one registry and tag name every default image the operator runs, each stays overridable per object,
every pod gets the operator's and the object's pull Secrets, every image the operator or the chart can name is
built from a Dockerfile in images/ (and every Dockerfile is such an image), and the vLLM-TPU release the
evaluator is built on is serving's default, named in one place."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.helm import find, operator_container, render
from tpuforge import build_images
from tpuforge.api import FineTuneJobSpec, ServingDeploymentSpec, images, parse
from tpuforge.api import constants as c
from tpuforge.api.catalog import model_shape, tpu_slice
from tpuforge.api.serving import ServingImagesSpec
from tpuforge.controllers.main import image_defaults, parser
from tpuforge.controllers.runtime import defaults
from tpuforge.manifests import serving, serving_inputs
from tpuforge.manifests.finetune_common import owner
from tpuforge.manifests.finetune_evaluation import eval_objects
from tpuforge.manifests.finetune_merge import merge_objects
from tpuforge.manifests.finetune_training import attempt_objects
from tpuforge.manifests.preflight import preflight_objects

ROOT = Path(__file__).resolve().parents[2]
IMAGES_DIR = ROOT / "images"
REGISTRY = "europe-docker.pkg.dev/ml-proj/tpuforge"
TAG = "1.4.2"
PRIVATE = images.ImageDefaults(registry=REGISTRY, tag=TAG, pull_secrets=("ar-reader",))
UID = "00000000-0000-0000-0000-000000000000"


def dockerfiles() -> dict[str, str]:
    return {p.name.removesuffix(".Dockerfile"): p.read_text() for p in sorted(IMAGES_DIR.glob("*.Dockerfile"))}


def example(name: str, model: type[Any]) -> tuple[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / name).read_text())
    return doc["metadata"]["name"], parse(model, doc["spec"], root="spec")


def finetune_objects(d: defaults.OperatorDefaults, edit: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Everything a FineTuneJob runs, as the operator builds it (its defaults applied first): the preflight,
    single-host and multi-host training, the merge, and an evaluation with pass@k's checker."""
    out: list[dict[str, Any]] = []
    for file in ("finetune-verilog-passk.yaml", "finetune-adapter.yaml"):
        name, raw = example(file, FineTuneJobSpec)
        for slice_id in ("v5p-8", "v5p-16"):
            spec = raw.model_copy(update={"tpu": raw.tpu.model_copy(update={"slice": slice_id})})
            if edit:
                spec = spec.model_copy(update={"images": spec.images.model_copy(update=edit)})
            spec = d.apply(spec)
            o = owner("ml-team", name, UID)
            out += [*preflight_objects(o, spec), *attempt_objects(o, spec, 0), *merge_objects(o, spec)]
            out += eval_objects(o, spec)
    return out


def serving_objects(d: defaults.OperatorDefaults, **edit: Any) -> list[dict[str, Any]]:
    """The serving Deployment of a ServingDeployment with LoRA adapters (so with the adapters sidecar)."""
    name, raw = example("serving-adapters.yaml", ServingDeploymentSpec)
    spec = raw.model_copy(update=edit) if edit else raw
    spec = d.apply(spec)
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner("ml-team", name, UID),
        spec=spec,
        model_uri="gs://bucket/base",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice(spec.tpu.slice),
    )
    return [serving.deployment(inp)]


def pod_specs(obj: Any) -> Iterator[dict[str, Any]]:
    """Every pod spec inside an object (Job, JobSet, Deployment)."""
    if isinstance(obj, dict):
        if "containers" in obj:
            yield obj
        else:
            for v in obj.values():
                yield from pod_specs(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from pod_specs(v)


def container_images(objs: list[dict[str, Any]]) -> set[str]:
    return {
        ct["image"]
        for obj in objs
        for pod in pod_specs(obj)
        for ct in [*pod.get("initContainers", []), *pod["containers"]]
    }


def image_name(image: str, registry: str) -> str:
    """`<registry>/<name>:<tag>` -> name."""
    assert image.startswith(registry + "/"), image
    return image.removeprefix(registry + "/").split("@")[0].rsplit(":", 1)[0]


# --- Names ------------------------------------------------------------------------------------------------


def test_with_no_registry_the_defaults_are_the_public_names() -> None:
    d = images.PUBLIC_IMAGES
    assert (d.trainer, d.merger, d.evaluator, d.operator) == (
        c.DEFAULT_TRAINER_IMAGE,
        c.DEFAULT_MERGER_IMAGE,
        c.DEFAULT_EVALUATOR_IMAGE,
        c.DEFAULT_OPERATOR_IMAGE,
    )
    assert d.serving == c.DEFAULT_VLLM_IMAGE == f"{c.VLLM_TPU_REPOSITORY}:{c.VLLM_TPU_TAG}"
    assert d.model_fetch == d.adapters == c.DEFAULT_MERGER_IMAGE
    # What `make images` builds for serving with no registry is tpuforge's name, never vLLM's.
    assert d.built(images.SERVING) == f"tpuforge/serving:{c.PROJECT_VERSION}"


def test_one_registry_and_tag_name_every_default_image() -> None:
    for image in (PRIVATE.trainer, PRIVATE.merger, PRIVATE.evaluator, PRIVATE.serving, PRIVATE.operator):
        assert re.fullmatch(rf"{re.escape(REGISTRY)}/[a-z-]+:{re.escape(TAG)}", image), image
    assert PRIVATE.serving == f"{REGISTRY}/serving:{TAG}"
    assert PRIVATE.model_fetch == PRIVATE.adapters == PRIVATE.merger
    assert images.ImageDefaults(registry=REGISTRY + "/", tag=TAG).trainer == PRIVATE.trainer


# --- Defaults applied to specs, overrides kept ------------------------------------------------------------


def test_the_operator_fills_unset_images_and_keeps_the_ones_a_finetunejob_names() -> None:
    d = defaults.OperatorDefaults(images=PRIVATE)
    _, raw = example("finetune.yaml", FineTuneJobSpec)
    filled = d.apply(raw).images
    assert (filled.trainer, filled.merger, filled.evaluator) == (PRIVATE.trainer, PRIVATE.merger, PRIVATE.evaluator)
    assert filled.pull_secrets == ["ar-reader"]
    own = raw.model_copy(
        update={"images": raw.images.model_copy(update={"trainer": "me/t:1", "pull_secrets": ["x", "ar-reader"]})}
    )
    kept = d.apply(own).images
    assert (kept.trainer, kept.merger) == ("me/t:1", PRIVATE.merger)
    assert kept.pull_secrets == ["ar-reader", "x"]  # the operator's first, no repeats
    assert d.apply(d.apply(own)) == d.apply(own)


def test_the_operator_fills_unset_images_and_keeps_the_ones_a_servingdeployment_names() -> None:
    d = defaults.OperatorDefaults(images=PRIVATE)
    _, raw = example("serving-adapters.yaml", ServingDeploymentSpec)
    filled = d.apply(raw)
    assert filled.vllm.image == PRIVATE.serving
    assert (filled.images.model_fetch, filled.images.adapters) == (PRIVATE.merger, PRIVATE.merger)
    own = ServingDeploymentSpec.model_validate(
        {
            **raw.to_wire(),
            "vllm": {**raw.vllm.to_wire(), "image": "me/vllm:2"},
            "images": {"modelFetch": "me/fetch:3", "adapters": "me/adapters:4", "pullSecrets": ["team"]},
        }
    )
    kept = d.apply(own)
    assert (kept.vllm.image, kept.images.model_fetch, kept.images.adapters) == (
        "me/vllm:2",
        "me/fetch:3",
        "me/adapters:4",
    )
    assert kept.images.pull_secrets == ["ar-reader", "team"]


def test_a_spec_the_operator_has_not_filled_renders_the_public_images() -> None:
    """Builders are pure functions of the spec: a spec nobody filled in still gets runnable images."""
    found = container_images(finetune_objects(defaults.OperatorDefaults(), None))
    assert {c.DEFAULT_TRAINER_IMAGE, c.DEFAULT_MERGER_IMAGE, c.DEFAULT_EVALUATOR_IMAGE} <= found
    name, raw = example("serving-adapters.yaml", ServingDeploymentSpec)
    inp = serving_inputs.ServingInputs(
        owner=serving_inputs.owner("ml-team", name, UID),
        spec=raw,
        model_uri="gs://bucket/base",
        model=model_shape("gemma4-31b"),
        slice=tpu_slice(raw.tpu.slice),
    )
    assert container_images([serving.deployment(inp)]) == {c.DEFAULT_VLLM_IMAGE, c.DEFAULT_MERGER_IMAGE}


# --- Rendered objects -------------------------------------------------------------------------------------


def test_every_pod_the_operator_creates_pulls_from_the_registry_with_its_pull_secrets() -> None:
    d = defaults.OperatorDefaults(images=PRIVATE)
    objs = finetune_objects(d, {"pull_secrets": ["team-a"]})
    pods = [p for o in objs for p in pod_specs(o)]
    # preflight, one-host Job, JobSet, merge, evaluation for each of the two jobs
    assert len(pods) == 2 * 2 * 4
    for pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "ar-reader"}, {"name": "team-a"}]
    sdep = serving_objects(d, images=ServingImagesSpec(pull_secrets=["team-a"]))
    (pod,) = list(pod_specs(sdep))
    assert pod["imagePullSecrets"] == [{"name": "ar-reader"}, {"name": "team-a"}]
    own = {i for i in container_images(objs + sdep) if i.startswith(REGISTRY + "/")}
    assert {image_name(i, REGISTRY) for i in own} == {"trainer", "merger", "evaluator", "serving"}
    # The one image not the operator's: the checker the example names itself.
    assert container_images(objs + sdep) - own == {"tpuforge/checker-verilog:0.1.0"}


def test_without_pull_secrets_no_pod_names_any() -> None:
    objs = finetune_objects(defaults.OperatorDefaults()) + serving_objects(defaults.OperatorDefaults())
    assert all("imagePullSecrets" not in p for o in objs for p in pod_specs(o))


def test_the_serving_init_container_and_adapters_sidecar_take_their_own_images() -> None:
    d = defaults.OperatorDefaults(images=PRIVATE)
    (dep,) = serving_objects(d)
    pod = dep["spec"]["template"]["spec"]
    by_name = {ct["name"]: ct["image"] for ct in [*pod["initContainers"], *pod["containers"]]}
    assert by_name == {"fetch-model": PRIVATE.merger, "vllm": PRIVATE.serving, "adapters": PRIVATE.merger}
    _, raw = example("serving-adapters.yaml", ServingDeploymentSpec)
    own = raw.images.model_copy(update={"model_fetch": "me/fetch:1", "adapters": "me/adapters:1"})
    (dep,) = serving_objects(d, images=own)
    pod = dep["spec"]["template"]["spec"]
    by_name = {ct["name"]: ct["image"] for ct in [*pod["initContainers"], *pod["containers"]]}
    assert by_name == {"fetch-model": "me/fetch:1", "vllm": PRIVATE.serving, "adapters": "me/adapters:1"}


# --- Images <-> Dockerfiles -------------------------------------------------------------------------------


def test_every_image_the_operator_or_chart_names_has_a_dockerfile_and_every_dockerfile_is_one() -> None:
    d = defaults.OperatorDefaults(images=PRIVATE)
    rendered = container_images(finetune_objects(d) + serving_objects(d))
    names = {image_name(i, REGISTRY) for i in rendered if i.startswith(REGISTRY + "/")}
    chart = render("private-registry")
    names.add(image_name(operator_container(chart)["image"], REGISTRY))
    # The checker image has no default: the examples name it, under its public name.
    checkers = {i for i in rendered if not i.startswith(REGISTRY + "/")}
    names |= {image_name(i, images.PUBLIC_PREFIX) for i in checkers}
    assert names == set(dockerfiles()) == set(images.NAMES)


def test_the_chart_gives_the_operator_the_registry_tag_and_pull_secrets() -> None:
    objs = render("private-registry")
    ct = operator_container(objs)
    assert ct["image"] == PRIVATE.operator
    assert image_defaults(parser().parse_args(ct["args"])) == images.ImageDefaults(
        registry=REGISTRY, tag=TAG, pull_secrets=("ar-reader", "team-robot")
    )
    pod = find(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "ar-reader"}, {"name": "team-robot"}]
    test_pod = find(objs, "Pod")["spec"]
    assert test_pod["imagePullSecrets"] == pod["imagePullSecrets"]
    assert test_pod["containers"][0]["image"] == PRIVATE.operator
    default = operator_container(render("default"))
    assert image_defaults(parser().parse_args(default["args"])) == images.PUBLIC_IMAGES
    assert "imagePullSecrets" not in find(render("default"), "Deployment")["spec"]["template"]["spec"]


def test_operator_flags_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUFORGE_IMAGE_REGISTRY", REGISTRY)
    monkeypatch.setenv("TPUFORGE_IMAGE_TAG", TAG)
    monkeypatch.setenv("TPUFORGE_IMAGE_PULL_SECRETS", "ar-reader, other")
    got = image_defaults(parser().parse_args(["--image-pull-secret", "ar-reader"]))
    assert got == images.ImageDefaults(registry=REGISTRY, tag=TAG, pull_secrets=("ar-reader", "other"))


FROM = re.compile(r"^FROM\s+(\S+)", re.MULTILINE)
ARG = re.compile(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)(=\S*)?\s*$", re.MULTILINE)


def test_the_evaluator_and_serving_images_are_built_on_the_one_vllm_tpu_release() -> None:
    """The evaluator must run the vLLM serving runs (runtime LoRA loading on TPU came in tpu-inference
    v0.25.0): both take their base from the build argument `make images` fills from api.constants."""
    files = dockerfiles()
    on_vllm = {name for name, text in files.items() if "vllm" in " ".join(FROM.findall(text)).lower()}
    assert on_vllm == {images.EVALUATOR, images.SERVING} == set(images.BUILD_ARGS)
    for name in on_vllm:
        text = files[name]
        assert FROM.findall(text) == [f"${{{images.VLLM_BASE_ARG}}}"], name
        # Declared without a default, so the base can only come from the constant.
        assert (images.VLLM_BASE_ARG, "") in ARG.findall(text), name
        assert images.BUILD_ARGS[name] == {images.VLLM_BASE_ARG: c.DEFAULT_VLLM_IMAGE}
    for name, text in files.items():
        assert c.VLLM_TPU_REPOSITORY not in text, f"{name}.Dockerfile names a vLLM-TPU release of its own"


def test_every_build_argument_a_dockerfile_declares_is_passed_and_no_other() -> None:
    for name, text in dockerfiles().items():
        declared = {arg for arg, _default in ARG.findall(text)}
        assert declared == set(images.BUILD_ARGS.get(name, {})), name


# --- make images ------------------------------------------------------------------------------------------


def test_make_images_builds_each_dockerfile_under_the_registry_and_tag() -> None:
    builds = build_images.plan(REGISTRY, TAG)
    assert [b.name for b in builds] == list(images.NAMES)
    cmds = build_images.commands(builds, push=True)
    built = [cmd for cmd in cmds if cmd[1] == "build"]
    assert len(built) == len(dockerfiles())
    for b, cmd in zip(builds, built, strict=True):
        assert cmd[-1] == "."  # the repository root is the context: the Dockerfiles copy operator/, workloads/
        assert cmd[cmd.index("-f") + 1] == f"images/{b.name}.Dockerfile"
        assert cmd[cmd.index("-t") + 1] == PRIVATE.built(b.name)
        args = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--build-arg"]
        assert args == [f"{k}={v}" for k, v in sorted(images.BUILD_ARGS.get(b.name, {}).items())]
    assert [cmd for cmd in cmds if cmd[1] == "push"] == [["docker", "push", PRIVATE.built(n)] for n in images.NAMES]
    # What the operator pulls is what was built and pushed.
    pulled = {PRIVATE.trainer, PRIVATE.merger, PRIVATE.evaluator, PRIVATE.serving, PRIVATE.operator}
    assert pulled <= {b.image for b in builds}


def test_without_a_container_engine_make_images_prints_what_it_would_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = build_images.main(["--engine", "no-such-engine", "--registry", REGISTRY, "--tag", TAG, "--root", str(ROOT)])
    out, err = capsys.readouterr()
    assert rc == build_images.EXIT_NO_ENGINE
    assert "nothing was built" in err
    lines = out.splitlines()
    assert len(lines) == len(images.NAMES)
    assert f"--build-arg VLLM_TPU_IMAGE={c.DEFAULT_VLLM_IMAGE}" in lines[images.NAMES.index(images.EVALUATOR)]


def test_make_images_is_a_target_of_its_own_outside_make_test() -> None:
    makefile = (ROOT / "Makefile").read_text()
    rule = re.search(r"^images:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert rule and "tpuforge images" in rule.group(1)
    test_rule = re.search(r"^test:(.*)$", makefile, re.MULTILINE)
    assert test_rule and "images" not in test_rule.group(1).split()


def test_the_build_context_holds_what_the_dockerfiles_copy_and_nothing_else() -> None:
    """The context is the repository root, whose .dockerignore keeps only what some Dockerfile copies."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in lines
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied: set[str] = set()
    for name, text in dockerfiles().items():
        for instruction in re.findall(r"^COPY\s+((?:.*\\\n)*.*)$", text, re.MULTILINE):
            *sources, _dest = instruction.replace("\\\n", " ").split()
            for src in sources:
                top = Path(src).parts[0]
                assert top in allowed, f"{name}.Dockerfile copies {src}, which .dockerignore leaves out"
                copied.add(top)
    assert copied == allowed
