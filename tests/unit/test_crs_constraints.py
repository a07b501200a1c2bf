"""The constraint text grammar and the proto -> Constraint validation (cross_resource_scheduler.constraints)."""

from __future__ import annotations

import math

import pytest

from cross_resource_scheduler.constraints import Constraint, ConstraintSyntaxError, from_proto, parse
from harness.v1 import irm_pb2
from services.errors import Violations

K = irm_pb2.GroupConstraint


# -- the grammar: every accepted form ------------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("same_host(a, b)", Constraint("same_host", "a", "b", 0.0)),
        ("different_host(a,b)", Constraint("different_host", "a", "b", 0.0)),
        ("  same_host( master ,workers )  ", Constraint("same_host", "master", "workers", 0.0)),
        ("different_host(web-1, db.primary)", Constraint("different_host", "web-1", "db.primary", 0.0)),
        ("same_host(w, w)", Constraint("same_host", "w", "w", 0.0)),
        ("hops(master, workers) <= 2", Constraint("max_hops", "master", "workers", 2.0)),
        ("hops(a,b)<=0", Constraint("max_hops", "a", "b", 0.0)),
        ("hops(a, b) <= 4hops", Constraint("max_hops", "a", "b", 4.0)),
        ("latency_ms(a, b) <= 0.5", Constraint("max_latency_ms", "a", "b", 0.5)),
        ("latency_ms(a, b) <= .25", Constraint("max_latency_ms", "a", "b", 0.25)),
        ("latency_ms(a, b) <= 3ms", Constraint("max_latency_ms", "a", "b", 3.0)),
        ("latency(a, b) <= 500us", Constraint("max_latency_ms", "a", "b", 0.5)),
        ("latency(a, b) <= 2ms", Constraint("max_latency_ms", "a", "b", 2.0)),
        ("latency(a, b) <= 1.5s", Constraint("max_latency_ms", "a", "b", 1500.0)),
        ("latency(a, b) <= 5MS", Constraint("max_latency_ms", "a", "b", 5.0)),  # units are case-insensitive
        ("bandwidth_gbps(a, b) >= 10", Constraint("min_bandwidth_gbps", "a", "b", 10.0)),
        ("bandwidth_gbps(a, b) >= 40gbps", Constraint("min_bandwidth_gbps", "a", "b", 40.0)),
        ("bandwidth(a, b) >= 100mbps", Constraint("min_bandwidth_gbps", "a", "b", 0.1)),
        ("bandwidth(a, b) >= 25Gbps", Constraint("min_bandwidth_gbps", "a", "b", 25.0)),
    ],
)
def test_parse_accepts_every_form(text: str, expected: Constraint) -> None:
    got = parse(text)
    assert (got.kind, got.a, got.b) == (expected.kind, expected.a, expected.b)
    assert got.value == pytest.approx(expected.value)


def test_constraint_helpers() -> None:
    c = parse("hops(x, y) <= 2")
    assert c.involves("x") and c.involves("y") and not c.involves("z")
    assert c.other("x") == "y" and c.other("y") == "x"


# -- the grammar: rejections ---------------------------------------------------

