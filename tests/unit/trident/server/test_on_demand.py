"""The decisions of trident.server.on_demand: which models leave for a new one, which options are refused."""

from __future__ import annotations

import re

import pytest

from trident.cli import build_parser, options_from_args
from trident.options import ServerOptions
from trident.server.on_demand import OnDemand, Resident, choose_evictions, options_problem


def _r(name: str, used: int, idle: bool = True, size: int = 0) -> Resident:
    return Resident(name, used, idle, size)


def test_below_the_count_budget_nothing_leaves() -> None:
    assert choose_evictions([_r("a", 1), _r("b", 2)], 3, None, 0) == ([], True)


def test_at_the_count_budget_the_least_recently_used_idle_model_leaves() -> None:
    resident = [_r("a", 5), _r("b", 1, idle=False), _r("c", 3), _r("d", 9)]
    assert choose_evictions(resident, 4, None, 0) == (["c"], True)  # b is older but busy
    assert choose_evictions(resident, 3, None, 0) == (["c", "a"], True)
    assert choose_evictions(resident, 2, None, 0) == (["c", "a", "d"], True)
    assert choose_evictions(resident, 1, None, 0) == (["c", "a", "d"], False)  # b is still busy


def test_when_every_model_is_busy_the_load_waits() -> None:
    assert choose_evictions([_r("a", 1, idle=False), _r("b", 2, idle=False)], 2, None, 0) == ([], False)
    assert choose_evictions([_r("a", 1, idle=False), _r("b", 2)], 1, None, 0) == (["b"], False)


def test_a_memory_budget_counts_the_incoming_model() -> None:
    resident = [_r("a", 1, size=40), _r("b", 2, size=30), _r("c", 3, size=20)]
    assert choose_evictions(resident, None, 100, 10) == ([], True)
    assert choose_evictions(resident, None, 100, 25) == (["a"], True)
    assert choose_evictions(resident, None, 100, 75) == (["a", "b"], True)
    # a model larger than the whole budget still loads once nothing else is left
    assert choose_evictions(resident, None, 100, 500) == (["a", "b", "c"], True)
    assert choose_evictions([*resident[:2], _r("c", 3, idle=False, size=20)], None, 100, 500) == (["a", "b"], False)


def test_sizes_err_towards_unloading() -> None:
    od = OnDemand(ServerOptions(model_control_mode="explicit", model_load_on_demand=True, model_budget_count=2))
    assert od.estimate("a") == 0
    od.measured("a", 100)
    od.measured("b", 3)  # reused memory an unload freed: counted as the mean of the others
    assert od.sizes == {"a": 100, "b": 100}
    od.measured("a", -5)
    assert od.sizes["a"] == 100


@pytest.mark.parametrize(("fields", "words"), [
    ({"model_load_on_demand": True}, "needs --model-control-mode=explicit"),
    ({"model_control_mode": "explicit", "model_budget_memory": 1 << 30}, "needs --model-load-on-demand"),
    ({"model_control_mode": "explicit", "model_load_on_demand": True, "model_budget_count": 0}, "from 1 to"),
    ({"model_control_mode": "explicit", "model_load_on_demand": True, "model_budget_memory": 10}, "at least"),
    ({"model_control_mode": "explicit", "model_load_on_demand": True, "model_load_on_demand_timeout_secs": -1.0},
     "more than 0"),
    ({"model_control_mode": "explicit", "model_load_on_demand": True, "workers": 2}, "--workers"),
])
def test_bad_options_are_named(fields: dict, words: str) -> None:
    problem = options_problem(ServerOptions(**fields))
    assert problem is not None and words in problem


def test_good_options_pass() -> None:
    assert options_problem(ServerOptions()) is None
    assert options_problem(ServerOptions(model_control_mode="explicit", model_load_on_demand=True,
                                         model_budget_count=10, model_budget_memory=1 << 30)) is None


ON_DEMAND = ("--model-control-mode=explicit", "--model-load-on-demand=true")


@pytest.mark.parametrize(("flags", "message"), [
    ((*ON_DEMAND, "--model-budget-count=0"), "--model-budget-count must be from 1 to"),
    ((*ON_DEMAND, "--model-budget-count=-3"), "--model-budget-count must be from 1 to"),
    ((*ON_DEMAND, "--model-budget-count=10000000"), "--model-budget-count must be from 1 to"),
    ((*ON_DEMAND, "--model-budget-memory=0"), "--model-budget-memory must be at least"),
    ((*ON_DEMAND, "--model-budget-memory=-1M"), "--model-budget-memory must be at least"),
    ((*ON_DEMAND, "--model-budget-memory=1000000G"), "more than this machine's memory"),
    ((*ON_DEMAND, "--model-load-on-demand-timeout-secs=0"), "--model-load-on-demand-timeout-secs must be more than 0"),
    (("--model-load-on-demand=true",), "needs --model-control-mode=explicit"),
    (("--model-control-mode=poll", "--model-load-on-demand=true"), "needs --model-control-mode=explicit"),
    (("--model-control-mode=explicit", "--model-budget-count=5"), "--model-budget-count needs --model-load-on-demand"),
    ((*ON_DEMAND, "--workers=2"), "not supported with --workers"),
])
def test_the_command_line_refuses_bad_on_demand_flags(flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        options_from_args(build_parser().parse_args(["serve", *flags]))


@pytest.mark.parametrize("value", ["abc", "1.5.5G", ""])
def test_a_memory_budget_that_is_not_a_size_is_an_argument_error(value: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", *ON_DEMAND, f"--model-budget-memory={value}"])


def test_the_command_line_takes_on_demand_flags() -> None:
    o = options_from_args(build_parser().parse_args(
        ["serve", *ON_DEMAND, "--model-budget-count=10", "--model-budget-memory=512M",
         "--model-load-on-demand-timeout-secs=5"]))
    assert (o.model_load_on_demand, o.model_budget_count, o.model_budget_memory,
            o.model_load_on_demand_timeout_secs) == (True, 10, 512 << 20, 5.0)
