"""Generate docs/policies/*.md (one page per routing preset) from the parameter models.

Usage: python3 scripts/gen_policy_docs.py [OUT_DIR]   (default: docs/policies)
Everything comes from `fleetwise.spec.routing`: the preset compositions, their summaries and
every field's type, default and docstring, so the pages cannot drift from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from fleetwise.spec.routing import (
    DEFAULT_POLICY,
    PRESET_SUMMARIES,
    PRESETS,
    RoutingSpec,
    SafeModeSpec,
    preset_params,
)


def rows(model: BaseModel, prefix: str = "") -> list[str]:
    """One table row per leaf field: name, value in this preset, description."""
    out = []
    for name, field in type(model).model_fields.items():
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            out += rows(value, f"{key}.")
            continue
        doc = (field.description or "").replace("\n", " ").replace("|", "\\|")
        shown = json.dumps(value if not isinstance(value, tuple) else list(value))
        out.append(f"| `{key}` | `{shown}` | {doc} |")
    return out


def page(name: str) -> str:
    params = preset_params(name)
    lines = [
        f"# `{name}`{' (default)' if name == DEFAULT_POLICY else ''}",
        "",
        PRESET_SUMMARIES.get(name, ""),
        "",
        "Composition (overrides of `PolicyParams` defaults):",
        "",
        "```yaml",
        f"routing:\n  policy: {name}\n  params: {json.dumps(PRESETS[name])}",
        "```",
        "",
        "Pipeline: filters -> load bound (if enabled) -> weighted scorers in [0, 1] -> picker. "
        "See `fleetwise.routing.policy` for the steps and `fleetwise.spec.routing` for the models.",
        "",
        "## Parameters",
        "",
        "| parameter | value | meaning |",
        "|---|---|---|",
        *rows(params),
        "",
        "## Safe mode (`routing.safe_mode`, shared by every policy)",
        "",
        "| parameter | default | meaning |",
        "|---|---|---|",
        *rows(SafeModeSpec()),
        "",
    ]
    return "\n".join(lines)


def main(out_dir: str = "docs/policies") -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    index = ["# Routing policies", "", f"Default: `{DEFAULT_POLICY}`. Select one in a plan with "
             "`routing: {policy: NAME, params: {...}, safe_mode: {...}}` (`RoutingSpec`).", "",
             "| policy | summary |", "|---|---|"]
    for name in PRESETS:
        (out / f"{name}.md").write_text(page(name), encoding="utf-8")
        index.append(f"| [`{name}`]({name}.md) | {PRESET_SUMMARIES.get(name, '')} |")
    index += ["", "Routing-spec fields:", "", "| field | meaning |", "|---|---|"]
    index += [f"| `{k}` | {(f.description or '').replace(chr(10), ' ')} |" for k, f in RoutingSpec.model_fields.items()]
    (out / "README.md").write_text("\n".join(index) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:2])