@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        # wrong comparison for the function
        ("hops(a, b) >= 2", "expected <="),
        ("latency_ms(a, b) >= 1", "expected <="),
        ("bandwidth_gbps(a, b) <= 10", "expected >="),
        # unknown functions (names are case-sensitive)
        ("foo(a, b)", "unknown function 'foo'"),
        ("SAME_HOST(a, b)", "unknown function"),
        ("eval(a, b)", "unknown function 'eval'"),
        # trailing garbage
        ("same_host(a, b) x", "after the constraint"),
        ("same_host(a, b) <= 2", "after the constraint"),
        ("hops(a, b) <= 2 hops", "after the constraint"),
        ("hops(a, b) <= 2 3", "after the constraint"),
        ("hops(a, b) <= 2;", "unexpected ';'"),
        # missing unit where the short name requires one
        ("latency(a, b) <= 5", "unit 'missing' not valid for latency"),
        ("bandwidth(a, b) >= 100", "unit 'missing' not valid for bandwidth"),
        ("latency(a, b) <= 500 us", "unit 'missing'"),
        # a unit from the wrong family
        ("hops(a, b) <= 2gbps", "unit 'gbps' not valid for hops"),
        ("latency_ms(a, b) <= 2mbps", "not valid for latency_ms"),
        ("bandwidth_gbps(a, b) >= 2ms", "not valid for bandwidth_gbps"),
        # structure
        ("", "found the end"),
        ("   ", "found the end"),
        ("same_host", "found the end"),
        ("same_host(a)", "expected ,"),
        ("same_host(a, b", "expected )"),
        ("same_host(a, b, c)", "expected )"),
        ("hops(a, b) <=", "expected num"),
        ("hops(a, b) <= x", "expected num"),
        ("hops(a, b) <= -1", "unexpected '-1'"),
        ("hops(1, b) <= 2", "expected name"),
        ("hops(a, b) == 2", "unexpected"),
        # digits are ASCII: the grammar is fixed, not whatever Python's float() takes
        ("hops(a, b) <= \u0661\u0662", "unexpected"),
        ("latency(a, b) <= \uff15ms", "unexpected"),
    ],
)
def test_parse_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ConstraintSyntaxError) as info:
        parse(text)
    assert fragment in str(info.value)
    assert "at character" in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os')",
        "__import__('os').system('true')",
        "same_host(a, b) or __import__('os')",
        "same_host(a, b); import os",
        "hops(a, b) <= 2 and True",
        "hops(a, b) <= (1).__class__",
        "hops(a, b) <= 1e3",
        "same_host(a, b)\nimport os",
        "same_host(a, __builtins__)  # comment",
        "lambda: 1",
        "[x for x in ()]",
        "same_host(a, b) + 1",
    ],
)
def test_parse_rejects_code_injection(text: str) -> None:
    with pytest.raises(ConstraintSyntaxError):
        parse(text)


def test_parse_never_evaluates(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("the parser evaluated text")

    monkeypatch.setattr(builtins, "eval", boom)
    monkeypatch.setattr(builtins, "exec", boom)
    assert parse("hops(a, b) <= 2").value == 2.0
    with pytest.raises(ConstraintSyntaxError):
        parse("__import__('os')")


def test_syntax_error_positions_for_unindented_text() -> None:
    with pytest.raises(ConstraintSyntaxError) as info:
        parse("__import__('os')")
    assert info.value.position == "__import__('os')".index("'")
    with pytest.raises(ConstraintSyntaxError) as info:
        parse("hops(a, b) >= 2")
    assert info.value.position == "hops(a, b) >= 2".index(">=")
    with pytest.raises(ConstraintSyntaxError) as info:
        parse("latency(a, b) <= 5")
    assert info.value.position == "latency(a, b) <= 5".index("5")


@pytest.mark.parametrize(
    ("text", "offending"),
    [
        ("  foo(a, b)", "foo"),             # unknown function after leading blanks
        ("hops(a, b) <= 2 ;", ";"),         # an untokenisable character after a blank
    ],
)
def test_syntax_error_position_points_at_the_offending_text(text: str, offending: str) -> None:
    with pytest.raises(ConstraintSyntaxError) as info:
        parse(text)
    assert info.value.position == text.index(offending)


# -- from_proto: structured and text forms, field violations -------------------

def _from(msgs: list[irm_pb2.GroupConstraint], groups: set[str] | None = None
          ) -> tuple[list[Constraint], list[tuple[str, str]]]:
    v = Violations()
    out = from_proto(msgs, groups if groups is not None else {"a", "b"}, v)
    return out, [(x.field, x.description) for x in v.items]


def test_from_proto_structured_every_kind() -> None:
    out, errors = _from([
        K(kind=K.KIND_SAME_HOST, group_a="a", group_b="b"),
        K(kind=K.KIND_DIFFERENT_HOST, group_a="a", group_b="a"),
        K(kind=K.KIND_MAX_HOPS, group_a="a", group_b="b", value=2),
        K(kind=K.KIND_MAX_LATENCY_MS, group_a="b", group_b="a", value=0.5),
        K(kind=K.KIND_MIN_BANDWIDTH_GBPS, group_a="a", group_b="b", value=10),
    ])
    assert errors == []
    assert out == [
        Constraint("same_host", "a", "b", 0.0),
        Constraint("different_host", "a", "a", 0.0),
        Constraint("max_hops", "a", "b", 2.0),
        Constraint("max_latency_ms", "b", "a", 0.5),
        Constraint("min_bandwidth_gbps", "a", "b", 10.0),
    ]


def test_from_proto_expression_form() -> None:
    out, errors = _from([K(expression="latency(a, b) <= 500us")])
    assert errors == []
    assert out == [Constraint("max_latency_ms", "a", "b", 0.5)]


def test_from_proto_unknown_group_names_name_both_sides() -> None:
    out, errors = _from([K(kind=K.KIND_SAME_HOST, group_a="x", group_b="y")])
    assert out == []
    fields = [f for f, _ in errors]
    assert fields == ["constraints[0].group_a", "constraints[0].group_b"]
    assert "no group named 'x'" in errors[0][1] and "['a', 'b']" in errors[0][1]
    assert "no group named 'y'" in errors[1][1]


def test_from_proto_unknown_group_in_expression() -> None:
    out, errors = _from([K(expression="hops(a, ghost) <= 2")])
    assert out == []
    assert errors == [("constraints[0].group_b", "no group named 'ghost'; groups are ['a', 'b']")]


@pytest.mark.parametrize(
    "extra",
    [{"kind": K.KIND_SAME_HOST}, {"group_a": "a"}, {"group_b": "b"}, {"value": 1.0}],
)
def test_from_proto_rejects_expression_and_structured_fields_together(extra: dict) -> None:
    out, errors = _from([K(expression="same_host(a, b)", **extra)])
    assert out == []
    assert len(errors) == 1
    assert errors[0][0] == "constraints[0]"
    assert "not both" in errors[0][1]


def test_from_proto_bad_expression_is_a_violation_on_the_expression_field() -> None:
    out, errors = _from([K(expression="__import__('os')")])
    assert out == []
    assert len(errors) == 1 and errors[0][0] == "constraints[0].expression"
    assert "at character" in errors[0][1]


def test_from_proto_missing_kind() -> None:
    out, errors = _from([K(group_a="a", group_b="b", value=2)])
    assert out == []
    assert errors[0][0] == "constraints[0].kind"
    assert "KIND_SAME_HOST" in errors[0][1]


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        (K.KIND_MAX_HOPS, -1.0, ">= 0"),
        (K.KIND_MAX_LATENCY_MS, -0.1, ">= 0"),
        (K.KIND_MIN_BANDWIDTH_GBPS, -5.0, "> 0"),
        (K.KIND_MIN_BANDWIDTH_GBPS, 0.0, "> 0"),
    ],
)
def test_from_proto_rejects_out_of_range_values(kind: int, value: float, message: str) -> None:
    out, errors = _from([K(kind=kind, group_a="a", group_b="b", value=value)])
    assert out == []
    assert errors == [("constraints[0].value", errors[0][1])]
    assert message in errors[0][1]


