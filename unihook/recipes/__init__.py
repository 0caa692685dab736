"""Framework-agnostic recipes built only on unihook's public API: each runs on a torch model
and on the same paddle model with the same numbers. This package imports no framework.
"""

from __future__ import annotations

from ._scope import RankMismatchError
from .cam import ClassifierOutputTarget, GradCAM, GradCAMPlusPlus, GuidedBackprop, token_maps
from .compare import Report, compare, compare_dumps, copy_weights, dump
from .drop import DropHook
from .monitor import GradientMonitor, NonFiniteGradientError
from .plots import plot
from .sinks import summary_writer
from .stats import ActivationStats
from .summary import Summary, SummaryRow, summary

__all__ = [
    "ActivationStats",
    "ClassifierOutputTarget",
    "DropHook",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientMonitor",
    "GuidedBackprop",
    "NonFiniteGradientError",
    "RankMismatchError",
    "Report",
    "Summary",
    "SummaryRow",
    "compare",
    "compare_dumps",
    "copy_weights",
    "dump",
    "plot",
    "summary",
    "summary_writer",
    "token_maps",
]
