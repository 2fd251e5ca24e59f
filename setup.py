"""Installs lingpipe and the registered model params (the `params` package)."""

import setuptools

setuptools.setup(
    name="lingpipe",
    version="0.1.0",
    description="GPipe pipeline parallelism for TensorFlow 2, in the style of Lingvo.",
    packages=setuptools.find_packages(include=["lingpipe", "lingpipe.*", "params", "params.*"]),
    python_requires=">=3.10",
    install_requires=["tensorflow>=2.16", "tensorboard", "numpy", "absl-py"],
    extras_require={"test": ["pytest>=7", "ruff", "scikit-learn"]},
    entry_points={"console_scripts": ["lingpipe-trainer = lingpipe.trainer:Run"]},
)
