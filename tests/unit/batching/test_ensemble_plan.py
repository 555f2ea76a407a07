"""Ensemble plans: build_plan's dataflow and load-failure reasons, prune, reshape, and the
step-cycle check of config validation (find_cycle / validate_config)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trident.batching.ensemble_plan import (
    LATEST,
    EnsemblePlan,
    Signature,
    build_plan,
    dependencies,
    reshape,
)
from trident.config import complete_defaults, validate_config
from trident.config_validation import find_cycle
from trident.errors import Code, TritonError, not_found, unavailable
from trident.protocol.generated.inference import ModelConfig
from trident.protocol.pbtxt import parse_pbtxt

# ---------------------------------------------------------------- building blocks


@dataclass
class Model:
    """A loaded composing model version, as the plan sees it (satisfies ``Signature``)."""

    name: str
    version: int
    config: ModelConfig
    max_batch_size: int
    decoupled: bool


class Repo:
    """Loaded models by name and version; ``resolve`` as the repository answers it."""

    def __init__(self, *models: Model) -> None:
        self.models: dict[str, dict[int, Model]] = {}
        for m in models:
            self.models.setdefault(m.name, {})[m.version] = m

    def __call__(self, name: str, version: int) -> Signature:
        versions = self.models.get(name)
        if not versions:
            raise not_found(f"model '{name}' is not found")
        if version == LATEST:
            return versions[max(versions)]
        if version not in versions:
            raise unavailable(f"model '{name}' version {version} is not ready")
        return versions[version]


def tensor(kind: str, name: str, dims: Iterable[int] = (4,), dtype: str = "TYPE_FP32", *,
           optional: bool = False) -> str:
    flag = " optional: true" if optional else ""
    return f'{kind} {{ name: "{name}" data_type: {dtype} dims: [ {", ".join(str(d) for d in dims)} ]{flag} }} '


def model(name: str, inputs: Iterable[str] = ("x",), outputs: Iterable[str] = ("y",), *, mbs: int = 4,
          version: int = 1, decoupled: bool = False, extra: str = "") -> Model:
    """A composing model whose named inputs/outputs are FP32 [4] unless ``extra`` adds others."""
    text = f'name: "{name}" backend: "python" max_batch_size: {mbs} '
    text += "".join(tensor("input", i) for i in inputs) + "".join(tensor("output", o) for o in outputs) + extra
    config = parse_pbtxt(text)
    return Model(name, version, config, int(config.max_batch_size), decoupled)


def step(name: str, inputs: dict[str, str], outputs: dict[str, str], *, version: int | None = None) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in inputs.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outputs.items())
    pinned = f"model_version: {version} " if version is not None else ""
    return f'step {{ model_name: "{name}" {pinned}{maps}}} '


def ensemble(*steps: str, mbs: int = 4, io: str = "", extra: str = "") -> ModelConfig:
    """Ensemble ``e``; ``io`` defaults to one FP32 [4] input IN and one output OUT."""
    io = io or tensor("input", "IN") + tensor("output", "OUT")
    return parse_pbtxt(f'name: "e" platform: "ensemble" max_batch_size: {mbs} {io}'
                       f'ensemble_scheduling {{ {extra} {"".join(steps)} }}')


def fails(config: ModelConfig, repo: Repo) -> str:
    with pytest.raises(TritonError) as info:
        build_plan(config, repo)
    assert info.value.code is Code.INVALID_ARG
    return info.value.message


# ---------------------------------------------------------------- build_plan: success


def test_plan_of_a_two_step_chain() -> None:
    pre = model("pre")
    main = model("main", inputs=("a", "b"), outputs=("c",), mbs=8)
    config = ensemble(step("pre", {"x": "IN"}, {"y": "mid"}),
                      step("main", {"a": "mid", "b": "IN"}, {"c": "OUT"}))
    plan = build_plan(config, Repo(pre, main))
    assert isinstance(plan, EnsemblePlan)
    assert (plan.name, plan.max_batch_size) == ("e", 4)
    assert plan.inputs == ["IN"]
    assert plan.outputs == {"OUT": [4]}
    assert [s.index for s in plan.steps] == [0, 1]
    first, second = plan.steps
    assert (first.model_name, first.model_version, first.version_string) == ("pre", LATEST, "")
    assert first.inputs == {"x": "IN"} and first.outputs == {"y": "mid"}
    assert second.inputs == {"a": "mid", "b": "IN"} and second.outputs == {"c": "OUT"}
    assert first.batching and second.batching
    assert not first.decoupled and not second.decoupled
    assert second.input_dims == {"a": [4], "b": [4]}
    assert second.describe() == "step 1 (model 'main')"
    assert plan.consumers == {"IN": [0, 1], "mid": [1]}
    assert plan.producer == {"mid": 0, "OUT": 1}
    assert plan.decoupled is False
    assert plan.max_inflight_requests == 0


def test_decoupled_is_derived_from_the_steps() -> None:
    config = ensemble(step("d", {"x": "IN"}, {"y": "mid"}), step("f", {"x": "mid"}, {"y": "OUT"}),
                      extra="max_inflight_requests: 3")
    plan = build_plan(config, Repo(model("d", decoupled=True), model("f")))
    assert [s.decoupled for s in plan.steps] == [True, False]
    assert plan.decoupled is True
    assert plan.max_inflight_requests == 3


def test_a_pinned_version_is_resolved_and_kept() -> None:
    repo = Repo(model("a", version=1), model("a", version=2, mbs=2))
    config = ensemble(step("a", {"x": "IN"}, {"y": "mid"}, version=1), step("a", {"x": "mid"}, {"y": "OUT"}),
                      mbs=4)
    # step 0 takes the pinned version 1 (max_batch_size 4), step 1 the latest, 2 (max_batch_size 2)
    assert fails(config, repo) == (
        "ensemble e allows maximum batch size 4, but it contains model a which only allows maximum batch size to be 2"
    )
    config = ensemble(step("a", {"x": "IN"}, {"y": "mid"}, version=2), step("a", {"x": "mid"}, {"y": "OUT"}),
                      mbs=2)
    plan = build_plan(config, repo)
    assert [(s.model_version, s.version_string) for s in plan.steps] == [(2, "2"), (LATEST, "")]
    assert dependencies(config) == [("a", 2), ("a", LATEST)]


def test_dependencies_lists_each_model_version_once_in_step_order() -> None:
    config = ensemble(step("b", {"x": "IN"}, {"y": "p"}), step("a", {"x": "p"}, {"y": "q"}, version=3),
                      step("b", {"x": "q"}, {"y": "r"}), step("a", {"x": "r"}, {"y": "OUT"}, version=3))
    assert dependencies(config) == [("b", LATEST), ("a", 3)]


def test_an_optional_input_may_be_left_unmapped() -> None:
    opt = model("a", extra=tensor("input", "z", optional=True))
    plan = build_plan(ensemble(step("a", {"x": "IN"}, {"y": "OUT"})), Repo(opt))
    assert plan.steps[0].inputs == {"x": "IN"}
    assert plan.steps[0].input_dims == {"x": [4], "z": [4]}


def test_a_batching_ensemble_over_a_non_batching_step() -> None:
    flat = model("flat", inputs=(), outputs=(), mbs=0,
                 extra=tensor("input", "x", [-1]) + tensor("output", "y", [-1]))
    plan = build_plan(ensemble(step("flat", {"x": "IN"}, {"y": "OUT"}), mbs=8), Repo(flat))
    assert plan.max_batch_size == 8
    assert plan.steps[0].batching is False
    assert plan.steps[0].input_dims == {"x": [-1]}


def test_a_variable_dimension_matches_any_size() -> None:
    wild = model("w", inputs=(), outputs=(), extra=tensor("input", "x", [-1]) + tensor("output", "y", [-1]))
    plan = build_plan(ensemble(step("w", {"x": "IN"}, {"y": "OUT"})), Repo(wild))
    assert plan.steps[0].input_dims == {"x": [-1]}


# ---------------------------------------------------------------- prune


def diamond() -> EnsemblePlan:
    """0: IN->a; 1: a->b; 2: a->c; 3: b,c->OUT; 4: IN->OUT2 (independent of the diamond)."""
    io = tensor("input", "IN") + tensor("output", "OUT") + tensor("output", "OUT2")
    config = ensemble(step("m", {"x": "IN"}, {"y": "a"}), step("m", {"x": "a"}, {"y": "b"}),
                      step("m", {"x": "a"}, {"y": "c"}), step("join", {"p": "b", "q": "c"}, {"y": "OUT"}),
                      step("m", {"x": "IN"}, {"y": "OUT2"}), io=io)
    return build_plan(config, Repo(model("m"), model("join", inputs=("p", "q"))))


def test_prune_a_chain_keeps_only_what_the_output_needs() -> None:
    io = tensor("input", "IN") + tensor("output", "OUT") + tensor("output", "SIDE")
    config = ensemble(step("m", {"x": "IN"}, {"y": "mid"}), step("m", {"x": "mid"}, {"y": "OUT"}),
                      step("m", {"x": "IN"}, {"y": "SIDE"}), io=io)
    plan = build_plan(config, Repo(model("m")))
    assert plan.prune(["OUT"]) == frozenset({0, 1})
    assert plan.prune(["SIDE"]) == frozenset({2})
    assert plan.prune([]) == frozenset({0, 1, 2})


def test_prune_a_diamond() -> None:
    plan = diamond()
    assert plan.prune(["OUT"]) == frozenset({0, 1, 2, 3})
    assert plan.prune(["OUT2"]) == frozenset({4})
    assert plan.prune(["OUT", "OUT2"]) == frozenset(range(5))
    assert plan.prune(()) == frozenset(range(5))
    assert plan.prune(iter(["OUT2"])) == frozenset({4})  # any iterable, consumed once


def test_prune_ignores_names_no_step_writes() -> None:
    assert diamond().prune(["IN", "nope"]) == frozenset()


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[list[dict[str, str]], list[str]]:
    """Steps in topological order: step i reads IN and/or earlier steps' tensors, writes t<i>."""
    count = draw(st.integers(1, 7))
    steps: list[dict[str, str]] = []
    for i in range(count):
        sources = ["IN", *(f"t{j}" for j in range(i))]
        chosen = draw(st.lists(st.sampled_from(sources), min_size=1, max_size=3, unique=True))
        steps.append({f"x{k}": t for k, t in enumerate(chosen)})
    outputs = draw(st.lists(st.sampled_from([f"t{i}" for i in range(count)]), min_size=1, unique=True))
    return steps, outputs


