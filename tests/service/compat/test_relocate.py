"""Errors re-pointed by their structured location (KServe's ``instances``, OIP's
``parameters``): a detail that names its field is rendered from the new location, across the
worker boundary too, and no message text is matched or rewritten."""

from __future__ import annotations

from service.compat import kserve
from service.core.errors import WHERE, InvalidRequest, LimitExceeded, Loc, ServiceError


def _to_instances(loc: Loc) -> Loc:
    return ("body", "instances", *loc[2:]) if loc[1:2] == ("inputs",) else loc


def test_a_named_detail_follows_its_field() -> None:
    err = InvalidRequest(
        f"{WHERE} has shape [1, 2]; input 'x' takes [N, 8]", loc=("body", "inputs")
    )
    assert err.detail == "inputs has shape [1, 2]; input 'x' takes [N, 8]"
    err.relocate(_to_instances)
    assert err.detail == "instances has shape [1, 2]; input 'x' takes [N, 8]" == str(err)
    assert err.errors == [{"loc": ["body", "instances"], "msg": err.detail}]


def test_the_subject_may_differ_from_the_location() -> None:
    err = InvalidRequest(
        f"{WHERE}.dtype must be float32",
        loc=("body", "inputs", 0, "dtype"),
        about=("body", "inputs", 0),
    )
    assert err.detail.startswith("inputs.0.dtype must")
    err.relocate(_to_instances)
    assert err.detail.startswith("instances.0.dtype must")
    assert err.errors[0]["loc"] == ["body", "instances", 0, "dtype"]


def test_other_messages_are_never_rewritten() -> None:
    # a message that happens to begin with a field's name, without naming it structurally
    err = LimitExceeded("inputs hold 9 texts; the limit is 8", loc=("body", "inputs"))
    err.relocate(_to_instances)
    assert err.detail == "inputs hold 9 texts; the limit is 8"
    assert err.errors[0]["loc"] == ["body", "instances"]


def test_relocation_survives_the_process_boundary() -> None:
    err = InvalidRequest(f"{WHERE} holds NaN", loc=("body", "inputs", 3))
    back = ServiceError.from_data(err.to_data())
    assert type(back) is InvalidRequest and back.detail == "inputs.3 holds NaN"
    back.relocate(kserve.v1_move(instances=True))
    assert back.detail == "instances.3 holds NaN"
    assert back.errors[0]["loc"] == ["body", "instances", 3]


def test_parameters_are_moved_under_parameters() -> None:
    err = InvalidRequest(f"{WHERE}: out of range", loc=("body", "target"))
    err.relocate(kserve.v1_move(instances=True))
    assert err.detail == "parameters.target: out of range"
    assert err.errors[0]["loc"] == ["body", "parameters", "target"]
