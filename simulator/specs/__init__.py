"""Pure data: frozen pydantic specs and the only loader of spec files."""

from simulator.specs.engine import EngineSpec
from simulator.specs.hardware import HardwareSpec
from simulator.specs.loader import (
    hardware_provenance,
    list_engines,
    list_hardware,
    list_models,
    load_engine,
    load_hardware,
    load_model,
)
from simulator.specs.model import DTYPE_BYTES, ModelSpec

__all__ = [
    "DTYPE_BYTES",
    "EngineSpec",
    "HardwareSpec",
    "ModelSpec",
    "hardware_provenance",
    "list_engines",
    "list_hardware",
    "list_models",
    "load_engine",
    "load_hardware",
    "load_model",
]
