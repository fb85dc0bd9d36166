"""A setting that means on/off reads YAML's booleans: `disaggregation: off` unquoted is `off`."""

from __future__ import annotations

import pytest

from fleetwise.errors import SpecError
from fleetwise.spec.planning import load_planning_spec

SPEC = """\
name: yaml-booleans
model: llama-3.1-8b
accelerators: [{{name: h100-sxm}}]
workload: {{rate_rps: 3, prompt_tokens: {{kind: fixed, tokens: 600}}, output_tokens: {{kind: fixed, tokens: 64}}}}
slo: {{ttft_s: 0.6, tpot_s: 0.03}}
search: {{disaggregation: {value}, heterogeneous: {hetero}}}
"""


@pytest.mark.parametrize("value,expected", [("off", "off"), ("no", "off"), ("false", "off"), ("Off", "off"),
                                            ("'off'", "off"), ("on", "auto"), ("yes", "auto"), ("true", "auto"),
                                            ("auto", "auto"), ("only", "only")])
def test_disaggregation_reads_yaml_booleans(tmp_path, value, expected):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(value=value, hetero="off"), encoding="utf-8")
    spec = load_planning_spec(str(p))
    assert spec.search.disaggregation == expected
    assert spec.search.heterogeneous is False


def test_other_values_are_still_one_line_naming_the_field(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(value="sometimes", hetero="on"), encoding="utf-8")
    with pytest.raises(SpecError) as err:
        load_planning_spec(str(p))
    msg = str(err.value)
    assert "search.disaggregation" in msg and "sometimes" in msg and "\n" not in msg
