"""spec.training.remat: as written, else the preflight's choice (status.preflight.remat), else on."""

from __future__ import annotations

import pytest

from tests.fixtures.finetune.specs import spec
from tpuforge import api


@pytest.mark.parametrize(
    ("written", "preflight", "runs"),
    [
        (None, None, True),  # no preflight ran (spec.preflight.enabled false)
        (None, api.PreflightStatus(fits=True), True),  # a report without remat (an older trainer image's)
        (None, api.PreflightStatus(fits=True, remat=False), False),  # the step without remat fits
        (None, api.PreflightStatus(fits=True, remat=True), True),  # it does not: the preflight fell back
        (True, api.PreflightStatus(fits=True, remat=False), True),  # the user's choice is never overridden
        (False, None, False),
        (False, api.PreflightStatus(fits=True, remat=True), False),
    ],
)
def test_remat_is_the_spec_s_else_the_preflight_s_else_on(
    written: bool | None, preflight: api.PreflightStatus | None, runs: bool
) -> None:
    training = api.TrainingSpec(max_seq_len=128, remat=written)
    assert api.resolved_remat(training, preflight) is runs


def test_remat_is_unset_by_default_and_only_the_trainer_s_config_decides_it() -> None:
    s = spec()
    assert s.training.remat is None and "remat" not in s.to_wire()["training"]
    # The preflight's config leaves the choice to the preflight; the training pod's carries it.
    assert api.train_config("ns", "job", s).training.remat is None
    chose_off = api.PreflightStatus(fits=True, remat=False)
    assert api.trainer_config("ns", "job", s, 0, chose_off).training.remat is False
    assert api.trainer_config("ns", "job", s, 0, None).training.remat is True
