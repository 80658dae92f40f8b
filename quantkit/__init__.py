"""quantkit: quantize a causal LM with GPTQ, AWQ, GGUF or FP8 and measure what it cost.

Importing this package is cheap: it imports neither torch nor transformers.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
