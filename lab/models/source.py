"""The `model` config group: where a checkpoint directory comes from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path


class ModelSource(ABC):
    """Base class of the `model` config group: resolves to a local HF checkpoint directory."""

    @abstractmethod
    def path(self) -> Path:
        """A directory holding config.json, the safetensors weights and the tokenizer."""


class TinyModelSource(ModelSource):
    """A generated tiny checkpoint, cached on disk. preset: its architecture + HF config fields
    (lab/conf/model/<name>.yaml's `preset:`, which Hydra passes; None: read from that file)."""

    def __init__(self, name: str, cache_dir: str | None = None, preset=None) -> None:
        from omegaconf import OmegaConf

        from lab.models.tiny import preset as conf_preset

        if preset is None:
            preset = conf_preset(name)  # fails early on an unknown preset
        self.name = name
        self.cache_dir = cache_dir
        self.preset = OmegaConf.to_container(preset) if OmegaConf.is_config(preset) else dict(preset)

    def path(self) -> Path:
        from lab.models.tiny import ensure_tiny_model

        return ensure_tiny_model(self.name, self.cache_dir, self.preset)

    def __repr__(self) -> str:
        return f"TinyModelSource({self.name!r})"


class HFModelSource(ModelSource):
    """A local Hugging Face checkpoint directory."""

    def __init__(self, path: str) -> None:
        self._path = Path(path).expanduser()

    def path(self) -> Path:
        if not self._path.is_dir():
            raise FileNotFoundError(f"model path {str(self._path)!r} is not a directory")
        if not (self._path / "config.json").is_file():
            raise FileNotFoundError(f"model path {str(self._path)!r} has no config.json")
        return self._path

    def __repr__(self) -> str:
        return f"HFModelSource({str(self._path)!r})"
