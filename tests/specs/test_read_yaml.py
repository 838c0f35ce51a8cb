"""read_yaml: the one reader of YAML spec files."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.errors import SpecError
from simulator.specs.loader import read_yaml


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "f.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_merge_key_may_be_overridden(tmp_path: Path) -> None:
    # `<<` merges, and a key given beside it wins: no duplicate
    text = "a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  y: 3\n"
    assert read_yaml(_file(tmp_path, text)) == {"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}}


def test_an_aliased_mapping_is_checked_once(tmp_path: Path) -> None:
    text = "a: &a {x: 1}\nb: [*a, *a, *a]\n"
    assert read_yaml(_file(tmp_path, text))["b"] == [{"x": 1}] * 3


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("a: 1\nb: 2\na: 3\n", 3, "a"),
        ("groups:\n  - {hardware: h100_sxm, count: 1, count: 2}\n", 2, "count"),
        ("x:\n  y:\n    z: 1\n    z: 1\n", 4, "z"),
    ],
)
def test_a_key_set_twice_is_an_error_at_its_second_line(
    tmp_path: Path, text: str, line: int, key: str
) -> None:
    with pytest.raises(SpecError, match=f"duplicate key '{key}'") as err:
        read_yaml(_file(tmp_path, text))
    assert (err.value.source, err.value.field) == (str(tmp_path / "f.yaml"), f"line {line}")


def test_bytes_that_are_not_utf8_name_the_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"a: 1\n\x80\n")
    with pytest.raises(SpecError, match=r"not UTF-8 text \(byte 0x80 at offset 5\)") as err:
        read_yaml(path)
    assert err.value.source == str(path)
