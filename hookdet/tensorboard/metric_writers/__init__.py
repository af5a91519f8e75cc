"""Metric writers, at Determined's import path."""
