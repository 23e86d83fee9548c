"""ckpt-repair: streaming weight surgery for quantized LLM checkpoints."""

__version__ = "0.1.0"
