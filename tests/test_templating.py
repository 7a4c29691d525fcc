"""Templates are sandboxed; values from the cluster are data and never run."""

import pytest

from sweeper.errors import PlaybookError
from sweeper.templating import condition, render

HOSTILE = {"node": {"labels": {"team": "{{ 7 * 7 }}", "evil": "{{ lookup('pipe', 'id') }}",
                               "loop": "{% for x in range(10**9) %}x{% endfor %}"}}}


def test_label_values_render_as_literal_text() -> None:
    assert render("{{ node.labels.team }}", HOSTILE) == "{{ 7 * 7 }}"
    assert render("team={{ node.labels.evil }}", HOSTILE) == "team={{ lookup('pipe', 'id') }}"
    assert render("{{ node.labels.loop }}", HOSTILE) == HOSTILE["node"]["labels"]["loop"]
    assert render(["{{ node.labels.team }}"], HOSTILE) == ["{{ 7 * 7 }}"]


def test_the_sandbox_refuses_attribute_escapes() -> None:
    with pytest.raises(PlaybookError):
        render("{{ ''.__class__.__mro__[1].__subclasses__() }}", {})


def test_strict_undefined_and_native_types() -> None:
    with pytest.raises(PlaybookError, match="undefined"):
        render("{{ nope }}", {})
    assert render("{{ [1, 2] }}", {}) == [1, 2]
    assert render("{{ '15m' | duration }}", {}) == 900.0


def test_conditions_must_be_booleans() -> None:
    assert condition("x > 1", {"x": 2}) is True
    with pytest.raises(PlaybookError, match="not a boolean"):
        condition("x", {"x": "yes"})
