"""One figure, one text: config.figures.fixed writes a figure as the templates' floatformat does."""

import random

import pytest
from django.template.defaultfilters import floatformat

from config.figures import fixed, percent


@pytest.mark.parametrize(
    ("value", "digits", "text"),
    [
        (0.0625, 3, "0.063"),  # a half rounds up, where Python's format gives "0.062"
        (0.125, 2, "0.13"),
        (2.5, 0, "3"),
        (-0.0625, 3, "-0.063"),
        (-0.0004, 3, "0.000"),
        (0.0, 3, "0.000"),
        (1 / 3, 4, "0.3333"),
        (123.4565, 3, "123.457"),
    ],
)
def test_halves_round_up_and_no_negative_zero(value, digits, text):
    assert fixed(value, digits) == text


def test_signed_differences_keep_their_plus():
    assert (fixed(0.0625, 1, signed=True), fixed(0.0, 1, signed=True), fixed(-1.25, 1, signed=True)) == (
        "+0.1",
        "+0.0",
        "-1.3",
    )


def test_equals_the_templates_floatformat():
    rng = random.Random(7)
    values = [rng.random() for _ in range(3000)] + [round(rng.uniform(-2, 2), 4) for _ in range(3000)]
    for value in values:
        for digits in (1, 2, 3, 4):
            assert fixed(value, digits) == floatformat(value, digits), (value, digits)


def test_a_share_as_a_percentage():
    assert (percent(0.12345), percent(0.000625, 2), percent(0.0)) == ("12.3%", "0.06%", "0.0%")
