"""Task messages: a JSON round trip, and every malformed message rejected with MessageError naming the field."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedqueue.core.codec import BlobRef, MessageError
from fedqueue.fl.messages import PACK_MAX, DeviceTask

SHA = hashlib.sha256(b"weights").hexdigest()


def valid_task() -> DeviceTask:
    return DeviceTask(
        run_id="0123456789abcdef0123456789abcdef",
        round_index=3,
        devices=(17,),
        model=BlobRef(key="0123456789abcdef/global/2", sha256=SHA, nbytes=4096),
        enqueued_at=1_700_000_000.25,
        round_size=20,
    )


def valid_raw() -> dict[str, Any]:
    return json.loads(json.dumps(valid_task().to_dict()))


def test_json_round_trip() -> None:
    """to_dict -> JSON text -> from_dict gives back an equal task, with a BlobRef inside."""
    task = valid_task()
    back = DeviceTask.from_dict(json.loads(json.dumps(task.to_dict())))
    assert back == task
    assert isinstance(back.model, BlobRef)


def test_integer_enqueued_at_is_accepted_as_float() -> None:
    """An integral time (JSON has one number type) is taken and stored as a float."""
    raw = valid_raw()
    raw["enqueued_at"] = 1_700_000_000
    task = DeviceTask.from_dict(raw)
    assert isinstance(task.enqueued_at, float) and task.enqueued_at == 1_700_000_000.0


@pytest.mark.parametrize("raw", [None, [], "task", 3, 2.5, True, [valid_task().to_dict()]])
def test_not_an_object_is_rejected(raw: Any) -> None:
    """A message that is not a JSON object is rejected."""
    with pytest.raises(MessageError, match="expected a JSON object"):
        DeviceTask.from_dict(raw)


@pytest.mark.parametrize("field", ["run_id", "round_index", "devices", "model", "enqueued_at", "round_size", "mode"])
def test_missing_field_is_rejected(field: str) -> None:
    """Each required field, when absent, is named in the error."""
    raw = valid_raw()
    del raw[field]
    with pytest.raises(MessageError, match=rf"task\.{field}: missing"):
        DeviceTask.from_dict(raw)


@pytest.mark.parametrize("field", ["key", "sha256", "nbytes"])
def test_missing_blob_field_is_rejected(field: str) -> None:
    """A model reference missing one of its fields is rejected, naming it."""
    raw = valid_raw()
    del raw["model"][field]
    with pytest.raises(MessageError, match=rf"blob\.{field}: missing"):
        DeviceTask.from_dict(raw)


@pytest.mark.parametrize("where", ["task", "model"])
def test_unknown_field_is_rejected(where: str) -> None:
    """An extra field, at the top or inside the model reference, is rejected by name."""
    raw = valid_raw()
    target = raw if where == "task" else raw["model"]
    target["priority_boost"] = 1
    with pytest.raises(MessageError, match="unknown field 'priority_boost'"):
        DeviceTask.from_dict(raw)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("round_index",), "3"),  # str for int
        (("round_index",), True),  # bool is not an int here
        (("devices",), 17),  # a number for a list
        (("devices",), "17"),
        (("mode",), 1),
        (("run_id",), 5),
        (("model",), "key"),
        (("model",), [SHA]),
        (("enqueued_at",), "now"),
        (("enqueued_at",), True),
        (("enqueued_at",), None),
        (("round_size",), 20.0),
        (("model", "nbytes"), "4096"),
        (("model", "nbytes"), 4096.0),
        (("model", "sha256"), None),
        (("model", "key"), 7),
    ],
)
def test_wrong_type_is_rejected(path: tuple[str, ...], value: Any) -> None:
    """A field of the wrong JSON type is rejected, and the error names that field."""
    raw = valid_raw()
    target = raw
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    what = "task" if len(path) == 1 else "blob"
    with pytest.raises(MessageError, match=rf"{what}\.{path[-1]}: wrong type"):
        DeviceTask.from_dict(raw)


@pytest.mark.parametrize("sha", ["", SHA[:-1], SHA + "0", SHA * 2])
def test_bad_sha256_length_is_rejected(sha: str) -> None:
    """A sha256 that is not 64 characters long is rejected."""
    raw = valid_raw()
    raw["model"]["sha256"] = sha
    with pytest.raises(MessageError, match="sha256"):
        DeviceTask.from_dict(raw)


@pytest.mark.parametrize(
    ("field", "value"), [("devices", [-1]), ("round_index", 0), ("round_index", -4), ("round_size", 0)]
)
def test_out_of_range_numbers_are_rejected(field: str, value: Any) -> None:
    """A negative device or a round below 1 is rejected, naming the field."""
    raw = valid_raw()
    raw[field] = value
    with pytest.raises(MessageError, match=field):
        DeviceTask.from_dict(raw)


def test_boundary_values_are_accepted() -> None:
    """Device 0 and round 1 are the smallest valid values."""
    raw = valid_raw()
    raw["devices"], raw["round_index"] = [0], 1
    task = DeviceTask.from_dict(raw)
    assert (task.devices, task.round_index) == ((0,), 1)


@pytest.mark.parametrize(
    ("devices", "reason"),
    [
        ([], "1 to"),
        ([3, 2], "sorted and distinct"),
        ([2, 2], "sorted and distinct"),
        ([1, 2.0], "integers"),
        ([1, True], "integers"),
        (["1"], "integers"),
        (list(range(PACK_MAX + 1)), "1 to"),
    ],
)
def test_bad_pack_is_rejected(devices: list[Any], reason: str) -> None:
    """A pack that is empty, unsorted, repeats a device, holds a non-integer or is too long is rejected."""
    raw = valid_raw()
    raw["devices"] = devices
    with pytest.raises(MessageError, match=rf"task\.devices: .*{reason}"):
        DeviceTask.from_dict(raw)


def test_unknown_pack_mode_is_rejected() -> None:
    raw = valid_raw()
    raw["mode"] = "parallel"
    with pytest.raises(MessageError, match=r"task\.mode: one of sequential, vmap"):
        DeviceTask.from_dict(raw)


def test_a_pack_has_its_own_key_and_goes_alone_device_by_device() -> None:
    """A lone device keeps the plain key; a pack is keyed by its range, and its devices split off with their own keys."""
    lone = valid_task()
    pack = replace(lone, devices=(3, 5, 17), mode="vmap")
    assert lone.attempt_key.endswith(":3:17") and lone.pack is None
    assert pack.attempt_key.endswith(":3:pack 3-17") and pack.pack == "pack 3-17"
    assert pack.label.endswith("round 3 pack 3-17 (3 devices, vmap): 3, 5, 17")
    alone = pack.alone(17, 5.0)
    assert (alone.devices, alone.mode, alone.enqueued_at) == ((17,), "sequential", 5.0)
    assert alone.attempt_key == lone.attempt_key and alone.model == pack.model
    assert DeviceTask.from_dict(json.loads(json.dumps(pack.to_dict()))) == pack


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=70),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=6),
    max_leaves=20,
)
field_names = st.sampled_from(
    ["run_id", "round_index", "devices", "model", "enqueued_at", "round_size", "mode", "key", "sha256", "nbytes"]
)


@st.composite
def near_valid_messages(draw: st.DrawFn) -> Any:
    """A valid message with a few fields (top level or in the model) replaced, removed or added."""
    raw = valid_raw()
    for _ in range(draw(st.integers(1, 3))):
        target = raw["model"] if draw(st.booleans()) and isinstance(raw.get("model"), dict) else raw
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        name = draw(field_names | st.text(max_size=8))
        if action == "remove":
            target.pop(name, None)
        else:
            target[name] = draw(json_values)
    return raw


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_values, near_valid_messages()))
def test_any_json_value_gives_a_task_or_message_error(raw: Any) -> None:
    """Whatever JSON arrives, from_dict returns a DeviceTask or raises MessageError, nothing else."""
    before = copy.deepcopy(raw)
    try:
        task = DeviceTask.from_dict(raw)
    except MessageError:
        assert repr(raw) == repr(before)  # a rejected message is left as it was (repr: NaN equals itself)
        return
    assert repr(raw) == repr(before)
    assert isinstance(task, DeviceTask) and isinstance(task.model, BlobRef)
    # An accepted task survives the JSON round trip (NaN, which never equals itself, aside).
    if not math.isnan(task.enqueued_at):
        assert DeviceTask.from_dict(json.loads(json.dumps(task.to_dict()))) == task
