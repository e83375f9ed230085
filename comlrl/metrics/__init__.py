"""Metric sinks: the trainer emits flat dicts of floats (and sample dicts), sinks consume them."""

from comlrl.metrics.sinks import JsonlSink, MetricsLogger, TensorBoardSink, WandbSink

__all__ = ["JsonlSink", "MetricsLogger", "TensorBoardSink", "WandbSink"]
