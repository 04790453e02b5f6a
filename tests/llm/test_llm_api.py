"""The LLM Python API (fedqueue.llm): jobs submitted from Python, through real Redis and real worker processes."""

from __future__ import annotations

import json
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

import fedqueue
import fedqueue.llm.api
from fedqueue import api
from fedqueue.config import Settings
from fedqueue.core.database import open_store
from fedqueue.errors import ConfigError, NotFound
from fedqueue.llm.api import JobHandle, job_request
from fedqueue.llm.results import prompt_rows
from fedqueue.llm.settings import GenerationSettings
from fedqueue.llm.wake import stored_key
from tests.conftest import running_workers
from tests.llm.test_llm_queue import expected_outputs


@pytest.fixture(scope="module")
def api_settings(redis_url: str, key_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """One store and queue for this module's jobs: its tests share the same two workers."""
    folder = tmp_path_factory.mktemp("llm-api")
    return Settings(
        broker_url=redis_url,
        database_url=f"sqlite:///{folder / 'fedqueue.db'}",
        key_prefix=f"{key_prefix}-api-{uuid.uuid4().hex[:6]}",
        task_time_limit_s=120,
    )


@pytest.fixture(scope="module")
def workers(api_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:  # the workers' caches in the test's folders, not the user's
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("worker-cache")))
        with running_workers(api_settings, procs=2, log_dir=tmp_path_factory.mktemp("worker-logs")):
            yield


def stored_rows(handle: JobHandle) -> list[Any]:
    return prompt_rows(handle.store, handle.id)


def test_a_list_of_prompts_submitted_from_python_is_followed_read_and_exported(
    api_settings: Settings, workers: None, tiny_model_path: Path, tmp_path: Path
) -> None:
    prompts: list[str | dict[str, Any]] = [f"Question {i}: " + "why " * i for i in range(6)]
    prompts += [
        {"id": "chat", "messages": [{"role": "user", "content": "Hello there"}]},
        {"id": "bad", "promt": "a typo"},  # stored as a failed row in its place, the rest runs
        {"id": 7, "prompt": "Line\nbreaks stay inside one prompt"},
    ]
    handle = fedqueue.llm.submit(
        prompts, tiny_model_path, settings=api_settings, max_new_tokens=6, batch_size=3, job="api-list"
    )
    assert isinstance(handle, JobHandle) and handle.id == "api-list"
    assert handle.submitted is not None and handle.submitted.prompts == 8
    assert handle.submitted.slots == 2  # planned for the two workers answering on the broker
    assert [(error.line, error.input_id) for error in handle.submitted.input_errors] == [(8, "bad")]

    progress = list(handle.follow(timeout_s=60, poll_s=0.05))
    assert progress[-1] == {
        "done": 8,
        "failed": 1,
        "pending": 0,
        "total": 9,
        "prompt_tokens": progress[-1]["prompt_tokens"],
        "generated_tokens": progress[-1]["generated_tokens"],
    }
    assert all(earlier["pending"] >= later["pending"] for earlier, later in zip(progress, progress[1:], strict=False))
    status = handle.wait(timeout_s=5)
    assert (status["state"], status["done"], status["failed"], status["prompts"]) == ("finished", 8, 1, 9)
    assert status["generation"] == GenerationSettings(max_new_tokens=6).to_dict()
    assert status["errors"][0]["id"] == "bad" and "unknown field 'promt'" in status["errors"][0]["error"]

    rows = handle.rows()
    assert [row["line"] for row in rows] == list(range(1, 10))  # item N is line N, in the order given
    assert [row["id"] for row in rows] == [1, 2, 3, 4, 5, 6, "chat", "bad", 7]  # no id: its line number
    assert [row["state"] for row in rows] == ["done"] * 7 + ["failed", "done"]
    generated = [row for row in stored_rows(handle) if row.state == "done"]
    assert generated[-1].prompt == "Line\nbreaks stay inside one prompt"
    assert {row.key: row.output for row in generated} == expected_outputs(
        tiny_model_path, generated, GenerationSettings(max_new_tokens=6)
    )

    out = handle.export(tmp_path / "out.jsonl")
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows
    # A handle from the job's id alone, as another process would take one.
    assert fedqueue.llm.get_job("api-list", api_settings).rows() == rows


