# The lunajit Python package: pure Python over torch.ops.lunajit (the custom
# ops of liblunajit_torch.so). CMake stages an installable copy of this
# directory, with the library inside the package, at <build>/python:
#   pip install --no-build-isolation --no-deps <build>/python
# (offline: only Debian's setuptools is needed). Installing this source
# directory instead gives a package without the library, and `import lunajit`
# then says where to get it.
from setuptools import setup

setup(
    name="lunajit",
    version="0.1.0",
    description="JIT-generated kernels for kernelized linear attention (LUNA and relatives) for PyTorch",
    packages=["lunajit"],
    package_data={"lunajit": ["*.so"]},
    python_requires=">=3.9",
    zip_safe=False,
)
