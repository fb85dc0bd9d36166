"""docs/policies/ is generated from the parameter models and must match them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_policy_docs_are_current(tmp_path):
    spec = importlib.util.spec_from_file_location("gen_policy_docs", ROOT / "scripts" / "gen_policy_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(str(tmp_path))
    for page in sorted(tmp_path.iterdir()):
        committed = ROOT / "docs" / "policies" / page.name
        assert committed.read_text(encoding="utf-8") == page.read_text(encoding="utf-8"), (
            f"{committed} is stale: run python3 scripts/gen_policy_docs.py"
        )
