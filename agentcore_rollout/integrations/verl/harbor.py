"""Harbor task folders as a veRL dataset (`data.custom_cls`), so veRL's data config names task
folders as it names parquet files (docs/harbor.md#verl).

The payload is kept as JSON text in the frame and decoded per item, since Arrow would merge the
tasks' differing `env` tables into one schema, filling each other's keys with nulls. No prompt is
filtered for length: the agent writes its own prompts, not the instruction alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
from verl.utils.dataset.rl_dataset import RLHFDataset

from ...harbor.tasks import read_tasks, task_payload

_PAYLOAD = "harbor_payload"


class HarborTasks(RLHFDataset):
    """veRL's `RLHFDataset` over Harbor task folders (`data.train_files` / `val_files`)."""

    @property
    def _oracle(self) -> bool:
        """`+data.harbor_oracle=true`: rows carry their solutions, for the `oracle` agent (a
        pipeline check); otherwise no agent's session ever holds one."""
        return bool(self.config.get("harbor_oracle", False))

    def _read_files_and_tokenize(self) -> None:
        rows = [
            {
                self.prompt_key: [{"role": "user", "content": task.instruction}],
                "data_source": "harbor",
                _PAYLOAD: json.dumps(task_payload(task, solution=self._oracle)),
            }
            for source in self.data_files
            for task in read_tasks(Path(source))
        ]
        if self.max_samples > 0:
            rows = rows[: self.max_samples]
        self.dataframe = datasets.Dataset.from_list(rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        row["extra_info"] = {**json.loads(row.pop(_PAYLOAD)), "index": item}
        return row