def test_chat_sends_plain_prompts_as_a_user_message_and_plain_prompts_to_a_chat_model_get_a_hint(
    api_settings: Settings, workers: None, tiny_model_path: Path
) -> None:
    """A chat model (SmolLM2-Instruct) may answer a bare prompt with "": say so, and offer chat=True."""
    question = "What is the capital of France?"
    hint = r"is a chat model \(its tokenizer has a chat template\) and 1 of 1 prompts are plain text.* chat=True"
    with pytest.warns(UserWarning, match=hint):
        plain = fedqueue.llm.submit([question], tiny_model_path, settings=api_settings, max_new_tokens=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chat = fedqueue.llm.submit([question], tiny_model_path, settings=api_settings, max_new_tokens=6, chat=True)
        as_messages = fedqueue.llm.submit(
            [{"messages": [{"role": "user", "content": question}]}],
            tiny_model_path,
            settings=api_settings,
            max_new_tokens=6,
        )
    assert not [warning for warning in caught if "chat template" in str(warning.message)]
    assert chat.id != plain.id  # the same prompts sent as chats are another job
    for handle in (plain, chat, as_messages):
        assert handle.wait(timeout_s=60)["state"] == "finished"
    [chat_row] = stored_rows(chat)
    assert (chat_row.prompt, chat_row.messages) == (None, [["user", question]])
    assert chat.rows()[0]["output"] == as_messages.rows()[0]["output"]  # the chat template applied, as for messages
    assert chat.rows()[0]["output"] != plain.rows()[0]["output"]


def test_run_waits_exports_and_the_same_prompts_again_continue_the_job(
    api_settings: Settings, workers: None, tiny_model_path: Path, tmp_path: Path
) -> None:
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": "Say " + "a" * i}) + "\n" for i in range(10)))
    out = tmp_path / "out.jsonl"
    handle = fedqueue.llm.run(input_path, str(tiny_model_path), settings=api_settings, out=out, max_new_tokens=5)
    assert handle.state == "finished" and handle.id.startswith("llm-")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["id"] for row in rows] == [f"q{i}" for i in range(10)]
    assert all(row["state"] == "done" and row["generated_tokens"] == 5 for row in rows)
    assert rows == handle.rows()
    assert handle.submitted is not None and (handle.submitted.resumed, handle.submitted.enqueued) == (False, 10)

    again = fedqueue.llm.run(input_path, str(tiny_model_path), settings=api_settings, max_new_tokens=5)
    assert again.id == handle.id and again.submitted is not None
    assert (again.submitted.resumed, again.submitted.enqueued) == (True, 0)  # nothing left to generate
    assert again.rows() == rows


