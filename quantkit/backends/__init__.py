"""Quantization backends; each module registers one method in ``quantkit.registry``."""
