"""Making engines.

Builder options, preflight checks, saving an engine, generated ONNX models and the simulator.
"""
