"""bench/warm.py's limit and its durations: the figures its target is measured against."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_warm", ROOT / "bench" / "warm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_limit_invokes_in_the_order_submitted_at_the_call_rate():
    bench = _load_bench()
    # in the order submitted: 1 at 0 s, 10 at 0.5 s, 9 at 1 s: the 10 s one ends last
    assert bench.bound([1.0, 10.0, 9.0], rate=2.0) == pytest.approx(10.5)
    # longest first: 10 at 0 s, 9 at 0.5 s, 1 at 1 s
    assert bench.bound([1.0, 10.0, 9.0], rate=2.0, longest_first=True) == pytest.approx(10.0)
    assert bench.bound([1.0, 9.8, 9.9], rate=2.0, longest_first=True) == pytest.approx(10.3)
    assert bench.bound([3.0], rate=25.0, delay=15.0) == pytest.approx(18.0)  # the cold start


def test_durations_are_seeded_lognormal_and_capped():
    bench = _load_bench()
    drawn = bench.durations(2048, 0)
    assert drawn == bench.durations(2048, 0) != bench.durations(2048, 1)
    assert max(drawn) == bench.CAP_S and min(drawn) > 0
    assert 2.5 < sorted(drawn)[len(drawn) // 2] < 3.5  # median 3 s
