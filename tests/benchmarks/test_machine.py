"""benchmarks/machine.py: the machine line every benchmark prints, and the instruction-set caps it reports."""

from __future__ import annotations

import pytest

from benchmarks import machine


@pytest.fixture
def no_caps(monkeypatch):
    for name in (*machine.CAP_VARIABLES, "XLA_FLAGS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_describe_names_processor_cores_and_flags(no_caps):
    m = machine.describe()
    assert m["processor"] and m["cores"] >= 1
    assert set(m["flags"]) <= set(machine.FLAGS)
    assert m["isa_caps"] == {}
    assert "capped" not in machine.line()
    if m["cpu_id"]:  # Linux: the numbers that name the generation behind a VM's generic model name
        assert m["cpu_id"].startswith("family ") and " model " in m["cpu_id"] and f"({m['cpu_id']})" in machine.line()


def test_caps_are_reported_and_other_xla_flags_are_not(no_caps):
    no_caps.setenv("ATEN_CPU_CAPABILITY", "avx2")
    no_caps.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    no_caps.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_max_isa=AVX2")
    assert machine.isa_caps() == {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
    }
    assert machine.line().endswith(
        "libraries capped: ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 XLA_FLAGS=--xla_cpu_max_isa=AVX2"
    )


def test_an_xla_flags_without_a_cap_is_no_cap(no_caps):
    no_caps.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert machine.isa_caps() == {}
