"""Numbers in exponent form read as numbers: YAML 1.1 (PyYAML) reads `25.757e9` and `1e3` as text,
so a card file written `hbm_bytes: 25.757e9` was refused as "a number in quotes" it never had."""

from __future__ import annotations

import pytest

from fleetwise.errors import SpecError
from fleetwise.spec.catalog import resolve_gpu
from fleetwise.spec.inputs import parse_yaml

CARD = """\
name: rtx-4090
vendor: nvidia
hbm_bytes: 25.757e9
hbm_bytes_per_s: 1.008E+12
flops_per_s: {bf16: 165e12}
intra_node_link: {name: PCIe4, bandwidth_bytes_per_s: 25e9, latency_s: 1e-5}
gpus_per_node: 1
network: {bandwidth_bytes_per_s: 3.125e9}
"""


@pytest.mark.parametrize(("text", "value"), [
    ("1e3", 1000.0), ("25.757e9", 25.757e9), ("-2.5E-3", -0.0025), ("+1e+2", 100.0), (".5e1", 5.0),
    ("1.5e-3", 0.0015), ("12", 12), ("1.5", 1.5), ("'1e3'", "1e3"), ("1e", "1e"), ("e3", "e3"), ("v1e3", "v1e3"),
])
def test_exponent_numbers_are_floats_and_the_rest_is_unchanged(text: str, value: object) -> None:
    got = parse_yaml(f"x: {text}\n", "t.yaml")["x"]
    assert got == value and type(got) is type(value)


def test_a_card_file_in_exponent_form_loads(tmp_path) -> None:
    p = tmp_path / "rtx4090.yaml"
    p.write_text(CARD, encoding="utf-8")
    card = resolve_gpu(str(p))
    assert (card.hbm_bytes, card.hbm_bytes_per_s, card.bf16_flops) == (25.757e9, 1.008e12, 165e12)
    assert card.intra_node_link.latency_s == 1e-5


def test_an_exponent_past_a_float_is_still_refused() -> None:
    with pytest.raises(SpecError, match="not a finite number"):
        parse_yaml("x: 1e999\n", "t.yaml")
