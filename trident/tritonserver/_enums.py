"""The enumerations of Triton's ``tritonserver`` package, with the values of Triton's C API
(``tritonserver.h``) and of DLPack (``dlpack.h``)."""

from __future__ import annotations

import enum


class DataType(enum.IntEnum):
    """TRITONSERVER_DataType. A member's name is the KServe datatype (``DataType.FP32.name``)."""

    INVALID = 0
    BOOL = 1
    UINT8 = 2
    UINT16 = 3
    UINT32 = 4
    UINT64 = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FP16 = 10
    FP32 = 11
    FP64 = 12
    BYTES = 13
    BF16 = 14


class MemoryType(enum.IntEnum):
    """TRITONSERVER_MemoryType (trident's in-process API holds tensors in CPU memory)."""

    CPU = 0
    CPU_PINNED = 1
    GPU = 2


class ModelControlMode(enum.IntEnum):
    """TRITONSERVER_ModelControlMode (``--model-control-mode none|poll|explicit``)."""

    NONE = 0
    POLL = 1
    EXPLICIT = 2


class RateLimitMode(enum.IntEnum):
    """TRITONSERVER_RateLimitMode (``--rate-limit off|execution_count``)."""

    OFF = 0
    EXEC_COUNT = 1


class LogFormat(enum.IntEnum):
    """TRITONSERVER_LogFormat (``--log-format default|ISO8601``)."""

    DEFAULT = 0
    ISO8601 = 1


class LogLevel(enum.IntEnum):
    """TRITONSERVER_LogLevel."""

    INFO = 0
    WARN = 1
    ERROR = 2
    VERBOSE = 3


class InstanceGroupKind(enum.IntEnum):
    """TRITONSERVER_InstanceGroupKind."""

    AUTO = 0
    CPU = 1
    GPU = 2
    MODEL = 3


class MetricFormat(enum.IntEnum):
    """TRITONSERVER_MetricFormat."""

    PROMETHEUS = 0


class MetricKind(enum.IntEnum):
    """TRITONSERVER_MetricKind."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class ModelBatchFlag(enum.IntEnum):
    """TRITONSERVER_ModelBatchFlag: FIRST_DIM when the model batches (``max_batch_size > 0``)."""

    UNKNOWN = 1
    FIRST_DIM = 2


class ModelTxnPropertyFlag(enum.IntEnum):
    """TRITONSERVER_ModelTxnPropertyFlag: DECOUPLED for decoupled models."""

    ONE_TO_ONE = 1
    DECOUPLED = 2


class RequestFlag(enum.IntFlag):
    """TRITONSERVER_RequestFlag: the bits of ``InferenceRequest.flags``."""

    SEQUENCE_START = 1
    SEQUENCE_END = 2


class DLDeviceType(enum.IntEnum):
    """DLPack's device types (``DLDeviceType`` in dlpack.h)."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
