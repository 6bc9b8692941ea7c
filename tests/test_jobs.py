"""The jobs that cross a process boundary: each a dataclass with its defaults written once, the
session config travelling as itself and turned into JSON only in the job file. No native code."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pyllama_dflash.harness.engine import schedule, schedule_job, search
from pyllama_dflash.harness.engine.schedule import Schedule
from pyllama_dflash.harness.engine.schedule_job import ReplayJob, SearchJob
from pyllama_dflash.harness.scenarios.scenario_job import ScenarioJob
from pyllama_dflash.harness.slotloop.config import DEFAULT_CONFIG, SessionConfig
from pyllama_dflash.harness.slotloop.models import ModelSet
from pyllama_dflash.lab.bench.job import TASKS, BatchCost, BenchJob, BindingsFill, FillCurve, RoundCosts, SpecLoop

MODELS = ModelSet(Path("/m/target.gguf"), Path("/m/draft.gguf"), Path("/m/mmproj.gguf"), Path("/m/twin.gguf"))
CONFIG = dataclasses.replace(DEFAULT_CONFIG, n_batch=32, draft_n_ubatch=8, server_saves_draft=True)
SCHEDULE = Schedule(1, [{"op": "prompt", "seq": 0, "parts": ["tree "]}, {"op": "generate", "seq": 0, "n": 4}])


def _through_a_file(job):
    """What the child reads: the job's JSON, written and read back as text."""
    return json.loads(json.dumps(job.to_json()))


@pytest.mark.parametrize(
    "job",
    [
        ScenarioJob("S1", "full", MODELS),
        ScenarioJob("S3", "baseline", MODELS, CONFIG, backend="cpu", check_exact=False, twin=True),
        SearchJob("full", MODELS),
        SearchJob("full", MODELS, CONFIG, examples=7, ignore=("drift",), drafters=("dflash2",), targets=("moe",)),
        ReplayJob("slots", MODELS, SCHEDULE),
        ReplayJob("slots", MODELS, SCHEDULE, CONFIG, exact=False, drift=False),
    ],
    ids=lambda job: type(job).__name__,
)
def test_each_job_comes_back_from_its_json_as_itself(job):
    d = _through_a_file(job)
    back = type(job).from_json(d)
    if isinstance(job, ScenarioJob):  # the parent's timeout is not the child's to know
        back = dataclasses.replace(back, timeout_s=job.timeout_s)
    else:
        assert schedule_job.from_json(d) == back
    assert back == job
    assert isinstance(back.config, SessionConfig)


@pytest.mark.parametrize(
    "task",
    [
        SpecLoop(),
        SpecLoop(n_tokens=8, repeats=1),
        FillCurve((3, 6), draft="swa"),
        BindingsFill(n_embd=(64,)),
        BatchCost("/m/target.gguf", sizes=(1, 4)),
        RoundCosts("/m/target.gguf", "/m/draft.gguf", rounds=3),
    ],
)
def test_a_bench_job_comes_back_from_its_json_as_itself(task):
    job = BenchJob("full", task)
    d = _through_a_file(job)
    assert d["task"] == task.TASK and TASKS[d["task"]] is type(task)
    assert BenchJob.from_json(d) == job
    # what a job file leaves out is the task's own default, written once in the dataclass
    assert BenchJob.from_json({"variant": "full", "task": "spec_loop"}) == BenchJob("full", SpecLoop())


def test_the_session_config_refuses_a_field_it_does_not_know():
    assert SessionConfig.from_json(CONFIG.to_json()) == CONFIG
    with pytest.raises(ValueError, match="n_bacth"):
        SessionConfig.from_json({**CONFIG.to_json(), "n_bacth": 4})
    with pytest.raises(ValueError, match="unknown mode 'bench'"):
        schedule_job.from_json({"mode": "bench"})


def test_the_defaults_are_written_once():
    # the schedules' batch limit is the session's n_batch, not a copy of it
    assert schedule.N_BATCH == SessionConfig.n_batch == DEFAULT_CONFIG.n_batch
    # search() takes the job, so its defaults are the job's
    assert list(_parameters(search.search)) == ["job", "reference"]
    # a job's config is SessionConfig's defaults unless given
    for job in (ScenarioJob("S1", "full", MODELS), SearchJob("full", MODELS), ReplayJob("full", MODELS, SCHEDULE)):
        assert job.config == SessionConfig()


def test_a_schedule_sets_its_own_sizes_on_the_config_it_is_given():
    s = Schedule(2, SCHEDULE.steps, draft_n_ubatch=4, drafting={"n_max": 2})
    cfg = s.session_config(CONFIG)
    assert (cfg.n_seq, cfg.draft_n_batch, cfg.draft_n_ubatch, cfg.n_max) == (2, 4, 4, 2)
    assert (cfg.n_batch, cfg.server_saves_draft) == (CONFIG.n_batch, True)


def _parameters(fn):
    import inspect

    return inspect.signature(fn).parameters


def test_the_codec_reads_paths_tuples_and_nones_back_and_names_a_field_it_does_not_know():
    d = _through_a_file(MODELS)
    assert d["twin"] == "/m/twin.gguf" and d["draft_swa"] is None
    assert ModelSet.from_json(d) == MODELS
    with pytest.raises(ValueError, match="ModelSet: unknown field.s. extar"):
        ModelSet.from_json({**d, "extar": 1})
