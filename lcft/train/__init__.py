"""`lcft train`: Accelerate-driven, resumable training of the decoder on prepared genome windows."""

from lcft.checkpoint.layout import latest_checkpoint
from lcft.train.config import TrainConfig
from lcft.train.trainer import TrainHooks, train

__all__ = ["TrainConfig", "TrainHooks", "latest_checkpoint", "train"]
