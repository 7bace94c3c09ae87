"""tutorial_lib.checks: the one positive-integer rule."""

from dataclasses import dataclass

import numpy as np
import pytest

from tutorial_lib.checks import check_int, check_positive_int, check_positive_ints


@pytest.mark.parametrize("value", [1, 7, np.int64(3)])
def test_accepts_integers(value):
    assert check_positive_int(value, "n") == int(value)
    assert type(check_positive_int(value, "n")) is int


@pytest.mark.parametrize("value", [0, -2, 4.0, 2.5, True, "3", None])
def test_rejects_everything_else_with_the_name(value):
    with pytest.raises(ValueError, match=r"n_gpus must be a positive integer, got"):
        check_positive_int(value, "n_gpus")


def test_minimum_zero():
    assert check_int(0, "spares", 0) == 0
    with pytest.raises(ValueError, match="spares must be an integer >= 0, got -1"):
        check_int(-1, "spares", 0)


def test_config_fields_are_named_by_type():
    @dataclass
    class Spec:
        layers: int = 2
        heads: int = 0

    with pytest.raises(ValueError, match=r"Spec\.heads must be a positive integer, got 0\."):
        check_positive_ints(Spec(), ("layers", "heads"))
