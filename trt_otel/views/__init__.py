"""What people and tools see.

The console, spans and OTLP, Prometheus, the HTTP view and its page.
"""
