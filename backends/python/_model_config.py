"""``pb_utils.ModelConfig``: the config a model's ``auto_complete_config`` reads and completes.

It holds the config as a dict in Triton's JSON shape (snake_case field names, enum names such
as ``"TYPE_FP32"``, integer dims) and follows the rules of Triton's
``triton_python_backend_utils.ModelConfig``: every method raises ``ValueError`` with Triton's
wording when the model contradicts what the configuration already says.
"""

from __future__ import annotations

import copy
import json
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")


class ModelConfig:
    """A model configuration under auto-completion (``ModelConfig(json_str_or_dict)``)."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        """Raises ValueError (json.JSONDecodeError) for a string that is not JSON."""
        if isinstance(model_config, str):
            cfg = json.loads(model_config)
        else:
            cfg = copy.deepcopy(model_config)
        cfg.setdefault("name", "")
        cfg.setdefault("max_batch_size", 0)
        cfg.setdefault("input", [])
        cfg.setdefault("output", [])
        self._model_config: dict[str, Any] = cfg

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def as_dict(self) -> dict[str, Any]:
        """The configuration dict (live: changes to it change the config)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set max_batch_size; raises ValueError if the config already sets a larger one."""
        configured = int(self._model_config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config "
                f"function for model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher unless another scheduler is configured (then ValueError)."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but auto-complete-config "
                    f"function for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        """Add an input, or complete the configured one of the same name.

        Raises ValueError for keys other than name/data_type/dims/optional, a missing required
        key, or a data_type, dims or optional that contradicts the configured input.
        """
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output, or complete the configured one of the same name.

        Raises ValueError for keys other than name/data_type/dims, a missing required key, or a
        data_type or dims that contradicts the configured output.
        """
        self._add("output", output, _OUTPUT_KEYS)

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        if not isinstance(tensor, dict):
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name}' must be a dict"
            )
        label = tensor.get("name", "")
        extra = [k for k in tensor if k not in allowed]
        if extra:
            names = ", ".join(f"'{k}'" for k in allowed)
            raise ValueError(
                f"{kind} '{label}' in auto-complete-config function for model '{self._name}' "
                f"contains property other than {names}."
            )
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                what = f"{kind} '{label}'" if key != "name" else kind
                raise ValueError(
                    f"{what} in auto-complete-config function for model '{self._name}' "
                    f"is missing '{key}' property."
                )
        new = dict(tensor)
        new["dims"] = [int(d) for d in tensor["dims"]]
        for current in self._model_config.setdefault(kind, []):
            if current.get("name") != new["name"]:
                continue
            configured_type = current.get("data_type", "TYPE_INVALID")
            if configured_type != "TYPE_INVALID" and configured_type != new["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name}', configuration expects datatype "
                    f"{configured_type} for {kind} '{new['name']}', model provides {new['data_type']}"
                )
            configured_dims = [int(d) for d in current.get("dims") or ()]
            if configured_dims and configured_dims != new["dims"]:
                raise ValueError(
                    f"model '{self._name}', tensor '{new['name']}': the model expects dims "
                    f"{new['dims']} but the model configuration specifies dims {configured_dims}"
                )
            if (
                kind == "input"
                and "optional" in current
                and "optional" in new
                and bool(current["optional"]) != bool(new["optional"])
            ):
                raise ValueError(
                    f"model '{self._name}', tensor '{new['name']}': the model expects optional "
                    f"{new['optional']} but the model configuration specifies optional {current['optional']}"
                )
            current["data_type"] = new["data_type"]
            current["dims"] = new["dims"]
            if "optional" in new:
                current["optional"] = new["optional"]
            return
        self._model_config[kind].append(new)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy``; raises ValueError for keys other than 'decoupled'
        or when the configuration already sets a different ``decoupled``."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