def upstream(steps: list[dict[str, str]], start: Iterable[int]) -> set[int]:
    """The steps ``start`` depend on, themselves included (a fixpoint, independent of prune)."""
    found = set(start)
    grew = True
    while grew:
        more = {int(t[1:]) for i in found for t in steps[i].values() if t != "IN"}
        grew = not more <= found
        found |= more
    return found


@given(random_dags(), st.data())
def test_prune_is_backward_reachability(dag: tuple[list[dict[str, str]], list[str]], data: st.DataObject) -> None:
    steps, outputs = dag
    io = tensor("input", "IN") + "".join(tensor("output", o) for o in outputs)
    config = ensemble(*(step(f"m{i}", ins, {"y": f"t{i}"}) for i, ins in enumerate(steps)), io=io)
    repo = Repo(*(model(f"m{i}", inputs=ins) for i, ins in enumerate(steps)))
    plan = build_plan(config, repo)
    requested = data.draw(st.lists(st.sampled_from(outputs), unique=True))
    assert plan.prune(requested) == frozenset(upstream(steps, (int(t[1:]) for t in requested or outputs)))
    assert find_cycle([(ins, {"y": f"t{i}"}) for i, ins in enumerate(steps)]) is None


# ---------------------------------------------------------------- build_plan: load failures


