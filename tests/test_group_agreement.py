"""What the ranks of a group must agree on: the schema flags each such setting once
(FieldInfo::mustAgree), and Python and the knob reference show the flag.
"""

from __future__ import annotations

import pytest

import ucxbackend

pytestmark = pytest.mark.skipif(
    not ucxbackend.is_available(),
    reason=f"ucxbackend._C not built ({ucxbackend.load_error()}); run `make build`",
)


def test_must_agree_is_in_the_schema() -> None:
    """One flag per Field says which settings must agree; Python, and the reference, show it."""
    from ucxbackend import _C, config_reference
    from ucxbackend import config as cfg

    rows = _C.config.schema()
    flagged = {r["name"] for r in rows if r["must_agree"]}
    algos = {f"algo_{op}" for op in cfg.ALGORITHMS}
    # udp_config is flagged for the udp_config keys flagged in their own table.
    assert flagged == {"transport", "chunk_bytes", "udp_config", *algos}, flagged
    assert {k for k, knob in cfg.KNOBS.items() if knob.must_agree} == flagged - {"transport"}
    udp_flagged = {r["name"] for r in _C.udp.config_schema() if r["must_agree"]}
    assert udp_flagged == {"unexpected_bytes", "eager_max_bytes", "max_message_bytes"}
    assert not any(r["must_agree"] for r in _C.udp.fault_schema())
    reference = config_reference.render()
    assert "| `chunk_bytes` | `UCXBACKEND_CHUNK_BYTES` | `4194304` | yes |" in reference
    assert "| `spin_us` | `UCXBACKEND_SPIN_US` | `250` | no |" in reference
    assert "| `unexpected_bytes` | `1048576` | yes |" in reference
