"""Pieces of tools/benchmark.py: measuring, inputs, peers, phase breakdowns, the report."""