def test_unknown_models_are_listed_once_each() -> None:
    config = ensemble(step("ghost", {"x": "IN"}, {"y": "p"}), step("a", {"x": "p"}, {"y": "q"}),
                      step("ghost", {"x": "q"}, {"y": "r"}), step("other", {"x": "r"}, {"y": "OUT"}, version=2))
    assert fails(config, Repo(model("a"))) == (
        "ensemble e contains models that are not available or ambiguous: ghost, other"
    )


def test_a_missing_version_of_a_loaded_model() -> None:
    config = ensemble(step("a", {"x": "IN"}, {"y": "OUT"}, version=7))
    assert fails(config, Repo(model("a", version=1), model("a", version=2))) == (
        "ensemble 'e' depends on 'a' whose required version 7 is not loaded."
    )


def test_input_map_key_must_be_a_model_input() -> None:
    config = ensemble(step("a", {"x": "IN", "nope": "IN"}, {"y": "OUT"}))
    assert fails(config, Repo(model("a"))) == (
        "in ensemble e, ensemble tensor IN is mapping to non-existing input nope in model a"
    )


def test_output_map_key_must_be_a_model_output() -> None:
    config = ensemble(step("a", {"x": "IN"}, {"nope": "OUT"}))
    assert fails(config, Repo(model("a"))) == (
        "in ensemble e, ensemble tensor OUT is mapped from non-existing output nope in model a"
    )


