"""How a Python model instance runs: its execution mode and settings, and its identity.

Shared by the in-process instance (:mod:`.backend`) and the process-isolated one
(:mod:`.isolated.parent`), which the model process receives as plain values.
"""

from __future__ import annotations

from dataclasses import dataclass

from trident.backends.base import LoadContext
from trident.backends.settings import setting
from trident.errors import invalid_arg, unsupported
from trident.protocol.generated.inference import ModelConfig

EXECUTION_MODE = "TRIDENT_EXECUTION_MODE"  # "thread" (default) or "process"
EXECUTE_TIMEOUT = "TRIDENT_EXECUTE_TIMEOUT_SECS"  # process mode: kill and restart after this (0: never)
SHM_BYTES = "TRIDENT_SHM_BYTES"  # process mode: bytes of each shared-memory ring (default 8 MiB)
#: Triton's: "yes" (default) gives the model CPU input tensors only, "no" lets inputs that are on
#: a GPU reach it as GPU tensors (thread mode; a model process gets CPU tensors either way)
FORCE_CPU_ONLY = "FORCE_CPU_ONLY_INPUT_TENSORS"
_MODES = ("thread", "process")


@dataclass(frozen=True)
class ExecutionOptions:
    mode: str = "thread"
    execute_timeout: float = 0.0
    shm_bytes: int = 8 << 20
    force_cpu_only_inputs: bool = True


def execution_options(config: ModelConfig, backend_config: dict[str, str] | None = None) -> ExecutionOptions:
    """The execution mode and its settings for a model: config parameters first, then
    ``--backend-config=python,...`` defaults. Raises TritonError(INVALID_ARG) for bad values."""
    defaults = backend_config or {}

    def value(parameter: str, default: str | None) -> str:
        param = config.parameters.get(parameter)
        if param is not None and param.string_value.strip():
            return param.string_value.strip()
        return (default or "").strip()

    name = config.name
    mode = (value(EXECUTION_MODE, setting(defaults, "execution-mode")) or "thread").lower()
    if mode not in _MODES:
        raise invalid_arg(f"model '{name}': {EXECUTION_MODE} must be 'thread' or 'process', got '{mode}'")
    try:
        timeout = float(value(EXECUTE_TIMEOUT, setting(defaults, "execute-timeout-secs")) or 0)
        shm = int(value(SHM_BYTES, setting(defaults, "shm-bytes"))
                  or value("SHM_DEFAULT_BYTE_SIZE", setting(defaults, "shm-default-byte-size")) or (8 << 20))
    except ValueError as e:
        raise invalid_arg(f"model '{name}': bad execution parameter: {e}") from None
    if timeout < 0 or shm < 4096:
        raise invalid_arg(f"model '{name}': {EXECUTE_TIMEOUT} must be >= 0 and {SHM_BYTES} >= 4096")
    return ExecutionOptions(mode, timeout, shm, force_cpu_only_inputs(config))


def force_cpu_only_inputs(config: ModelConfig) -> bool:
    """The model's FORCE_CPU_ONLY_INPUT_TENSORS: True for "yes" or none, False for "no" (as
    Triton: lower case only). Raises TritonError(UNSUPPORTED) in Triton's words for any other
    value."""
    param = config.parameters.get(FORCE_CPU_ONLY)
    if param is None:
        return True
    value = param.string_value.strip()
    if value not in ("yes", "no"):
        raise unsupported(f"model '{config.name}': Incorrect value for {FORCE_CPU_ONLY}: '{param.string_value}' "
                          "(expected \"yes\" or \"no\")")
    return value == "yes"


@dataclass(frozen=True)
class InstanceIdentity:
    """What an instance needs to know about its model, as plain values (the model process of
    the isolated mode gets it without the config stack)."""

    model_name: str
    version: int
    instance_name: str
    decoupled: bool
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, ctx: LoadContext) -> InstanceIdentity:
        policy = ctx.config.model_transaction_policy
        return cls(ctx.model_name, ctx.version, ctx.instance_name or f"{ctx.model_name}_0",
                   bool(policy and policy.decoupled), tuple(o.name for o in ctx.config.output))
