"""core/results.py: a lab's typed result, read by attribute and printed as JSON."""
from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone

import pytest

from labkit.core.results import Result, not_json, plain


@dataclasses.dataclass(frozen=True)
class Part(Result):
    name: str
    rows: int


@dataclasses.dataclass(frozen=True)
class Whole(Result):
    """A result with a nested one, a list of them, a tuple and a field JSON cannot hold."""
    took_ms: float
    parts: list[Part]
    first: Part
    sizes: tuple[int, ...]
    at: datetime
    figure: object = not_json()


def whole() -> Whole:
    return Whole(took_ms=1.5, parts=[Part("a", 1), Part("b", 2)], first=Part("a", 1), sizes=(1, 2),
                 at=datetime(2026, 1, 2, tzinfo=timezone.utc), figure=object())


def test_fields_are_read_by_attribute_and_a_misspelling_names_the_class():
    w = whole()
    assert w.took_ms == 1.5 and w.parts[1].rows == 2
    with pytest.raises(AttributeError, match="Whole"):
        w.took  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.took_ms = 2  # type: ignore[misc]


def test_as_dict_is_plain_values_without_the_fields_json_cannot_hold():
    d = whole().as_dict()
    assert list(d) == ["took_ms", "parts", "first", "sizes", "at"]
    assert d["parts"] == [{"name": "a", "rows": 1}, {"name": "b", "rows": 2}]
    assert d["first"] == {"name": "a", "rows": 1} and d["sizes"] == [1, 2]


def test_to_json_prints_what_as_dict_gives_with_datetimes_as_text():
    text = whole().to_json()
    back = json.loads(text)
    assert back["at"] == "2026-01-02 00:00:00+00:00" and back["parts"][0]["name"] == "a"
    assert "figure" not in back


def test_only_picks_fields_in_the_order_asked_and_names_an_unknown_one():
    assert list(whole().as_dict(only=["sizes", "took_ms"])) == ["sizes", "took_ms"]
    with pytest.raises(KeyError, match="Whole has no JSON field figure"):
        whole().as_dict(only=["figure"])


def test_plain_turns_keys_into_text_and_leaves_scalars_alone():
    assert plain({1: (Part("x", 3),)}) == {"1": [{"name": "x", "rows": 3}]}
    assert plain(None) is None and plain("s") == "s"