def test_datatype_of_an_ensemble_input_and_a_step_input_must_agree() -> None:
    ints = model("a", inputs=(), extra=tensor("input", "x", dtype="TYPE_INT32"))
    assert fails(ensemble(step("a", {"x": "IN"}, {"y": "OUT"})), Repo(ints)) == (
        "in ensemble e, ensemble tensor IN: inconsistent data type: TYPE_FP32 is inferred from model e "
        "while TYPE_INT32 is inferred from model a"
    )


def test_datatype_of_a_step_output_and_the_next_step_input_must_agree() -> None:
    strings = model("b", inputs=(), extra=tensor("input", "x", dtype="TYPE_STRING"))
    config = ensemble(step("a", {"x": "IN"}, {"y": "mid"}), step("b", {"x": "mid"}, {"y": "OUT"}))
    assert fails(config, Repo(model("a"), strings)) == (
        "in ensemble e, ensemble tensor mid: inconsistent data type: TYPE_FP32 is inferred from model a "
        "while TYPE_STRING is inferred from model b"
    )


def test_shapes_must_agree() -> None:
    wide = model("a", inputs=(), extra=tensor("input", "x", [5]))
    assert fails(ensemble(step("a", {"x": "IN"}, {"y": "OUT"})), Repo(wide)) == (
        "in ensemble e, ensemble tensor IN: inconsistent shape: [-1,4] is inferred from model e "
        "while [-1,5] is inferred from model a"
    )


def test_shapes_between_steps_must_agree() -> None:
    deep = model("b", inputs=(), extra=tensor("input", "x", [4, 2]))
    config = ensemble(step("a", {"x": "IN"}, {"y": "mid"}), step("b", {"x": "mid"}, {"y": "OUT"}))
    assert fails(config, Repo(model("a"), deep)) == (
        "in ensemble e, ensemble tensor mid: inconsistent shape: [-1,4] is inferred from model a "
        "while [-1,4,2] is inferred from model b"
    )


def test_a_non_batching_step_must_still_match_without_the_batch() -> None:
    flat = model("flat", inputs=(), mbs=0, extra=tensor("input", "x", [3]))
    assert fails(ensemble(step("flat", {"x": "IN"}, {"y": "OUT"}), mbs=8), Repo(flat)) == (
        "in ensemble e, ensemble tensor IN: inconsistent shape: [-1,4] is inferred from model e "
        "while [3] is inferred from model flat"
    )


def test_ensemble_batch_size_cannot_exceed_a_step_batch_size() -> None:
    config = ensemble(step("a", {"x": "IN"}, {"y": "OUT"}), mbs=8)
    assert fails(config, Repo(model("a", mbs=4))) == (
        "ensemble e allows maximum batch size 8, but it contains model a which only allows maximum batch size to be 4"
    )


