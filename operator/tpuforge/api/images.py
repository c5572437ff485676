"""The container images tpuforge runs and the names the operator gives them when a spec names none.

Each image is built from images/<name>.Dockerfile (`make images`). The operator is given one registry and one
tag (`--image-registry`, `--image-tag`; the chart's `images.registry` and `images.tag`) and derives every
default from them: `<registry>/<name>:<tag>`, e.g. `europe-docker.pkg.dev/proj/tpuforge/trainer:0.1.0`. With
no registry, the public names: `tpuforge/<name>:<tag>`, and vLLM-TPU's own image for serving, which
images/serving.Dockerfile only re-publishes (a private cluster pulls it from its own registry instead).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, StringConstraints

from tpuforge.api.base import StatusModel
from tpuforge.api.constants import DEFAULT_VLLM_IMAGE, GROUP, PROJECT_VERSION

PUBLIC_PREFIX = "tpuforge"
PULL_SECRETS_HELP = (
    "Names of image pull Secrets (kubernetes.io/dockerconfigjson) in the object's namespace, given to every pod "
    "it runs after the operator's own (--image-pull-secret, the chart's imagePullSecrets)."
)
# A Secret's name: a DNS subdomain.
SecretName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
MAX_PULL_SECRETS = 16

OPERATOR = "operator"
TRAINER = "trainer"  # also the preflight's, and the evaluation's loss step
MERGER = "merger"  # also the serving pods' model-fetch init container and adapters sidecar
EVALUATOR = "evaluator"  # vLLM-TPU with tpuforge on top
SERVING = "serving"  # vLLM-TPU as it is
CHECKER_VERILOG = "checker-verilog"  # named by spec.evaluation.code.checker.image, never defaulted
# Every image, in the order `make images` builds them; each has images/<name>.Dockerfile.
NAMES = (OPERATOR, TRAINER, MERGER, EVALUATOR, SERVING, CHECKER_VERILOG)

# The build argument naming the vLLM-TPU base of the Dockerfiles built on it; `make images` passes
# DEFAULT_VLLM_IMAGE, so the evaluator's vLLM is always the one serving runs by default.
VLLM_BASE_ARG = "VLLM_TPU_IMAGE"
BUILD_ARGS: dict[str, dict[str, str]] = {
    EVALUATOR: {VLLM_BASE_ARG: DEFAULT_VLLM_IMAGE},
    SERVING: {VLLM_BASE_ARG: DEFAULT_VLLM_IMAGE},
}


def unique(names: Iterable[str]) -> list[str]:
    """`names` without repeats or empty names, first occurrence first."""
    return list(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True)
class ImageDefaults:
    """Where the operator's default images come from, and the pull secrets every pod it creates gets."""

    registry: str = ""  # e.g. europe-docker.pkg.dev/proj/tpuforge; empty: the public names
    tag: str = PROJECT_VERSION
    pull_secrets: tuple[str, ...] = ()

    def built(self, name: str) -> str:
        """The name `make images` gives the image of images/<name>.Dockerfile."""
        return f"{self.registry.rstrip('/') or PUBLIC_PREFIX}/{name}:{self.tag or PROJECT_VERSION}"

    def image(self, name: str) -> str:
        """The image the operator runs by default: the one built, except serving with no registry, where it is
        the vLLM-TPU image that tpuforge/serving re-publishes, pulled from where vLLM publishes it."""
        if not self.registry and name == SERVING:
            return DEFAULT_VLLM_IMAGE
        return self.built(name)

    @property
    def operator(self) -> str:
        return self.image(OPERATOR)

    @property
    def trainer(self) -> str:
        return self.image(TRAINER)

    @property
    def merger(self) -> str:
        return self.image(MERGER)

    @property
    def evaluator(self) -> str:
        return self.image(EVALUATOR)

    @property
    def serving(self) -> str:
        return self.image(SERVING)

    @property
    def model_fetch(self) -> str:
        return self.image(MERGER)

    @property
    def adapters(self) -> str:
        return self.image(MERGER)

    def with_pull_secrets(self, own: Iterable[str]) -> list[str]:
        """An object's pull secrets: these (the operator's), then the object's own."""
        return unique([*self.pull_secrets, *own])


# A spec the operator has not filled in (tests, `tpuforge preflight`) renders with these.
PUBLIC_IMAGES = ImageDefaults()

# On a ServingDeployment: a new value (any, e.g. a date) makes it take the operator's current default images.
REFRESH_IMAGES_ANNOTATION = f"{GROUP}/refresh-images"


class ResolvedImages(StatusModel):
    """The default images of one object, resolved once from the operator's when it first handled it, for the
    containers its spec names no image for. They stay through operator upgrades, so an upgrade restarts no
    server and changes no running fine-tune's next stage; an image set in the spec always wins."""

    trainer: str | None = Field(default=None, description="FineTuneJob: training, preflight, evaluation loss.")
    merger: str | None = Field(default=None, description="FineTuneJob: the merge.")
    evaluator: str | None = Field(default=None, description="FineTuneJob: the evaluation's vLLM.")
    serving: str | None = Field(default=None, description="ServingDeployment: vLLM.")
    model_fetch: str | None = Field(default=None, description="ServingDeployment: the model-fetch init container.")
    adapters: str | None = Field(default=None, description="ServingDeployment: the adapters sidecar.")
    refresh: str | None = Field(
        default=None,
        description=f"The {REFRESH_IMAGES_ANNOTATION} annotation these were resolved at; a new value there "
        "resolves them again from the operator's current defaults (a rollout).",
    )
