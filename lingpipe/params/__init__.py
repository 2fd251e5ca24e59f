"""Registered model params, one module per model family."""
