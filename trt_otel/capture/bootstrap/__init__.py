"""Loaded into a program run by ``trt-otel run`` (this directory first on its ``PYTHONPATH``).

``sitecustomize`` installs :mod:`_trt_otel_recorder` when the run's socket is in the environment,
then runs the program's own ``sitecustomize``, if it has one, as if this one were not there.
Both modules import only the standard library: the program's interpreter may lack trt-otel's
dependencies.
"""
