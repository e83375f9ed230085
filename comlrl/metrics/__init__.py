"""Metric sinks: the trainer emits flat dicts of floats, sinks consume them."""

from comlrl.metrics.sinks import JsonlSink, MetricsLogger, WandbSink

__all__ = ["JsonlSink", "MetricsLogger", "WandbSink"]
