"""The shared argument types (oncelog.cli_args) that verify's options use: a bad value is a usage
error naming it, before any work starts."""

from __future__ import annotations

import argparse

import pytest

from oncelog.cli_args import positive


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "infinity"])
def test_positive_refuses_non_finite_numbers(text: str) -> None:
    # nan <= 0 is false: `--duration nan` used to be accepted (and `inf` ran for ever).
    with pytest.raises(argparse.ArgumentTypeError, match="finite"):
        positive(float)(text)


@pytest.mark.parametrize(("text", "why"), [("0", "must be positive"), ("-1.5", "must be positive"),
                                           ("soon", "expected a number")])
def test_positive_refuses_what_is_not_above_zero(text: str, why: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        positive(float)(text)


def test_positive_accepts_finite_positive_numbers() -> None:
    assert positive(float)("0.5") == 0.5
    assert positive(int)("3") == 3
