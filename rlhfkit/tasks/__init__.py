"""Embedded demo tasks: synthetic data, oracle scorers, tiny-model factories."""
