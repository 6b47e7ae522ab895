"""The one check of a request's text (config.parsing.check_text): NUL, lone surrogates and every
other control character but tab, line feed and carriage return are refused, naming the field."""

from __future__ import annotations

import unicodedata

import pytest

from config.parsing import HostileInput, check_text, loads

CONTROLS = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc"]


@pytest.mark.parametrize("char", [c for c in CONTROLS if c not in "\t\n\r"], ids=lambda c: f"U+{ord(c):04X}")
def test_control_characters_are_refused_naming_the_field(char):
    with pytest.raises(HostileInput) as err:
        check_text(f"a{char}b", "note")
    assert err.value.field == "note"
    assert ("NUL" if char == "\x00" else f"U+{ord(char):04X}") in str(err.value)


@pytest.mark.parametrize(
    "text",
    [
        "one\ttwo",
        "line\r\nnext\n",
        "plain",
        "é ü 漢字 🙂",
        "\u200b zero width",
        "\u00a0nbsp",
        "\u2028 line separator",
        "",
    ],
)
def test_text_with_tabs_line_ends_and_any_printable_unicode_passes(text):
    check_text(text, "note")


def test_json_strings_and_keys_meet_the_same_check():
    with pytest.raises(HostileInput) as err:
        loads('{"scales": {"overall": "a\\u001bb"}}')
    assert err.value.field == "scales.overall"
    with pytest.raises(HostileInput):
        loads('{"a\\u0007": 1}')
    assert loads('{"note": "a\\tb\\r\\n"}') == {"note": "a\tb\r\n"}
