"""Harbor task folders in veRL's data config (`data.custom_cls`): veRL's own loader makes
`HarborTasks` from `data.train_files`, and each item carries, in `extra_info`, the payload
`agentcore-rollout run` would send for its task."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import get_dataset_class

from agentcore_rollout.harbor.tasks import read_tasks, task_payload

from .test_harbor_tasks import _task

pytestmark = pytest.mark.unit


def test_task_folders_are_a_veRL_dataset_by_its_own_config(tmp_path):
    tasks = tmp_path / "tasks"
    _task(tasks, "one", '[verifier]\nenv = { A = "1" }\n')
    _task(tasks, "two", '[verifier]\nenv = { B = "2" }\n')  # tables Arrow would merge
    data = OmegaConf.create(
        {
            "custom_cls": {
                "path": "pkg://agentcore_rollout.integrations.verl.harbor",
                "name": "HarborTasks",
            },
            "max_prompt_length": 64,
        }
    )
    dataset = get_dataset_class(data)([str(tasks)], tokenizer=None, config=data)
    assert len(dataset) == 2
    expected = [task_payload(t) for t in read_tasks(tasks)]
    for i, want in enumerate(expected):
        item = dataset[i]
        assert item["raw_prompt"] == [{"role": "user", "content": want["instruction"]}]
        assert item["extra_info"] == {**want, "index": i}  # its env alone, no other's nulls
        json.dumps(item["extra_info"])  # the agent loop's payload: a JSON object