def test_a_non_batching_ensemble_over_a_batching_step() -> None:
    flat_io = tensor("input", "IN", [-1, 4]) + tensor("output", "OUT", [-1, 4])
    plan = build_plan(ensemble(step("a", {"x": "IN"}, {"y": "OUT"}), mbs=0, io=flat_io), Repo(model("a", mbs=2)))
    assert plan.max_batch_size == 0 and plan.steps[0].batching is True


def test_a_required_input_must_be_mapped() -> None:
    two = model("a", inputs=("x", "z"))
    assert fails(ensemble(step("a", {"x": "IN"}, {"y": "OUT"})), Repo(two)) == (
        "in ensemble e, input z in model a is not mapped to any ensemble tensors"
    )


DIFFERENT_ORIGINS = "in ensemble e, step of model 'c' receives inputs originated from different decoupled models"


def test_inputs_from_two_decoupled_steps_are_refused() -> None:
    config = ensemble(step("d1", {"x": "IN"}, {"y": "p"}), step("d2", {"x": "IN"}, {"y": "q"}),
                      step("c", {"a": "p", "b": "q"}, {"y": "OUT"}))
    repo = Repo(model("d1", decoupled=True), model("d2", decoupled=True), model("c", inputs=("a", "b")))
    assert fails(config, repo) == DIFFERENT_ORIGINS


def test_a_decoupled_stream_cannot_meet_an_ensemble_input() -> None:
    config = ensemble(step("d", {"x": "IN"}, {"y": "p"}), step("c", {"a": "p", "b": "IN"}, {"y": "OUT"}))
    repo = Repo(model("d", decoupled=True), model("c", inputs=("a", "b")))
    assert fails(config, repo) == DIFFERENT_ORIGINS


def test_different_origins_are_found_whatever_the_step_order() -> None:
    config = ensemble(step("c", {"a": "p", "b": "q"}, {"y": "OUT"}), step("d1", {"x": "IN"}, {"y": "p"}),
                      step("f", {"x": "IN"}, {"y": "r"}), step("d2", {"x": "r"}, {"y": "q"}))
    repo = Repo(model("d1", decoupled=True), model("d2", decoupled=True), model("f"), model("c", inputs=("a", "b")))
    assert fails(config, repo) == DIFFERENT_ORIGINS


def test_inputs_of_the_same_decoupled_origin_are_fine() -> None:
    # d (decoupled) -> f -> c, and c also reads d's output directly
    config = ensemble(step("d", {"x": "IN"}, {"y": "p"}), step("f", {"x": "p"}, {"y": "q"}),
                      step("c", {"a": "p", "b": "q"}, {"y": "OUT"}))
    plan = build_plan(config, Repo(model("d", decoupled=True), model("f"), model("c", inputs=("a", "b"))))
    assert plan.decoupled is True
    assert plan.prune([]) == frozenset({0, 1, 2})


def test_a_decoupled_step_after_another_restarts_the_origin() -> None:
    # d1 -> d2 -> c: c reads only d2's stream, which is one origin
    config = ensemble(step("d1", {"x": "IN"}, {"y": "p"}), step("d2", {"x": "p"}, {"y": "q"}),
                      step("c", {"a": "q", "b": "q"}, {"y": "OUT"}))
    repo = Repo(model("d1", decoupled=True), model("d2", decoupled=True), model("c", inputs=("a", "b")))
    assert build_plan(config, repo).decoupled is True


# ---------------------------------------------------------------- reshape


@pytest.mark.parametrize(
    ("dims", "batching", "batch", "shape", "expected"),
    [
        ([4], True, 0, (4,), (1, 4)),  # a non-batched tensor into a batching model: batch of 1
        ([-1], True, 0, (7,), (1, 7)),
        ([4], True, 0, (3, 4), (3, 4)),  # already batch-shaped for the consumer: left alone
        ([4], False, 1, (1, 4), (4,)),  # batch 1 into a non-batching model: batch dropped
        ([-1], False, 1, (1, 6), (6,)),
        ([-1, 4], False, 1, (1, 4), (1, 4)),  # matches as is: kept
        ([4], False, 2, (2, 4), (2, 4)),  # a batch of 2 cannot lose its batch dimension
        ([4], True, 3, (3, 4), (3, 4)),  # same batching on both sides
        ([4], False, 0, (4,), (4,)),
    ],
)
def test_reshape(dims: list[int], batching: bool, batch: int, shape: tuple[int, ...],
                 expected: tuple[int, ...]) -> None:
    assert reshape(dims, batching, batch, shape) == expected


