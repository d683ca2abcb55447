"""bench/scale.py's machinery at a tiny size, through the real wire: moto in server mode, the
fast AgentCore runtime and the engine each in their own process. Counts only, no wall times."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(90)
async def test_scale_bench_tiny_run(tmp_path: Path) -> None:
    bench = _load_bench()
    figures: dict[str, Any] = await bench.run(
        20, start_rate=200.0, result_rate=50.0, max_pending=10, quiet=True
    )

    assert figures["outcomes"] == {"ok": 20}
    assert figures["live_sessions"] == 20  # the engine's peak_live_sessions
    assert figures["runtime_peak_live"] == 20  # all 20 held open at once by the runtime
    stats = figures["engine_stats"]
    assert stats["invokes"] == stats["stops"] == stats["inline_results"] == 20
    # every result came in the agent's own message: no object is read
    assert stats["downloads"] == 0
    assert stats["s3_lookups"] == 0 and not stats["invoke_errors"]
    assert figures["api_calls_per_rollout"].get("s3:GetObject", 0) == 0

    public = {k: v for k, v in figures.items() if not k.startswith("_")}
    out = json.loads(json.dumps(public))  # what main() prints and writes
    for key in bench.KEYS:
        assert key in out
    assert set(out["handoff_s"]) >= {"p50", "p99"}
    assert 0 < out["handoff_s"]["p50"] <= out["handoff_s"]["p99"]
    assert out["engine_rss_mb_peak"] > 0 and out["engine_cpu_ms_per_rollout"] > 0
    assert set(out["engine_cpu_ms_per_rollout_by_phase"]) == {"start", "results"}
    assert isinstance(out["bottleneck"], str) and out["bottleneck"]
    bench.plot(figures, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").stat().st_size > 0

    children = {k: v for k, v in figures["_pids"].items() if v != os.getpid()}
    assert set(children) == {"engine", "moto", "runtime"}
    assert not [name for name, pid in children.items() if _alive(pid)]