def test_run_sees_its_jobs_end_when_the_last_batch_is_stored_not_at_its_next_poll(
    api_settings: Settings, workers: None, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower's wait between polls is the workers' wake-up, which returns as soon as a batch is stored."""
    waits: list[tuple[str, bool]] = []

    def recording(services: Any, run_id: str) -> Any:
        key = stored_key(services.settings.key_prefix, run_id)

        def wait(timeout_s: float) -> None:
            waits.append((run_id, services.ledger.wait_for_wake(key, timeout_s)))

        return wait

    monkeypatch.setattr(fedqueue.llm.api, "stored_waiter", recording)
    prompts = [f"Woken {n}" for n in range(16)]  # batches long enough that the follower waits between them
    handle = fedqueue.llm.run(prompts, str(tiny_model_path), settings=api_settings, max_new_tokens=32, batch_size=4)
    assert handle.state == "finished"
    assert waits and {run_id for run_id, _ in waits} == {handle.id}
    assert any(woken for _, woken in waits)  # a wait cut short by a batch stored, not slept out


def test_a_wake_up_that_fails_leaves_a_sleep_of_the_same_length() -> None:
    def broken(_seconds: float) -> None:
        raise redis.ConnectionError("the broker is away")

    began = time.monotonic()
    api._or_sleep(broken)(0.05)
    assert time.monotonic() - began >= 0.05


@pytest.mark.sessions
def test_run_with_nothing_configured_starts_and_stops_its_own_workers(
    settings: Settings, tiny_model_path: Path
) -> None:
    local = replace(settings, broker_url=None)
    handle = fedqueue.llm.run(["One", "Two", "Three"], tiny_model_path, settings=local, procs=1, max_new_tokens=4)
    assert handle.status()["state"] == "finished"
    assert [(row["line"], row["state"], row["generated_tokens"]) for row in handle.rows()] == [
        (1, "done", 4),
        (2, "done", 4),
        (3, "done", 4),
    ]
    embedded = handle.settings.broker_url
    assert embedded and embedded != settings.broker_url  # an embedded Redis of its own, stopped at the end
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(embedded, socket_connect_timeout=1).ping()


@pytest.mark.parametrize(
    ("prompts", "options", "field"),
    [
        ([], {}, "prompts: empty"),
        ({"prompt": "one dict"}, {}, "prompts: expected a path or a list of prompts, got one dict"),
        (["fine", 3], {}, "prompts[1]: expected a string or a dict, got int"),
        ([{"prompt": float("nan")}], {}, "prompts[0]: not JSON data"),
        (["a"], {"batch_size": 0}, "batch_size: must be an integer"),
        (["a"], {"batch_size": "8"}, "batch_size: must be an integer"),
        (["a"], {"batch_size": None}, "batch_size or max_batch_tokens"),
        (["a"], {"max_batch_tokens": 0}, "max_batch_tokens: must be an integer"),
        (["a"], {"max_new_tokens": 0}, "max_new_tokens"),
        (["a"], {"temperature": -1}, "temperature"),
        (["a"], {"dtype": "int3"}, "dtype"),
        (["a"], {"job": "bad name!"}, "job: 1 to 32"),
        (["a"], {"strict": "yes"}, "strict: must be True or False"),
        (["a"], {"chat": 1}, "chat: must be True or False"),
        (["a"], {"colour": "red"}, "colour: unknown option"),
    ],
)
def test_bad_arguments_name_the_field_at_fault(
    prompts: Any, options: dict[str, Any], field: str, tiny_model_path: Path
) -> None:
    with pytest.raises(ConfigError) as raised:
        job_request(prompts, tiny_model_path, **options)
    assert str(raised.value).startswith(field), raised.value


@pytest.mark.parametrize(
    ("prompts", "options", "field"),
    [
        ("no-such-file.jsonl", {}, "input no-such-file.jsonl: no such file"),
        (["fine", {"prompt": "x", "extra": 1}], {"strict": True}, "input <prompts>: a bad line: line 2: unknown"),
        (["a"], {"model": "./no-such-model"}, "model ./no-such-model: no such file or directory"),
        (["a"], {"model": ""}, "model: expected"),
        (["a"], {"out": "no-such-folder/out.jsonl"}, "out no-such-folder/out.jsonl: folder no-such-folder"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    prompts: Any,
    options: dict[str, Any],
    field: str,
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    database = tmp_path / "store.db"
    local = Settings(database_url=f"sqlite:///{database}")
    options = {"model": tiny_model_path, **options}
    with pytest.raises(ConfigError) as raised:
        fedqueue.llm.run(prompts, settings=local, procs=1, **options)
    assert str(raised.value).startswith(field), raised.value
    assert not database.exists()  # refused before the store was made (and so before any worker started)


def test_submit_needs_a_broker_and_get_job_finds_only_llm_jobs(tmp_path: Path, tiny_model_path: Path) -> None:
    database = tmp_path / "store.db"
    local = Settings(database_url=f"sqlite:///{database}")
    with pytest.raises(ConfigError, match="FEDQUEUE_BROKER_URL: not set"):
        fedqueue.llm.submit(["a"], tiny_model_path, settings=local)
    assert not database.exists()
    store = open_store(local.database_url, migrate=True)
    store.create_run("an-fl-run", "digits", {}, 1, kind="fl", broker_id="b")
    store.close()
    with pytest.raises(NotFound):
        fedqueue.llm.get_job("nope", local)
    with pytest.raises(ConfigError, match="an-fl-run: a run of kind 'fl', not an LLM job"):
        fedqueue.llm.get_job("an-fl-run", local)


def test_the_request_from_python_prompts_is_the_file_they_stand_for(tmp_path: Path, tiny_model_path: Path) -> None:
    """The same prompts as a list or as a JSONL file: the same bytes, so the same job id (and resume)."""
    items: list[str | dict[str, Any]] = ["plain", {"id": 2, "messages": [{"role": "user", "content": "hi"}]}]
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "plain"}\n{"id": 2, "messages": [{"role": "user", "content": "hi"}]}\n')
    from_list, from_file = job_request(items, tiny_model_path), job_request(path, tiny_model_path)
    assert from_list.read_input() == from_file.read_input()
    assert from_list.read_prompts(from_list.read_input()) == from_file.read_prompts(from_file.read_input())
    assert from_list.model == str(tiny_model_path.resolve()) and from_list.input_path.name == "<prompts>"