# ---------------------------------------------------------------- find_cycle / validate_config


def test_find_cycle_of_a_dag_is_none() -> None:
    steps = [({"x": "IN"}, {"y": "a"}), ({"x": "a", "w": "IN"}, {"y": "b"}), ({"x": "a", "w": "b"}, {"y": "OUT"})]
    assert find_cycle(steps) is None
    assert find_cycle([]) is None


def test_find_cycle_of_two_steps() -> None:
    assert find_cycle([({"x": "b"}, {"y": "a"}), ({"x": "a"}, {"y": "b"})]) == [0, 1, 0]


def test_find_cycle_of_a_self_loop() -> None:
    assert find_cycle([({"x": "IN"}, {"y": "p"}), ({"x": "p", "w": "q"}, {"y": "q"})]) == [1, 1]


def test_find_cycle_lists_producers_before_consumers() -> None:
    steps = [({"x": "IN"}, {"y": "p"}), ({"x": "p", "w": "c"}, {"y": "a"}), ({"x": "a"}, {"y": "b"}),
             ({"x": "b"}, {"y": "c"})]
    cycle = find_cycle(steps)
    assert cycle == [1, 2, 3, 1]
    for producer, consumer in zip(cycle, cycle[1:], strict=False):
        assert set(steps[producer][1].values()) & set(steps[consumer][0].values())


@given(random_dags(), st.data())
def test_find_cycle_finds_a_back_edge(dag: tuple[list[dict[str, str]], list[str]], data: st.DataObject) -> None:
    steps, _ = dag
    late = data.draw(st.integers(0, len(steps) - 1))
    early = data.draw(st.integers(0, late))
    maps = [(dict(ins), {"y": f"t{i}"}) for i, ins in enumerate(steps)]
    maps[early][0]["back"] = f"t{late}"  # step `early` now also reads what step `late` writes
    cycle = find_cycle(maps)
    if early not in upstream(steps, [late]):  # `late` does not depend on `early`: still a DAG
        assert cycle is None
        return
    assert cycle is not None and cycle[0] == cycle[-1] and early in cycle
    for producer, consumer in zip(cycle, cycle[1:], strict=False):
        assert f"t{producer}" in maps[consumer][0].values()


def test_validate_config_refuses_a_cycle(tmp_path: Path) -> None:
    text = ('name: "e" platform: "ensemble" max_batch_size: 4 ' + tensor("input", "IN") + tensor("output", "OUT")
            + "ensemble_scheduling { " + step("a", {"x": "IN", "w": "t2"}, {"y": "t1"})
            + step("b", {"x": "t1"}, {"y": "t2", "z": "OUT"}) + "}")
    config = complete_defaults(parse_pbtxt(text), "e")
    with pytest.raises(TritonError) as info:
        validate_config(config, "e", tmp_path)
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message == (
        "in ensemble 'e', circular dependency between steps: step 0 (model 'a') -> step 1 (model 'b') "
        "-> step 0 (model 'a')"
    )



def test_outputs_from_different_decoupled_origins_are_refused() -> None:
    """The response pairs the ensemble's outputs by iteration, so they must fan out of one origin."""
    repo = Repo(model("d", ["x"], ["y"], decoupled=True), model("f", ["x"], ["y"]))
    config = ensemble(step("d", {"x": "IN"}, {"y": "OUT"}), step("f", {"x": "IN"}, {"y": "OUT2"}),
                      io=tensor("input", "IN") + tensor("output", "OUT") + tensor("output", "OUT2"))
    assert fails(config, repo) == (
        "in ensemble e, step of model 'e' receives inputs originated from different decoupled models")