def test_from_proto_zero_hops_and_latency_are_valid() -> None:
    out, errors = _from([K(kind=K.KIND_MAX_HOPS, group_a="a", group_b="b", value=0),
                         K(kind=K.KIND_MAX_LATENCY_MS, group_a="a", group_b="b", value=0)])
    assert errors == [] and len(out) == 2


@pytest.mark.parametrize(
    "kind", [K.KIND_MAX_HOPS, K.KIND_MAX_LATENCY_MS, K.KIND_MIN_BANDWIDTH_GBPS])
def test_from_proto_rejects_nan_values(kind: int) -> None:
    # NaN compares false with everything: a NaN bound would silently never constrain anything.
    out, errors = _from([K(kind=kind, group_a="a", group_b="b", value=math.nan)])
    assert out == []
    assert [f for f, _ in errors] == ["constraints[0].value"]


def test_from_proto_collects_every_problem_with_indexes_and_prefix() -> None:
    v = Violations()
    out = from_proto(
        [K(expression="same_host(a, b)"),
         K(expression="hops(a, b) >= 2"),
         K(kind=K.KIND_MAX_HOPS, group_a="a", group_b="zz", value=-3)],
        {"a", "b"}, v, prefix="request.constraints")
    assert out == [Constraint("same_host", "a", "b", 0.0)]
    fields = [x.field for x in v.items]
    assert fields == ["request.constraints[1].expression", "request.constraints[2].group_b",
                      "request.constraints[2].value"]
    with pytest.raises(Exception) as info:
        v.raise_if_any()
    assert "request.constraints[1].expression" in str(info.value)


def test_an_oversized_expression_is_refused_at_once() -> None:
    # A constraint is one relation; a megabyte of text took seconds to tokenise (each token copied the rest).
    with pytest.raises(ConstraintSyntaxError, match="too long: 1000001 characters"):
        parse("same_host(a, b)" + " " * (1_000_001 - len("same_host(a, b)")))
    assert parse("same_host(a, b)" + " " * 900) == parse("same_host(a, b)")
