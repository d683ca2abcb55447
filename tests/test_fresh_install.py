"""A newcomer's machine: `make run`'s install (`.[dev,models]` and nothing else, by the
Makefile's own steps) in a new virtual environment, then SmolLM2 converted into empty caches.

The environment the rest of the suite runs in has every extra installed, and veRL brings
packages `[models]` needs without listing them (accelerate was one): only a venv of its own
shows what `make run` alone installs. pip's download cache is shared, so this costs the
install, not the downloads; a cache of packages cannot stand in for a missing requirement.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentcore_rollout.local.models import MARKER

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(1200)
def test_make_runs_install_alone_converts_the_model_into_an_empty_cache(tmp_path):
    venv = tmp_path / "venv"
    make = ["make", "-C", str(ROOT), f"VENV={venv}", f"{venv}/.models"]
    installed = subprocess.run(make, capture_output=True, text=True, timeout=1100)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]
    env = {
        **os.environ,
        "AGENTCORE_ROLLOUT_CACHE": str(tmp_path / "models"),
        "HF_HOME": str(tmp_path / "hf"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",  # nothing is fetched at run time
    }
    convert = (
        "from agentcore_rollout.local.models import ready_model;"
        "print(ready_model('smollm2-135m-instruct'))"
    )
    done = subprocess.run(
        [venv / "bin/python", "-c", convert], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    model = Path(done.stdout.strip().splitlines()[-1])
    assert model.parent == tmp_path / "models"
    assert json.loads((model / MARKER).read_text())  # written last: the conversion finished
    weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    assert weights > 500_000_000  # float32: 134.5 M parameters, 4 bytes each
