"""`benchmarks/plan_identity.py --keep`: a kept side's result is reused only while the sources and
the spec it was planned from are unchanged."""

from __future__ import annotations

import argparse
import json


def test_kept_result_is_replanned_when_the_sources_change(tmp_path, monkeypatch, load_benchmark):
    bench = load_benchmark("plan_identity")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("X = 1\n")
    keep = tmp_path / "keep"
    keep.mkdir()
    planned = []

    def fake_plan(src_, spec, out, workers, compiled=False):
        planned.append(src_)
        return {"doc": {"plans": [len(planned)]}, "cpu_s": 1.0, "wall_s": 1.0, "simulations": 1}

    monkeypatch.setattr(bench, "plan_one", fake_plan)
    a = argparse.Namespace(sides="head", workers=1, compiled="")
    first = bench._result(a, keep, "built-in", "head", src, None)
    assert bench._result(a, keep, "built-in", "head", src, None) == first and len(planned) == 1
    (src / "pkg" / "a.py").write_text("X = 2\n")
    again = bench._result(a, keep, "built-in", "head", src, None)
    assert len(planned) == 2 and again["doc"] == {"plans": [2]}
    assert json.loads((keep / "built-in.head.result.json").read_text())["fingerprint"] == again["fingerprint"]
    # A stale kept result of a side not planned now is not used.
    (src / "pkg" / "a.py").write_text("X = 3\n")
    assert bench._result(argparse.Namespace(sides="base", workers=1, compiled=""), keep, "built-in", "head",
                         src, None) == {}
