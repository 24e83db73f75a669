"""ScanWeaver.jl from Python: the only package that imports ``juliacall``.

* :mod:`.session` starts Julia (lazily, once) and turns every failure into
  :class:`~scanweaver.errors.BackendUnavailable`;
* :mod:`.devices` knows the KernelAbstractions devices (``cpu``, ``cuda``,
  ``amdgpu``, ``oneapi``, ``metal``) and why each can or cannot run;
* :mod:`.backend` registers the ``julia`` runtime backend;
* :mod:`.kernels` describes the kernels for Kernel Tuner's Julia backend.

The Julia package itself (``Project.toml``, ``src/``, ``ext/`` at the
repository root) is declared in ``scanweaver/juliapkg.json`` by the path
``julia/ScanWeaver``: in a source checkout that directory holds symbolic links
to the repository root's files, in a wheel it holds copies (package data), so
juliapkg finds the same package either way.

Importing this package imports neither juliacall nor Julia.
"""

from .devices import julia_devices

__all__ = ["julia_devices"]
