"""Where a build's records come from.

The monitor on TensorRT's threads, the worker and its spool, a program's builds, a followed
journal, and the builder's process itself.
"""
