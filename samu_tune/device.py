"""What the tuner and cache need to know about a device: a stable signature."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Literal, Optional

import torch
from pydantic import BaseModel, ConfigDict

from samu_tune.settings import settings


class DeviceInfo(BaseModel):
    """A device as the registry and cache see it.

    ``kind`` is ``cuda`` for a GPU, ``cpu`` for the CPU (Triton kernels run there only through
    the interpreter, ``interpret=True``).
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["cuda", "cpu"]
    name: str
    capability: Optional[tuple[int, int]] = None
    sm_count: int = 0
    interpret: bool = False

    def signature(self) -> str:
        """File-name safe id: ``NVIDIA-H200-sm90-132sm`` or ``cpu-interpreter``."""
        if self.kind == "cpu":
            return "cpu-interpreter" if self.interpret else "cpu"
        name = re.sub(r"[^A-Za-z0-9]+", "-", self.name).strip("-")
        major, minor = self.capability or (0, 0)
        return f"{name}-sm{major}{minor}-{self.sm_count}sm"


@lru_cache(maxsize=None)
def _cuda_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(kind="cuda", name=props.name, capability=(props.major, props.minor),
                      sm_count=props.multi_processor_count)


def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    """DeviceInfo of ``device`` (default: the current CUDA device if any, else the CPU)."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_info(device.index if device.index is not None else torch.cuda.current_device())
    return DeviceInfo(kind="cpu", name="cpu", interpret=settings().interpret)
