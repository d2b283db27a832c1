"""The tensor codec and wire targets, without an app."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from model_registry.spec import InputSpec, ModelSpec, OutputSpec
from service.core.errors import InvalidRequest, LimitExceeded
from service.wire import codec
from service.wire.targets import resolve as resolve_target
from tests.service.helpers import b64

TAB = ModelSpec(
    "t",
    "1",
    "",
    "builtin:x",
    "cpu",
    "float32",
    (InputSpec("x", "float32", (None, 4)),),
    OutputSpec((3,), ("a", "b", "c")),
)
TWO = ModelSpec(
    "two",
    "1",
    "",
    "python:m:f",
    "cpu",
    "float32",
    (InputSpec("a", "float32", (None, 3)), InputSpec("b", "float32", (None, 2))),
    OutputSpec((2,)),
)
TOK = ModelSpec(
    "tok",
    "1",
    "",
    "builtin:x",
    "cpu",
    "float32",
    (InputSpec("ids", "int64", (None, None)),),
    OutputSpec((2,), ("neg", "pos")),
    embedding_layer="emb",
)


def dec(raw: object, spec: ModelSpec = TAB) -> codec.DecodedInputs:
    return codec.decode_inputs(raw, spec, max_elements=1000, max_batch=8, max_image_pixels=100)


def test_nested_list_and_b64_agree() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 7
    a = dec(x.tolist()).arrays[0]
    b = dec(b64(x)).arrays[0]
    c = dec([b64(x)]).arrays[0]
    assert a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x)
    np.testing.assert_array_equal(c, x)


def test_encode_roundtrip_base64() -> None:
    x = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float64)
    enc = codec.encode_tensor(x, "base64")
    back = codec.decode_tensor(enc, ("body", "x"), 100)
    np.testing.assert_array_equal(back, x)
    assert codec.encode_tensor(x, "json") is not None


def test_inputs_by_position_and_name() -> None:
    a, b = [[1.0, 2.0, 3.0]], [[4.0, 5.0]]
    by_pos = dec([a, b], TWO)
    by_name = dec({"b": b, "a": a}, TWO)
    for p, q in zip(by_pos.arrays, by_name.arrays, strict=True):
        np.testing.assert_array_equal(p, q)
    with pytest.raises(InvalidRequest, match="missing"):
        dec({"a": a}, TWO)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ([[1.0, 2.0, 3.0]], r"dim 1 must be 4"),
        ([1.0, 2.0, 3.0, 4.0], r"2 dims"),
        ([[1.0, 2.0], [1.0]], "ragged"),
        ([[1.0, "a", 3.0, 4.0]], "only numbers"),
        ([[1.0, float("nan"), 3.0, 4.0]], "NaN"),
        ({"dtype": "float64", "shape": [1, 4], "b64": ""}, "takes float32"),
        ({"dtype": "float32", "shape": [1, 4], "b64": "AAAA"}, "holds 3 bytes"),
        ({"dtype": "complex", "shape": [1, 4], "b64": ""}, "dtype must be one of"),
        ({"dtype": "float32", "shape": [1, 4], "b64": "%%%"}, "not valid base64"),
    ],
)
def test_bad_inputs(raw: object, match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        dec(raw)


def test_limits() -> None:
    with pytest.raises(LimitExceeded, match="elements"):
        codec.decode_inputs(
            [[0.0] * 4] * 300, TAB, max_elements=1000, max_batch=1000, max_image_pixels=100
        )
    with pytest.raises(LimitExceeded, match="examples"):
        dec([[0.0] * 4] * 9)


def test_int_inputs_reject_floats_and_texts_need_tokenizer() -> None:
    with pytest.raises(InvalidRequest, match="integers"):
        dec([[1.5, 2.0]], TOK)
    assert dec([[1, 2, 3]], TOK).arrays[0].dtype == np.int64
    assert dec(["a text", "another"], TOK).texts == ("a text", "another")
    with pytest.raises(InvalidRequest, match="no tokenizer"):
        dec(["a text"])


def test_targets() -> None:
    out = TAB.output
    assert resolve_target(1, out, 2) == {"form": "index", "index": [1]}
    assert resolve_target("c", out, 2) == {"form": "index", "index": [2]}
    assert resolve_target([0, "b"], out, 2) == {"form": "per_example", "rows": [0, 1]}
    assert resolve_target({"index": [2]}, out, 1) == {"form": "index", "index": [2]}
    assert resolve_target("predicted", out, 3) == {"form": "predicted"}
    for bad, match in [
        (3, "out of range"),
        ("z", "unknown label"),
        ([0], "one entry per"),
        (None, "required"),
        ({"index": [0, 1]}, "2 indices"),
    ]:
        with pytest.raises(InvalidRequest, match=match):
            resolve_target(bad, out, 2)
    assert resolve_target(None, OutputSpec((1,)), 2) is None


@pytest.mark.parametrize(
    ("out", "raw", "loc"),
    [
        (OutputSpec((3,), ("a", "b", "c")), -1, ["body", "target"]),
        (OutputSpec((3,), ("a", "b", "c")), -3, ["body", "target"]),
        (OutputSpec((3,), ("a", "b", "c")), [0, -1], ["body", "target", 1]),
        (OutputSpec((3,), ("a", "b", "c")), {"index": [-1]}, ["body", "target"]),
        (OutputSpec((4, 3)), {"index": [1, -2]}, ["body", "target"]),
        (OutputSpec((4, 3)), {"index": [-1, 0]}, ["body", "target"]),
        (OutputSpec((4, 3)), [{"index": [0, 0]}, {"index": [-1, 2]}], ["body", "target", 1]),
        (OutputSpec((None, 3)), {"index": [-1, 0]}, ["body", "target"]),  # a free dim too
        (OutputSpec((4, 3), ("O", "PER", "LOC")), [[0, "PER"], [-1, "O"]], ["body", "target", 1]),
        (OutputSpec((4, 3), ("O", "PER", "LOC")), [[0, -1], [1, "O"]], ["body", "target", 0]),
    ],
)
def test_a_target_below_zero_is_refused_not_counted_from_the_end(
    out: OutputSpec, raw: object, loc: list[object]
) -> None:
    """CONTRACT 9.1: ``-1`` used to explain the last class silently, in every form."""
    with pytest.raises(InvalidRequest, match=r"out of range.*counts from 0") as err:
        resolve_target(raw, out, 2)
    assert err.value.errors[0]["loc"] == loc


def test_baselines() -> None:
    inputs = dec([[0.0] * 4] * 2)
    assert codec.decode_baselines(0.5, TAB, inputs, 100) == 0.5
    (b,) = codec.decode_baselines([0.1] * 4, TAB, inputs, 100)  # type: ignore[misc]
    assert b.shape == (1, 4)
    with pytest.raises(InvalidRequest, match="must match"):
        codec.decode_baselines([[0.1] * 3], TAB, inputs, 100)


def test_number_baselines_keep_integer_inputs_integer() -> None:
    """A whole number is an integer (an integer input keeps its dtype; CONTRACT §7.7 promotes
    only for a fractional baseline), and token ids take whole numbers only."""
    inputs = dec([[0.0] * 4] * 2)
    for raw in (0, 0.0, 3.0):
        got = codec.decode_baselines(raw, TAB, inputs, 100)
        assert got == raw and isinstance(got, int)
    assert isinstance(codec.decode_baselines(0.25, TAB, inputs, 100), float)
    assert isinstance(codec.decode_baselines(1e300, TAB, inputs, 100), float)
    texts = dec(["a film"], TOK)
    assert codec.decode_baselines(0.0, TOK, texts, 100) == 0
    with pytest.raises(InvalidRequest, match="whole token ids") as info:
        codec.decode_baselines(0.5, TOK, texts, 100)
    assert info.value.errors[0]["loc"] == ["body", "baselines"]


@pytest.mark.parametrize("raw", [[""], ["a film", "   "], [["a premise", ""]]])
def test_an_empty_text_is_refused_naming_it(raw: object) -> None:
    """An empty text has no word to attribute to (it used to answer [[0.0]])."""
    spec = dataclasses.replace(TOK, embedding_layer="embed")
    with pytest.raises(InvalidRequest, match="empty") as err:
        codec.decode_inputs(raw, spec, max_elements=1000, max_batch=8, max_image_pixels=100)
    assert err.value.errors[0]["loc"][:2] == ["body", "inputs"]


def test_integers_past_64_bits_are_named_as_such() -> None:
    """Not "floating-point" nor "not numbers": the value, and the range it is beyond."""
    with pytest.raises(InvalidRequest, match="99999999999999999999, beyond the 64-bit"):
        dec([[99999999999999999999, 1]], TOK)
    with pytest.raises(InvalidRequest, match="beyond int64's range"):
        dec([[1e20, 1]], TOK)  # what a JSON parser reading it as a float gives
    with pytest.raises(InvalidRequest, match=r"integers \(int64\); it holds 1.5"):
        dec([[1.5, 1]], TOK)
    assert dec([[3.0, 1]], TOK).arrays[0].tolist() == [[3, 1]]  # a whole number is one


def test_floats_past_the_model_dtype_s_range_are_named_not_made_inf() -> None:
    """A finite number float32 cannot hold would turn into inf in the cast (and a numpy
    overflow warning): it is refused with the value and the range; inf as sent stays
    check_finite's to name."""
    with pytest.raises(InvalidRequest, match=r"holds 1.243e\+126, beyond float32's range") as err:
        dec([[1.243e126, 0, 0, 0]])
    assert err.value.errors[0]["loc"][:2] == ["body", "inputs"]
    assert dec([[3.0e38, 0, 0, 0]]).arrays[0].dtype == np.float32  # within it
