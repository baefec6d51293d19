"""Frontends: ONNX import/export, the readable text form, and built-in example models."""
