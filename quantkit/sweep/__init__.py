"""Sweeps: many recipes against one baseline, on one machine or a Ray cluster."""
