"""Precision arms: make the weights a grid compares (INT4-AWQ, FP8, INT8 W8A8, GGUF) and check
them served.

``python -m evals.arms make SOURCE --method awq|fp8|w8a8|gguf-requant --out DIR`` runs one
back-end and records what it did in ``DIR/arm.json``; ``python -m evals.arms check DIR --upstream
URL`` smoke-tests the arm behind a server. A grid names the arm by its folder (``arm = DIR``), which
``load_arm`` reads.
The heavy back-ends (llm-compressor, AutoAWQ) are optional extras, imported only when used.
"""

from evals.arms.backend import MakeOptions
from evals.arms.check import CheckResult, StepResult, check_upstream
from evals.arms.make import BACKENDS, make_arm
from evals.arms.record import (
    ARM_FILE,
    ArmError,
    ArmRecord,
    BackendUnavailableError,
    load_arm,
)

__all__ = [
    "ARM_FILE",
    "BACKENDS",
    "ArmError",
    "ArmRecord",
    "BackendUnavailableError",
    "CheckResult",
    "MakeOptions",
    "StepResult",
    "check_upstream",
    "load_arm",
    "make_arm",
]
