"""Kernel Tuner targets, one module per backend (found through :data:`~.base.TARGETS`)."""

from .base import TARGETS, KernelSpec, KernelTunerTarget, abi_arguments, get_target, register

__all__ = ["TARGETS", "KernelSpec", "KernelTunerTarget", "abi_arguments", "get_target", "register"]
