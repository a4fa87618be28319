"""The test run's own compile-time settings (tests/conftest.py): what a child that claims the default compiler gets,
and the probe that keeps an unknown XLA flag from aborting every test process."""

from __future__ import annotations

from tests.conftest import XLA_EMITTER_FLAG, _xla_takes, default_compiler_flags


def test_default_compiler_flags_strip_only_the_runs_own_settings():
    flags = f"--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0 {XLA_EMITTER_FLAG}"
    assert default_compiler_flags(flags) == "--xla_force_host_platform_device_count=4"
    assert default_compiler_flags("--xla_cpu_max_isa=AVX2") == "--xla_cpu_max_isa=AVX2"
    assert default_compiler_flags("") == ""


def test_a_flag_xla_does_not_know_is_refused_by_the_probe():
    assert not _xla_takes("--xla_no_such_flag_in_any_build=true")  # XLA aborts on it: the child fails
    assert _xla_takes("--xla_backend_optimization_level=0")
