"""--workers auto: the CPUs a process may use, from its affinity mask and cgroup quota."""

from __future__ import annotations

from pathlib import Path

import pytest

from trident.cluster.cpus import available_cpus, cgroup_quotas, cpus_from, parse_cpu_max, quota_cpus


@pytest.mark.parametrize(("quota", "period", "cpus"), [(200_000, 100_000, 2.0), (50_000, 100_000, 0.5),
                                                       (-1, 100_000, None), (None, 100_000, None),
                                                       (100_000, 0, None)])
def test_quota_cpus(quota, period, cpus):
    assert quota_cpus(quota, period) == cpus


@pytest.mark.parametrize(("affinity", "quotas", "workers"), [
    (8, [], 8), (8, [2.0], 2), (8, [1.5], 1), (8, [0.5], 1), (2, [4.0], 2), (16, [8.0, 3.0], 3), (0, [], 1)])
def test_the_smallest_limit_wins_rounded_down_never_zero(affinity, quotas, workers):
    assert cpus_from(affinity, quotas) == workers


@pytest.mark.parametrize(("text", "cpus"), [("max 100000", None), ("150000 100000", 1.5), ("200000", 2.0),
                                            ("", None), ("garbage here", None)])
def test_cgroup_v2_cpu_max(text, cpus):
    assert parse_cpu_max(text) == cpus


def test_cgroup_v2_quota_along_the_path(tmp_path: Path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    pod = tmp_path / "kubepods" / "pod1"
    pod.mkdir(parents=True)
    (tmp_path / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (pod / "cpu.max").write_text("250000 100000\n")
    assert sorted(cgroup_quotas(tmp_path, "0::/kubepods/pod1\n")) == [2.5, 4.0]


def test_cgroup_v1_quota(tmp_path: Path):
    cpu = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("300000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quotas(tmp_path, "4:cpu,cpuacct:/docker/abc\n1:memory:/docker/abc\n") == [3.0]


def test_nothing_readable_is_no_quota(tmp_path: Path):
    assert cgroup_quotas(tmp_path, "garbage\n") == []
    assert cgroup_quotas(tmp_path / "missing", "0::/\n") == []


def test_this_machine():
    import os

    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
