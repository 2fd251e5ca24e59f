"""The conventional shim for tools that look for setup.py: pyproject.toml says everything."""

from setuptools import setup

setup()
