"""Submitting a pipeline: read the items, record each with its first call, open the lanes, send their tasks.

The program is imported here first: one that does not import, or is no generator function, is refused before
anything is written. Submitting the same items, program, model and settings again continues the pipeline:
items and steps stored are kept, and the lanes' tasks are sent again (a task already run stores nothing).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedqueue.core.runs.cancel import CANCELLED
from fedqueue.core.services import Services
from fedqueue.core.waits.outage import run_stored
from fedqueue.errors import ConfigError, NotFound
from fedqueue.llm.job import DEFAULT_BATCH_SIZE, JOB_ID
from fedqueue.llm.messages import KEY_MAX, KIND_NAME
from fedqueue.llm.pipelines.config import PipelineConfig
from fedqueue.llm.pipelines.messages import LANES_MAX, PipelineLane
from fedqueue.llm.pipelines.program import load_program
from fedqueue.llm.pipelines.replay import DEFAULT_MAX_STEPS, NextCall, advance
from fedqueue.llm.pipelines.rows import call_row, ended, insert_items, open_lanes, pipeline_counts
from fedqueue.llm.planner import DEFAULT_SLOTS
from fedqueue.llm.prompts import read_input
from fedqueue.llm.settings import GenerationSettings

MAX_STEPS_LIMIT = 10_000


@dataclass(frozen=True)
class ItemLine:
    key: str  # "id:ID" or "line:N"
    input_id: str | int | None
    line: int
    item: Any  # the line's JSON value, as the program gets it


@dataclass(frozen=True)
class PipelineRequest:
    input_path: Path
    program: str
    model: str
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    max_steps: int = DEFAULT_MAX_STEPS
    batch_size: int = DEFAULT_BATCH_SIZE
    job: str | None = None
    lanes: int | None = None  # the worker slots the calls run on (DEFAULT_SLOTS when None)
    input_data: bytes | None = None  # the items' bytes where given in Python; `input_path` then names them

    def read_input(self) -> bytes:
        return read_input(self.input_path) if self.input_data is None else self.input_data

    def config(self, input_sha256: str) -> dict[str, Any]:
        return {
            "program": self.program,
            "model": self.model,
            "generation": self.generation.to_dict(),
            "max_steps": self.max_steps,
            "batch_size": self.batch_size,
            "lanes": min(LANES_MAX, self.lanes or DEFAULT_SLOTS),
            "input": self.input_path.name,
            "input_sha256": input_sha256,
        }


@dataclass(frozen=True)
class SubmittedPipeline:
    job_id: str
    resumed: bool
    items: int
    running: int  # items with a call to make
    lanes: int


def check_pipeline(request: PipelineRequest, option: Callable[[str], str] = str) -> list[ItemLine]:
    """Everything that can be wrong before anything is written: the program, the limits, every item line.
    `option` spells a field as the caller's user knows it (`--max-steps` or `max_steps`)."""
    load_program(request.program, option("program"))
    for name, value, high in (
        ("max_steps", request.max_steps, MAX_STEPS_LIMIT),
        ("batch_size", request.batch_size, 100_000),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
            raise ConfigError(f"{option(name)}: must be an integer from 1 to {high}")
    if request.job is not None and not JOB_ID.fullmatch(request.job):
        raise ConfigError(f"{option('job')}: 1 to 32 letters, digits, '_', '.' or '-', starting with a letter or digit")
    return read_items(request.read_input(), request.input_path)


def read_items(raw: bytes, path: Path) -> list[ItemLine]:
    """One item per non-blank JSONL line (any JSON value; an object's `id` names it); a bad line refuses all."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ConfigError(f"input {path}: not UTF-8 text (byte {error.start})") from None
    items: list[ItemLine] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(f"input {path}: line {number}: not valid JSON ({error.msg})") from None
        input_id = value.get("id") if isinstance(value, dict) else None
        if input_id is not None and (isinstance(input_id, bool) or not isinstance(input_id, str | int)):
            raise ConfigError(f"input {path}: line {number}: id: must be a string or an integer")
        key = f"line:{number}" if input_id is None else f"id:{input_id}"
        if len(key) > KEY_MAX:
            raise ConfigError(f"input {path}: line {number}: id: longer than {KEY_MAX - 3} characters")
        if key in seen:
            raise ConfigError(f"input {path}: line {number}: id {input_id!r} was used before, on line {seen[key]}")
        seen[key] = number
        items.append(ItemLine(key, input_id, number, value))
    if not items:
        raise ConfigError(f"input {path}: no items in it (every line is blank)")
    return items


def pipeline_id(request: PipelineRequest, input_sha256: str) -> str:
    if request.job is not None:
        return request.job
    decided_by = {k: v for k, v in request.config(input_sha256).items() if k not in ("input", "lanes")}
    return "pipe-" + hashlib.sha256(json.dumps(decided_by, sort_keys=True).encode()).hexdigest()[:12]


def submit_pipeline(services: Services, request: PipelineRequest) -> SubmittedPipeline:
    """Record the pipeline (or find it), add its items with their first calls, and send each lane's task."""
    items = check_pipeline(request)
    raw = request.read_input()
    input_sha256 = hashlib.sha256(raw).hexdigest()
    job_id = pipeline_id(request, input_sha256)
    resumed = _open(services, job_id, request.config(input_sha256))
    config = PipelineConfig.of_run(services.store.get_run(job_id).config)
    program = load_program(request.program)
    now = time.time()
    with run_stored(job_id):  # the broker failing from here leaves the pipeline for its repair pass
        item_rows, first_calls = [], []
        for item in items:
            row: dict[str, Any] = {
                "run_id": job_id,
                "key": item.key,
                "input_id": item.input_id,
                "line": item.line,
                "item": item.item,
                "state": "running",
                "steps": 0,
            }
            start = advance(program, item.item, [], config.max_steps)
            if isinstance(start, NextCall):
                first_calls.append(call_row(job_id, item.key, start, config.length(start.request)))
            else:
                row.update(ended(start, now))
            item_rows.append(row)
        insert_items(services.store, _uniform(item_rows), first_calls)
        running = pipeline_counts(services.store, job_id).get("running", 0)
        if running == 0:
            services.store.finish_run(job_id, "finished")
            return SubmittedPipeline(job_id, resumed, len(items), 0, config.lanes)
        services.store.reopen_run(job_id)
        lanes = open_lanes(services.store, job_id, config.lanes)
        services.enqueue([PipelineLane(job_id, lane, seq, now) for lane, seq in lanes])
    return SubmittedPipeline(job_id, resumed, len(items), running, len(lanes))


def _uniform(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One insert statement for many rows needs every row to name the same columns."""
    columns = sorted({column for row in rows for column in row})
    return [{column: row.get(column) for column in columns} for row in rows]


def _open(services: Services, job_id: str, config: dict[str, Any]) -> bool:
    """Create the pipeline's run row, or check that the one there is this pipeline; True when it was there."""
    try:
        run = services.store.get_run(job_id)
    except NotFound:
        services.store.create_run(
            job_id, config["input"][:200], config, 0, kind=KIND_NAME, broker_id=services.ledger.broker_id()
        )
        return False
    if run.kind != KIND_NAME or "program" not in run.config:
        raise ConfigError(f"--job {job_id}: that id belongs to a run that is not a pipeline; choose another")
    if run.state == CANCELLED:
        raise ConfigError(f"pipeline {job_id} was cancelled; use another --job to run it again")
    for setting in ("program", "model", "generation", "max_steps"):
        if run.config.get(setting) != config.get(setting):
            raise ConfigError(
                f"pipeline {job_id}: submitted before with another {setting} "
                f"({json.dumps(run.config.get(setting))}); use another --job to run these settings"
            )
    return True
